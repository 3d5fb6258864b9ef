"""tcp's secured stream (sockets/tls_stream.py): a TLS 1.3 handshake, then AES-128-OCB3 records.

What is checked here, on real sockets: every byte arrives whatever the mix of piece sizes;
a record altered, replayed, dropped, cut short or declaring too much is refused, never
delivered; a read that times out inside a record resumes it; and a hub drops a tampered
connection while it goes on serving its other clients.
"""

from __future__ import annotations

import contextlib
import os
import socket
import struct
import threading
import time

import numpy as np
import pytest
from recording_proxy import RecordingProxy

import tensorwire
from tensorwire.errors import PeerGone, TransportTimeout
from tensorwire.transports.certs import Enrolment, make_certs
from tensorwire.transports.sockets.tls_stream import RECORD_BYTES, TlsStream, wrap_tls

T = 30.0


@pytest.fixture(scope="module")
def enrolment(tmp_path_factory) -> Enrolment:
    return make_certs(
        tmp_path_factory.mktemp("certs"), hosts=["127.0.0.1"], clients=["dev1", "dev2"]
    )


def _tls(e: Enrolment, *, client: bool) -> tensorwire.TLS:
    if client:
        files = e.devices["dev1"]
        return tensorwire.TLS(cert=files["cert"], key=files["key"], ca=e.ca)
    return tensorwire.TLS(cert=e.hub_cert, key=e.hub_key, ca=e.ca)


def _pair(e: Enrolment, relay=None) -> tuple[TlsStream, TlsStream]:
    """(client, hub) streams over loopback, through ``relay(a, b)`` when given: a function
    that pumps bytes between the two raw sockets in threads of its own."""
    server = socket.create_server(("127.0.0.1", 0))
    port = hub_port = server.getsockname()[1]
    if relay is not None:
        front = socket.create_server(("127.0.0.1", 0))

        def accept_front() -> None:
            a, _ = front.accept()
            b = socket.create_connection(("127.0.0.1", hub_port))
            relay(a, b)

        threading.Thread(target=accept_front, daemon=True).start()
        port = front.getsockname()[1]
    out: dict[str, TlsStream] = {}

    def hub_side() -> None:
        conn, _ = server.accept()
        ctx = _tls(e, client=False).server_context()
        out["hub"] = wrap_tls(conn, ctx, server_side=True, deadline=time.monotonic() + T)

    t = threading.Thread(target=hub_side)
    t.start()
    sock = socket.create_connection(("127.0.0.1", port))
    ctx = _tls(e, client=True).client_context()
    client = wrap_tls(
        sock, ctx, server_side=False, server_hostname="127.0.0.1", deadline=time.monotonic() + T
    )
    t.join(T)
    server.close()
    return client, out["hub"]


def _read_exactly(stream: TlsStream, size: int, deadline: float | None = None) -> bytes:
    buf = bytearray(size)
    view = memoryview(buf)
    got = 0
    while got < size:
        n = stream.read_into(view[got:], deadline)
        if not n:
            raise PeerGone("end of stream")
        got += n
    return bytes(buf)


def test_every_byte_arrives_whatever_the_piece_sizes(enrolment):
    client, hub = _pair(enrolment)
    rng = np.random.default_rng(0)
    sizes = [
        1,
        7,
        4096,
        65535,
        65536,
        300_000,
        RECORD_BYTES,
        RECORD_BYTES + 1,
        3 * RECORD_BYTES + 5,
    ]
    pieces = [rng.bytes(int(n)) for n in sizes]
    expected = b"".join(pieces)
    sender = threading.Thread(target=client.send_all, args=(pieces, None))
    sender.start()
    # Read in awkward slices: small, then large, so both the staged and the in-place paths run.
    got = bytearray()
    for want in (3, 5000, 2 << 20, len(expected)):
        want = min(want, len(expected) - len(got))
        if want:
            got += _read_exactly(hub, want)
    sender.join(T)
    assert bytes(got) == expected
    # And back the other way, many small messages in one call.
    client_bound = [os.urandom(i % 97 + 1) for i in range(500)]
    hub.send_all(client_bound, None)
    assert _read_exactly(client, sum(map(len, client_bound))) == b"".join(client_bound)


def _tamper_relay(edit):
    """A relay that passes the handshake and key agreement through, then hands every later
    client-to-hub chunk to ``edit(data, counter) -> bytes``."""

    def relay(a: socket.socket, b: socket.socket) -> None:
        def pump(src, dst, up: bool) -> None:
            seen = 0
            for _ in range(100_000):
                try:
                    data = src.recv(1 << 16)
                except OSError:
                    break
                if not data:
                    break
                if up and relay.armed.is_set():
                    data = edit(data, seen)
                    seen += 1
                try:
                    dst.sendall(data)
                except OSError:
                    break
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

        threading.Thread(target=pump, args=(a, b, True), daemon=True).start()
        threading.Thread(target=pump, args=(b, a, False), daemon=True).start()

    relay.armed = threading.Event()
    return relay


