"""udp:// against hostile peers and strangers: forged input that must allocate nothing, a
fuzzed link, a partial message that would decode to more than arrived, a peer that stops
reading, floods of silent connections; and secured sessions (TLS on the control connection,
sealed datagrams): nothing in clear, replayed, altered or forged datagrams dropped, stalled
TLS handshakes, a session replaced by the same credential.
"""

from __future__ import annotations

import contextlib
import random
import socket
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from udp_helpers import (
    T,
    _secured,
    _serve,
    fixture_enrolment,  # noqa: F401  (a fixture: enrolment)
)

import tensorwire
from tensorwire.errors import (
    AuthenticationError,
    MessageTooLarge,
    PeerGone,
    TransportError,
    TransportTimeout,
    WireError,
)
from tensorwire.transports.udp import channel as udp_channel
from tensorwire.transports.udp import hub as udp_hub
from tensorwire.transports.udp import receiving as udp_receiving
from tensorwire.transports.udp import sending as udp_sending
from tensorwire.transports.udp import sockets as udp_sockets
from tensorwire.transports.udp.flow import Flow
from tensorwire.transports.udp.loop import IoLoop
from tensorwire.transports.udp.loss import Received, decode_received
from tensorwire.transports.udp.options import UdpOptions, parse_udp_url
from tensorwire.transports.udp.sockets import ControlReader, ControlWriter
from tensorwire.transports.udp.stats import UdpStats
from tensorwire.wire import Limits, decode_message, encode_message
from tensorwire.wire.chunks import CHUNK_HEADER, CHUNK_MAGIC, CHUNK_VERSION


def _rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS in /proc/self/status")


@pytest.mark.parametrize("scheme", ["udp"])
def test_forged_input_leaves_a_best_effort_hub_serving_and_allocating_nothing(scheme_module):
    # best-effort gives incomplete messages up by decoding what came: the forged ones declare
    # 16 GiB and must cost no more than what arrived (the conformance suite runs reliable)
    with tensorwire.serve("udp://127.0.0.1:0?mode=best-effort&mtu=65000", codec=None) as hub:
        chans = [tensorwire.connect(hub.url, client_id=f"dev{i}", codec=None) for i in range(2)]
        hub.wait_for(2, timeout=T)
        before = _rss()
        for _ in range(3):
            scheme_module.inject_forged(hub.url, ["dev0", "dev1"])
        deadline = time.monotonic() + T
        while hub.clients != ["dev0", "dev1"] and time.monotonic() < deadline:
            time.sleep(0.05)  # the joined strangers leave once their junk ends their sessions
        assert hub.clients == ["dev0", "dev1"]
        assert _rss() - before < 32 << 20
        assert hub.udp_stats.stranger_datagrams >= 3 * 10 and hub.udp_stats.partial_messages == 0
        assert all(isinstance(e, WireError) for _, e in hub.errors)
        hub.broadcast({"v": np.arange(5)}, meta={"r": 1}, timeout=T)
        for ch in chans:
            assert ch.recv(timeout=T).meta == {"r": 1} and not ch.errors
            ch.send({"v": np.arange(2)}, meta={"ok": 1})
        assert sorted(dict(hub.gather(timeout=T))) == ["dev0", "dev1"]
        for ch in chans:
            ch.close()


