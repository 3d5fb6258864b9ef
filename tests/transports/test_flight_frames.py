"""The flight:// hub reads FlightData itself (gRPC's asyncio server, no pyarrow server): what
it parses is checked here against pyarrow's own encoding, and against what a stranger can
forge; and a hub holds its sessions without a thread each (issue #27)."""

from __future__ import annotations

import random
import subprocess
import sys
import time

import numpy as np
import pyarrow as pa
import pytest
from waiting import until

grpc = pytest.importorskip("grpc", reason="the flight:// hub needs grpcio")

import tensorwire  # noqa: E402
from tensorwire.errors import WireError  # noqa: E402
from tensorwire.transports.flight import frames  # noqa: E402
from tensorwire.transports.flight.batches import batch_of  # noqa: E402
from tensorwire.transports.flight.options import SCHEMA, UP  # noqa: E402
from tensorwire.transports.session import ClientSession  # noqa: E402

T = 20.0


def test_frames_round_trip_pyarrows_own_encoding():
    one = frames.parse(frames.batch_frame(batch_of(b"hello world")))
    assert bytes(frames.batch_bytes(one.header, one.body)) == b"hello world"
    column = pa.array([b"ab", b"", b"cde"], pa.binary())  # values back to back, any cut
    many = frames.parse(frames.batch_frame(pa.RecordBatch.from_arrays([column], schema=SCHEMA)))
    assert bytes(frames.batch_bytes(many.header, many.body)) == b"abcde"
    schema = frames.parse(frames.SCHEMA_FRAME)
    assert frames.is_schema(schema.header) and schema.metadata is None
    assert bytes(frames.parse(frames.metadata_frame(b"xyz")).metadata) == b"xyz"