def _flip(data: bytes, seen: int) -> bytes:
    data = bytearray(data)
    data[len(data) // 2] ^= 0x01
    return bytes(data)


def _twice(data: bytes, seen: int) -> bytes:
    return data + data if seen == 0 else data


@pytest.mark.parametrize("edit", [_flip, _twice], ids=["altered", "replayed"])
def test_an_altered_or_replayed_record_is_refused(enrolment, edit):
    relay = _tamper_relay(edit)
    client, hub = _pair(enrolment, relay)
    relay.armed.set()
    payload = os.urandom(200_000)
    client.send_all([payload], None)
    with pytest.raises(PeerGone, match="authentication"):
        data = _read_exactly(hub, len(payload), time.monotonic() + T)
        if edit is _twice:
            _read_exactly(hub, len(payload), time.monotonic() + T)  # the copy must not open
        assert data != payload or edit is _twice


def test_a_record_declaring_too_much_is_refused_before_it_is_read(enrolment):
    relay = _tamper_relay(lambda data, seen: struct.pack(">I", RECORD_BYTES + 1) + data[4:])
    client, hub = _pair(enrolment, relay)
    relay.armed.set()
    client.send_all([b"x" * 1000], None)
    with pytest.raises(PeerGone, match="record of"):
        _read_exactly(hub, 1000, time.monotonic() + T)


def test_a_connection_cut_inside_a_record_is_an_error_not_data(enrolment):
    relay = _tamper_relay(lambda data, seen: data[: len(data) // 2])
    client, hub = _pair(enrolment, relay)
    relay.armed.set()
    client.send_all([os.urandom(50_000)], None)
    client.close()
    with pytest.raises(PeerGone, match=r"middle of a record|authentication"):
        _read_exactly(hub, 50_000, time.monotonic() + T)


def test_a_read_that_times_out_inside_a_record_resumes_it(enrolment):
    held = threading.Event()
    gate = threading.Event()

    def hold_second_half(data: bytes, seen: int) -> bytes:
        if seen == 0:
            held.set()
            gate.wait(T)
        return data

    relay = _tamper_relay(hold_second_half)
    client, hub = _pair(enrolment, relay)
    payload = os.urandom(3 * RECORD_BYTES)
    client.send_all([payload[:RECORD_BYTES]], None)
    first = _read_exactly(hub, RECORD_BYTES, time.monotonic() + T)
    relay.armed.set()
    sender = threading.Thread(target=client.send_all, args=([payload[RECORD_BYTES:]], None))
    sender.start()
    assert held.wait(T)
    buf = bytearray(2 * RECORD_BYTES)
    view = memoryview(buf)
    got = 0
    # The relay holds the rest back: reads time out, keeping what they had.
    with pytest.raises(TransportTimeout):
        for _ in range(100):
            got += hub.read_into(view[got:], time.monotonic() + 0.2)
    gate.set()
    while got < len(buf):
        got += hub.read_into(view[got:], time.monotonic() + T)
    sender.join(T)
    assert first + bytes(buf) == payload


def test_a_hub_drops_a_tampered_connection_and_serves_the_others(enrolment):
    e = enrolment
    hub = tensorwire.serve(
        "tcp://127.0.0.1:0",
        codec=None,
        tls=_tls(e, client=False),
        auth=tensorwire.Keys.load(e.keys),
    )
    proxy = RecordingProxy(("127.0.0.1", int(hub.url.rsplit(":", 1)[1])))
    try:

        def connect(cid: str, url: str) -> tensorwire.Channel:
            f = e.devices[cid]
            return tensorwire.connect(
                url,
                client_id=cid,
                tls=tensorwire.TLS(cert=f["cert"], key=f["key"], ca=e.ca),
                key=f["secret"],
                codec=None,
                timeout=T,
            )

        bad = connect("dev1", f"tcp://127.0.0.1:{proxy.port}")
        good = connect("dev2", hub.url)
        hub.wait_for(2, timeout=T)
        proxy.flip_next("up")
        bad.send({"x": np.zeros(10_000, dtype=np.float32)}, timeout=T)
        good.send({"x": np.ones(4, dtype=np.float32)}, timeout=T)
        cid, msg = hub.recv(timeout=T)
        assert cid == "dev2" and np.array_equal(msg["x"], np.ones(4, dtype=np.float32))
        deadline = time.monotonic() + T
        while "dev1" in hub.clients and time.monotonic() < deadline:
            time.sleep(0.05)
        assert "dev1" not in hub.clients
        with pytest.raises(TransportTimeout):
            hub.recv(timeout=0.5)  # the altered message was never delivered
        hub.send("dev2", {"y": np.arange(3)}, timeout=T)
        assert np.array_equal(good.recv(timeout=T)["y"], np.arange(3))
        good.close()
        bad.close()
    finally:
        proxy.close()
        hub.close()