def _fuzz_chunk(rng: random.Random) -> bytes:
    """A chunk that may lie about anything, most often only a little."""
    total = rng.choice([0, 1, 10, 1000, 1 << 20, 1 << 29, (1 << 30) + 5, 16 << 30])
    size = rng.choice([1, 100, 1460])
    count = max(-(-total // size), 1) if rng.random() < 0.9 else rng.randrange(1, 100)
    index = rng.randrange(min(count, 50)) if rng.random() < 0.7 else rng.randrange(count)
    offset = index * size if rng.random() < 0.95 else rng.randrange(total + 1)
    n = min(size, max(total - offset, 0)) if rng.random() < 0.95 else rng.randrange(1500)
    head = CHUNK_HEADER.pack(
        CHUNK_MAGIC, CHUNK_VERSION, 0, 0, rng.randrange(300), index % (1 << 32), count % (1 << 32),
        offset, total,
    )  # fmt: skip
    return head + rng.randbytes(min(n, 24)) + bytes(max(n - 24, 0))


@pytest.mark.parametrize("mode", ["reliable", "best-effort"])
def test_a_link_fed_forged_datagrams_and_control_messages_raises_only_wire_errors(mode):
    rng = random.Random(7)
    ours, theirs = socket.socketpair()
    theirs.setblocking(False)
    loop = IoLoop("fuzz", lambda now: None)
    loop.start()
    got: list[object] = []
    flow = Flow(
        label="peer", mode=mode, options=UdpOptions(mtu=1500), udp=None, address=None,
        reader=ControlReader(ours, Limits(), bytearray(1 << 16)),
        writer=ControlWriter(ours, loop, lambda exc: None), deliver=got.append,
        reject=got.append, stats=UdpStats(), limits=Limits(max_message_bytes=1 << 30),
        session=None,
    )  # fmt: skip
    now, fed, errors = 0.0, 0, 0
    try:
        for _ in range(20_000):
            now += rng.random() * 0.05
            r = rng.random()
            try:
                if r < 0.9:
                    d = _fuzz_chunk(rng)
                    fed += len(d)
                    flow.on_datagram(memoryview(d), now)
                elif r < 0.97:
                    kind = rng.choice(["sent", "drop", "ack", "nack", "other"])
                    meta = {"id": rng.randrange(300), "count": rng.choice([1, 7, 1 << 32])}
                    ranges = {"ranges": np.array([[0, rng.randrange(1, 9)]])}
                    enc = encode_message(ranges if kind == "nack" else None, meta, kind=kind)
                    flow.on_control(decode_message(enc.to_bytes()), now)
                elif r < 0.995:
                    flow.tick(now)
                else:
                    flow.flush(now)
            except WireError:
                errors += 1
            held = sum(inc.reassembler.pending_bytes for inc in flow._incoming.values())
            assert held <= 9 * fed + udp_receiving.MAX_INCOMING * 4096
            with contextlib.suppress(BlockingIOError):
                while theirs.recv(1 << 20):
                    pass  # the peer reads its acks and NACKs
        flow.flush(now + 1000)
    finally:
        loop.stop()
        ours.close()
        theirs.close()
    assert errors > 100 and got
    for item in got:
        if isinstance(item, Received) and item.missing:  # kept: its header and half came
            assert 2 * item.arrived >= len(item.data)
        else:
            assert isinstance(item, (Received, WireError)), item


def test_a_partial_message_decodes_to_at_most_its_arrived_bytes_times_the_bound():
    zeros = np.zeros(16 << 20, np.uint8)  # lz4 makes ~64 KiB of it
    lz4 = tensorwire.resolve_codecs("lz4")
    tensors = {"z": zeros, "r": np.arange(1000.0)}
    enc = encode_message(tensors, codecs=lambda name, arr: lz4(name, arr) if name == "z" else [])
    data = np.frombuffer(enc.to_bytes(), np.uint8)
    head = len(enc.head)
    endpoint = type("Endpoint", (), {"limits": Limits()})()
    lost_z = Received(1, data, [(head, 10)], time.perf_counter(), len(data) - 10)
    with pytest.raises(MessageTooLarge, match="lost compressed tensors"):
        decode_received(endpoint, lost_z, None)
    lost_r = Received(2, data, [(len(data) - 100, 10)], time.perf_counter(), len(data) - 10)
    msg = decode_received(endpoint, lost_r, None)  # a lost raw range costs what it spans
    assert msg.loss["z"] == 0.0 and 0 < msg.loss["r"] < 0.01


def test_a_peer_that_stops_reading_its_control_connection_breaks_it_without_blocking():
    ours, theirs = socket.socketpair()  # ``theirs`` never reads
    loop = IoLoop("writer", lambda now: None)
    loop.add(ours, lambda: None)
    loop.start()
    broken = threading.Event()
    writer = ControlWriter(ours, loop, lambda exc: broken.set(), max_backlog=1 << 20)
    big = encode_message({"x": np.zeros(64 << 10, np.uint8)}, kind="nack")
    t = time.monotonic()
    try:
        with pytest.raises(PeerGone, match="has not read"):
            for _ in range(1000):
                writer.write(big)
        assert time.monotonic() - t < 2.0 and broken.wait(T)
        with pytest.raises(PeerGone):
            writer.write(big)
    finally:
        loop.stop()
        ours.close()
        theirs.close()


def test_silent_control_connections_are_capped_and_timed_out(monkeypatch):
    monkeypatch.setattr(udp_hub, "HANDSHAKE_TIMEOUT", 1.0)
    with _serve("reliable") as hub:
        _, port, _ = parse_udp_url(hub.url)
        address = ("127.0.0.1", port)
        silent = [socket.create_connection(address) for _ in range(udp_hub.MAX_HANDSHAKES)]
        extra = socket.create_connection(address, timeout=T)
        assert extra.recv(1) == b""  # over the cap: closed at once
        t = time.monotonic()
        ch = tensorwire.connect(hub.url, client_id="late", timeout=T)  # retried until room
        assert 0.5 < time.monotonic() - t < T / 2
        assert all(s.recv(1) == b"" for s in silent)  # each timed out and closed
        assert hub.wait_for(1, timeout=T) == ["late"]
        reasons = [e.reason for e in hub.events if e.kind == "refused"]
        assert any("already waiting" in r for r in reasons)
        assert any("said no hello" in r for r in reasons)
        for s in [*silent, extra]:
            s.close()
        ch.close()


# -- secured: TLS on the control connection, sealed datagrams -----------------------------------

MARKER = b"TENSORWIRE-CLEARTEXT-MARKER-0042"  # in every tensor and in the meta: never in clear


def _capture(monkeypatch) -> bytearray:
    """Keep every byte udp:// hands the kernel, datagrams and control connections, both ways."""
    seen = bytearray()
    real_datagram, real_control = udp_sending.send_datagram, udp_sockets.ControlWriter._send
    real_hello = udp_channel.sendmsg_all

    def datagram(sock, parts, address, deadline):
        seen.extend(b"".join(bytes(p) for p in parts))
        real_datagram(sock, parts, address, deadline)

    def control(self, data):
        n = real_control(self, data)
        seen.extend(data[:n])
        return n

    def hello(sock, buffers, deadline=None):
        seen.extend(b"".join(bytes(b) for b in buffers))
        real_hello(sock, buffers, deadline)

    monkeypatch.setattr(udp_sending, "send_datagram", datagram)
    monkeypatch.setattr(udp_sockets.ControlWriter, "_send", control)
    monkeypatch.setattr(udp_channel, "sendmsg_all", hello)
    return seen


@pytest.mark.parametrize("security", ["none", "tls", "tls+keys"])
@pytest.mark.parametrize("mode", ["reliable", "best-effort"])
def test_secured_sessions_send_no_tensor_or_header_byte_in_clear(
    monkeypatch, enrolment, mode, security
):
    # "tls": the hub's certificate only, no keys: the datagram key is the welcome's alone
    seen = _capture(monkeypatch)
    secured = security != "none"
    hub_opts, client_opts = _secured(enrolment) if secured else ({}, {})
    if security == "tls":
        hub_opts = {"tls": tensorwire.TLS(cert=enrolment.hub_cert, key=enrolment.hub_key)}
        client_opts = {"tls": tensorwire.TLS(ca=enrolment.ca)}
    pattern = np.frombuffer(MARKER * 2048, np.uint8)  # 64 KiB: many datagrams at mtu 1472
    with _serve(mode, **hub_opts) as hub:
        ch = tensorwire.connect(hub.url, client_id="dev1", codec=None, timeout=T, **client_opts)
        hub.wait_for(1, timeout=T)
        hub.send("dev1", {"p": pattern}, meta={"m": MARKER.decode()}, timeout=T)
        msg = ch.recv(timeout=T)
        assert np.array_equal(msg["p"], pattern) and msg.meta == {"m": MARKER.decode()}
        ch.send({"p": pattern}, meta={"m": MARKER.decode()}, timeout=T)
        assert np.array_equal(hub.recv(timeout=T)[1]["p"], pattern)
        ch.close()
    assert len(seen) > 2 * pattern.nbytes, "nothing captured: the test is broken"
    # the control: without tls= the same capture does see the tensors and the meta
    assert (MARKER[:16] in seen) is not secured
    assert (b"dev1" in seen) is not secured  # the hello's client id: inside TLS too


def _tamper(monkeypatch, sent: list[tuple]) -> None:
    """Make every sender also send each datagram again (a replay) and an altered copy of it
    (a bit flipped in the clear chunk header, or in the sealed payload); keep each original
    as ``(socket, address, bytes)`` in ``sent``, to replay later."""
    real = udp_sending.send_datagram

    def send(sock, parts, address, deadline):
        real(sock, parts, address, deadline)
        d = bytearray(b"".join(bytes(p) for p in parts))
        sent.append((sock, address, bytes(d)))
        real(sock, [bytes(d)], address, deadline)
        d[8 + 16 if len(sent) % 2 else len(d) - 20] ^= 0x01  # a chunk index, or a payload byte
        real(sock, [bytes(d)], address, deadline)

    monkeypatch.setattr(udp_sending, "send_datagram", send)


@pytest.mark.parametrize("mode", ["reliable", "best-effort"])
def test_replayed_altered_or_forged_datagrams_are_dropped_and_counted(monkeypatch, enrolment, mode):
    hub_opts, client_opts = _secured(enrolment)
    sent: list[tuple] = []
    arr = np.random.default_rng(3).standard_normal(50_000)
    with _serve(mode, **hub_opts) as hub:
        ch = tensorwire.connect(hub.url, client_id="dev1", codec=None, timeout=T, **client_opts)
        hub.wait_for(1, timeout=T)
        _tamper(monkeypatch, sent)
        for r in range(3):
            if r == 2:  # every datagram of round 0 again, now that round 2 is on the way
                for sock, address, d in list(sent):
                    udp_sockets.send_datagram(sock, [d], address, None)
            hub.send("dev1", {"w": arr + r}, meta={"r": r}, timeout=T)
            ch.send({"w": arr - r}, meta={"r": r}, timeout=T)
            msg = ch.recv(timeout=T)
            assert msg.meta == {"r": r} and msg["w"].tobytes() == (arr + r).tobytes()
            assert msg.loss == {"w": 0.0}
            cid, msg = hub.recv(timeout=T)
            assert cid == "dev1"
            assert msg.meta == {"r": r} and msg["w"].tobytes() == (arr - r).tobytes()
        monkeypatch.undo()
        ch._udp.send(b"\0" * 100)  # junk from the client's own address
        ch._udp.send(sent[0][2][:30])  # too short to be sealed
        n = len(sent)  # originals; each went out twice more (replayed, altered)
        deadline = time.monotonic() + T
        while (
            hub.udp_stats.refused_datagrams + ch.udp_stats.refused_datagrams < 2 * n + 2
            and time.monotonic() < deadline
        ):
            time.sleep(0.02)
        with pytest.raises(TransportTimeout):  # nothing more was delivered, either way
            ch.recv(timeout=0.3)
        with pytest.raises(TransportTimeout):
            hub.recv(timeout=0.01)
        # the round-0 copies sent during round 2 are refused too, hence "at least"
        assert hub.udp_stats.refused_datagrams + ch.udp_stats.refused_datagrams >= 2 * n + 2
        for side in (hub, ch):
            assert side.udp_stats.refused_datagrams > 0, side.udp_stats
            assert set(side.errors.counts) == {"AuthenticationError"}, side.errors.counts
            assert side.errors.total <= 4  # reported once a second, not once a datagram
            assert side.udp_stats.partial_messages == side.udp_stats.lost_messages == 0
        hub.send("dev1", {"w": arr}, timeout=T)  # the session goes on
        assert ch.recv(timeout=T)["w"].tobytes() == arr.tobytes()
        ch.close()


def test_a_secured_hub_handshakes_in_its_loop_so_stalled_or_junk_tls_holds_no_one_up(
    monkeypatch, enrolment
):
    monkeypatch.setattr(udp_hub, "HANDSHAKE_TIMEOUT", 1.0)
    hub_opts, client_opts = _secured(enrolment)
    with _serve("reliable", **hub_opts) as hub:
        address = ("127.0.0.1", parse_udp_url(hub.url)[1])
        stalled = socket.create_connection(address, timeout=T)
        stalled.sendall(bytes.fromhex("160301020001"))  # a ClientHello cut short, then silence
        junk = socket.create_connection(address, timeout=T)
        junk.sendall(b"\x16\x03\x03\x00\x05" + b"\xff" * 5)  # a handshake record of junk
        with tensorwire.connect(hub.url, client_id="dev1", timeout=T, **client_opts) as ch:
            assert hub.wait_for(1, timeout=T) == ["dev1"]
            hub.send("dev1", {"v": np.arange(3)}, timeout=T)
            assert np.array_equal(ch.recv(timeout=T)["v"], np.arange(3))
        for s in (junk, stalled):  # each closed: the junk at once (after an alert), the
            s.settimeout(T)  # stalled one at its handshake timeout
            while s.recv(1 << 10):
                pass
        reasons = [e.reason for e in hub.events if e.kind == "refused"]
        assert any("TLS handshake failed" in r for r in reasons), reasons
        assert any("said no hello" in r for r in reasons), reasons
        with pytest.raises(AuthenticationError, match="takes TLS only"):  # a client in clear
            tensorwire.connect(hub.url, client_id="dev1", key=client_opts["key"], timeout=T)
        for s in (stalled, junk):
            s.close()


def test_a_second_session_proving_the_credential_replaces_the_first(enrolment):
    hub_opts, client_opts = _secured(enrolment)
    with _serve("reliable", **hub_opts) as hub:
        old = tensorwire.connect(hub.url, client_id="dev1", timeout=T, **client_opts)
        hub.wait_for(1, timeout=T)
        new = tensorwire.connect(hub.url, client_id="dev1", timeout=T, **client_opts)
        deadline = time.monotonic() + T
        while not any(e.kind == "replaced" for e in hub.events) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert hub.clients == ["dev1"]
        with pytest.raises(PeerGone):  # the hub ended the old session
            old.recv(timeout=T)
        hub.send("dev1", {"v": np.arange(4)}, timeout=T)  # sealed under the new session's key
        assert np.array_equal(new.recv(timeout=T)["v"], np.arange(4))
        new.send({"v": np.arange(2)}, timeout=T)
        assert np.array_equal(hub.recv(timeout=T)[1]["v"], np.arange(2))
        for ch in (old, new):
            ch.close()


def test_tls_needs_an_mtu_with_room_for_the_seal(enrolment):
    hub_opts, client_opts = _secured(enrolment)
    with pytest.raises(TransportError, match="sealed chunk"):
        tensorwire.serve("udp://127.0.0.1:0?mtu=64", **hub_opts)
    with pytest.raises(TransportError, match="sealed chunk"):
        tensorwire.connect("udp://127.0.0.1:9?mtu=64", **client_opts)