@pytest.mark.parametrize("size", [*range(0, 33), 1000, 4095, 1 << 20])
def test_the_hubs_frames_are_the_bytes_pyarrow_would_send(size):
    """The hub builds a batch's FlightData from a template of pyarrow's header, patched with
    the value's length: byte for byte what pyarrow serializes, from parts of any cut."""
    data = bytes(np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8))
    parts = [data[: size // 3], memoryview(data)[size // 3 :]]
    assert frames.value_frame(parts) == frames.batch_frame(batch_of(data))


def test_a_message_becomes_frames_of_at_most_batch_bytes_that_decode_back():
    from tensorwire.wire import MessageStream, encode_message

    enc = encode_message({"a": np.arange(5000, dtype=np.int64), "b": np.ones(7)}, {"k": 1})
    built = list(frames.message_frames(enc, 4096))
    stream = MessageStream()
    for raw in built:
        data = frames.parse(raw)
        value = frames.batch_bytes(data.header, data.body)
        assert len(value) <= 4096
        stream.receive_data(value)
    msg = stream.next_event()
    assert np.array_equal(msg.tensors["a"], np.arange(5000)) and msg.meta == {"k": 1}
    assert len(built) == -(-len(enc.to_bytes()) // 4096)


def test_what_a_stranger_forges_is_a_wire_error_and_never_anything_else():
    """Lies: 20,000 mutations of a valid batch (bytes flipped anywhere: varints, lengths,
    the flatbuffer's offsets, the batch's offsets) and truncations give the bytes back or
    raise WireError; nothing reads past the message or allocates what a field declares."""
    raw = frames.batch_frame(batch_of(bytes(range(200))))
    rng = random.Random(0)
    outcomes = {"bytes": 0, "wire error": 0}
    for _ in range(20_000):
        forged = bytearray(raw)
        for _ in range(rng.randint(1, 6)):
            forged[rng.randrange(len(forged))] = rng.randrange(256)
        if rng.random() < 0.2:
            del forged[rng.randrange(len(forged)) :]
        try:
            data = frames.parse(bytes(forged))
            if data.header is not None and not frames.is_schema(data.header):
                assert len(frames.batch_bytes(data.header, data.body)) <= len(forged)
            outcomes["bytes"] += 1
        except WireError:
            outcomes["wire error"] += 1
    assert outcomes["wire error"] > 1000 and outcomes["bytes"] > 1000, outcomes


def test_offsets_out_of_bounds_or_backwards_are_refused():
    header, body = frames._ipc_parts(batch_of(b"abcdefgh").serialize())
    good = bytes(frames.batch_bytes(header, body))
    assert good == b"abcdefgh"
    at = body.tobytes().index((8).to_bytes(4, "little"))  # the end offset, in the body
    for end in (9, 1 << 30, -1):
        forged = bytearray(body)
        forged[at : at + 4] = end.to_bytes(4, "little", signed=True)
        with pytest.raises(WireError, match="offsets"):
            frames.batch_bytes(header, memoryview(bytes(forged)))
    with pytest.raises(WireError):  # a body shorter than the buffers the header declares
        frames.batch_bytes(header, body[:4])


def _raw_uplink(url: str, client_id: str):
    """A session whose uplink is a plain grpcio call: its FlightData are whatever we write."""
    import pyarrow.flight as flight

    from tensorwire.transports.url import host_port

    client = flight.FlightClient(flight.Location.for_grpc_tcp(*host_port(url)))
    session = ClientSession(client_id, decoders=[], max_message_bytes=1 << 20)
    writer, down = client.do_exchange(
        flight.FlightDescriptor.for_command(session.hello().to_bytes())
    )
    writer.done_writing()
    host, port = host_port(url)
    channel = grpc.insecure_channel(f"{host}:{port}")
    exchange = channel.stream_stream("/arrow.flight.protocol.FlightService/DoExchange")
    descriptor = b"".join(
        frames._key_length(3, len(p)) + p for p in (*UP, session.session.encode())
    )
    first = frames._key_length(1, len(descriptor) + 2) + b"\x08\x01" + descriptor
    return client, writer, down, channel, exchange, first


def test_garbage_on_an_uplink_ends_that_session_only():
    """Lies, end to end: bytes that are not a FlightData on a joined session's uplink end
    that session with a WireError; the hub goes on serving another device."""
    with tensorwire.serve("flight://127.0.0.1:0", codec=None) as hub:
        reasons: dict[str, str] = {}
        hub.on_leave = lambda cid, reason: reasons.setdefault(cid, reason)
        good = tensorwire.connect(hub.url, client_id="good", codec=None)
        client, _writer, _down, channel, exchange, first = _raw_uplink(hub.url, "liar")
        calls = exchange(iter([first, frames.SCHEMA_FRAME, b"\xff\xff\xff\xff\xff\x01garbage"]))
        assert until(lambda: "liar" in reasons, timeout=T)
        assert "not a tensorwire message" in reasons["liar"]
        assert any(isinstance(e, WireError) for _, e in hub.errors)
        good.send({"v": np.arange(3)})
        assert hub.recv(timeout=T)[0] == "good" and hub.clients == ["good"]
        calls.cancel()
        channel.close()
        client.close()
        good.close()


def _threads(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("Threads:"))


def test_a_hub_holds_300_sessions_on_a_few_threads():
    """Floods: 300 devices joined at once cost the hub no thread each (pyarrow's server gave
    every call one: two per session); the hub's threads stay those it had with one."""
    code = (
        "import sys, tensorwire\n"
        "hub = tensorwire.serve('flight://127.0.0.1:0', codec=None)\n"
        "print(hub.url, flush=True)\n"
        "sys.stdin.readline()\n"
        "hub.close()\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    channels = []
    try:
        url = proc.stdout.readline().strip()
        channels.append(tensorwire.connect(url, client_id="c0", codec=None, timeout=T))
        with_one = _threads(proc.pid)
        started = time.monotonic()
        channels += [
            tensorwire.connect(url, client_id=f"c{i}", codec=None, timeout=T) for i in range(1, 300)
        ]
        assert time.monotonic() - started < 60
        with_300 = _threads(proc.pid)
        assert with_300 <= with_one + 4, (with_one, with_300)
    finally:
        for ch in channels:
            ch.close()
        proc.stdin.close()
        proc.wait(T)


def test_a_call_that_never_sends_its_descriptor_is_ended_in_the_handshake_window(monkeypatch):
    """Hangs: a caller that opens a call and says nothing holds it no longer than
    HANDSHAKE_TIMEOUT (pyarrow's server held it, and a thread, until the connection closed)."""
    import threading

    from tensorwire.transports.flight import hub as flight_hub
    from tensorwire.transports.url import host_port

    monkeypatch.setattr(flight_hub, "HANDSHAKE_TIMEOUT", 0.3)
    release = threading.Event()

    def silence():
        release.wait(T)
        yield from ()

    with tensorwire.serve("flight://127.0.0.1:0") as hub:
        host, port = host_port(hub.url)
        with grpc.insecure_channel(f"{host}:{port}") as channel:
            exchange = channel.stream_stream("/arrow.flight.protocol.FlightService/DoExchange")
            started = time.monotonic()
            assert list(exchange(silence(), timeout=T)) == []  # the hub ended it: status OK
            assert time.monotonic() - started < T / 2
            release.set()
        assert until(lambda: any("no descriptor" in e.reason for e in hub.events), timeout=T)
        with tensorwire.connect(hub.url, client_id="after", timeout=T):
            assert hub.wait_for(1, timeout=T) == ["after"]


def test_a_hub_closed_from_its_own_callback_does_not_wait_on_itself():
    """Hangs: on_join runs on the hub's loop; closing the hub there must not deadlock it."""
    hub = tensorwire.serve("flight://127.0.0.1:0")
    closed = []
    hub.on_join = lambda cid: (hub.close(), closed.append(cid))
    with pytest.raises(tensorwire.errors.TransportError):
        ch = tensorwire.connect(hub.url, client_id="first", timeout=3)
        ch.recv(timeout=T)  # the hub closed as it welcomed us: the session ends
    assert until(lambda: closed == ["first"], timeout=T)
    assert until(lambda: not hub._server._thread.is_alive(), timeout=T)
