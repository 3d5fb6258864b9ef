"""zmq+tcp:// beyond the conformance suite: zero-copy send semantics, framing recovery,
connection loss, reconnect takeover, routing ids nobody else can take, strangers and bounded
queues, on raw ZeroMQ sockets where a test must speak the protocol itself.

CURVE is in test_zmq_curve.py; who reads the socket and what is copied in test_zmq_reading.py.
"""

from __future__ import annotations

import importlib.util
import threading
import time
import uuid
from pathlib import Path

import numpy as np
import pytest
from waiting import until, until_inside

zmq = pytest.importorskip("zmq", reason="pyzmq is not installed (extra 'zmq')")

from zmq_helpers import (  # noqa: E402
    T,
    fake_welcome,
    fixture_ctx,  # noqa: F401  (a fixture: ctx)
    fixture_hub,  # noqa: F401  (a fixture: hub)
)

import tensorwire  # noqa: E402
from tensorwire.errors import (  # noqa: E402
    AuthenticationError,
    ChecksumMismatch,
    PeerGone,
    TransportTimeout,
    TruncatedMessage,
    WireError,
)
from tensorwire.transports.session import ClientSession  # noqa: E402
from tensorwire.transports.zmq.hub import MAX_STRANGERS  # noqa: E402
from tensorwire.transports.zmq.pieces import MORE, PIECE_BYTES, START, message_pieces  # noqa: E402
from tensorwire.wire import decode_message, encode_message  # noqa: E402


def _send_raw(sock, enc) -> None:
    for piece in message_pieces(enc):
        sock.send_multipart(piece)


def _recv_raw(sock):
    assert sock.poll(T * 1000), "no answer"
    frames = sock.recv_multipart()
    assert frames[0][:1] == START
    return decode_message(b"".join([frames[0][1:], *frames[1:]]))


def _hello(client_id: str, session: str):
    hello = ClientSession(client_id, decoders=[], max_message_bytes=1 << 20)
    hello.session = session
    return hello.hello()


def _raw_client(ctx, hub, client_id: str, hello: bool = True, routing_id: bytes | None = None):
    """A raw DEALER; with ``hello``, a member whose routing id is its session id."""
    sock = ctx.socket(zmq.DEALER)
    sock.routing_id = routing_id or uuid.uuid4().hex.encode()
    sock.connect(hub.url.removeprefix("zmq+"))
    if hello:
        _send_raw(sock, _hello(client_id, sock.routing_id.decode()))
        assert _recv_raw(sock).kind == "welcome"
    return sock


def test_send_returns_once_zeromq_no_longer_reads_the_arrays(hub):
    chans = [tensorwire.connect(hub.url, client_id=f"c{i}", codec=None) for i in range(2)]
    try:
        hub.wait_for(2, timeout=T)
        arr = np.ones(4 << 20, np.float32)  # 16 MiB: many zero-copy pieces
        hub.send("c0", {"x": arr})
        hub.broadcast({"y": arr * 2})
        arr[:] = 0  # a send has returned: changing the array must not reach the wire
        assert np.all(chans[0].recv(timeout=T)["x"] == 1)
        for ch in chans:
            assert np.all(ch.recv(timeout=T)["y"] == 2)
    finally:
        for ch in chans:
            ch.close()


def _inject_garbage(url: str, after_hello: bool) -> None:
    path = Path(__file__).parent / "schemes" / "zmq.py"
    spec = importlib.util.spec_from_file_location("tw_scheme_zmq_direct", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.inject_garbage(url, after_hello=after_hello)


def test_garbage_from_an_unnamed_dealer_is_rejected_and_others_served(hub):
    good = tensorwire.connect(hub.url, client_id="good")
    try:
        hub.wait_for(1, timeout=T)
        _inject_garbage(hub.url, after_hello=False)
        assert until(lambda: len(hub.errors) >= 2)
        assert all(isinstance(e, WireError) for _, e in hub.errors)
        hub.send("good", {"v": np.arange(3)})
        assert np.array_equal(good.recv(timeout=T)["v"], np.arange(3))
    finally:
        good.close()


def test_a_bad_message_is_dropped_and_the_next_one_from_that_client_delivered(hub, ctx):
    sock = _raw_client(ctx, hub, "raw")
    hub.wait_for(1, timeout=T)
    data = np.arange(1 << 18, dtype=np.float64)  # 2 MiB: the message spans several pieces
    corrupt = bytearray(encode_message({"x": data}).to_bytes())
    corrupt[len(corrupt) // 2] ^= 0xFF
    for start in range(0, len(corrupt), PIECE_BYTES):  # in pieces, as a sender must
        marker = MORE if start else START
        sock.send_multipart([marker, bytes(corrupt[start : start + PIECE_BYTES])])
    whole = encode_message({"x": data}).to_bytes()
    sock.send_multipart([START, whole[:1000]])  # cut short by the next START
    _send_raw(sock, encode_message({"x": data}, {"n": 3}))
    client, msg = hub.recv(timeout=T)
    assert client == "raw" and msg.meta == {"n": 3} and np.array_equal(msg["x"], data)
    kinds = [type(e) for _, e in hub.errors]
    assert kinds == [ChecksumMismatch, TruncatedMessage]


def test_data_without_a_hello_is_answered_with_bye(hub, ctx):
    sock = _raw_client(ctx, hub, "stranger", hello=False)
    _send_raw(sock, encode_message({"v": np.zeros(2)}))
    assert _recv_raw(sock).kind == "bye"
    assert hub.clients == []


def test_a_hub_that_vanishes_without_bye_raises_peer_gone(ctx):
    fake = ctx.socket(zmq.ROUTER)
    port = fake.bind_to_random_port("tcp://127.0.0.1")
    result: dict[str, object] = {}

    def client() -> None:
        ch = tensorwire.connect(f"zmq+tcp://127.0.0.1:{port}", client_id="c", timeout=T)
        try:
            ch.recv(timeout=T)
        except Exception as exc:
            result["exc"] = exc
        ch.close()

    t = threading.Thread(target=client)
    t.start()
    fake_welcome(fake)
    until_inside(t, "_recv_message")
    fake.close(linger=0)
    t.join(T)
    assert isinstance(result.get("exc"), PeerGone)


def test_reconnect_before_the_hub_noticed_the_drop_takes_the_id_over(hub):
    ch = tensorwire.connect(hub.url, client_id="r")
    try:
        hub.wait_for(1, timeout=T)
        for _ in range(3):
            ch.reconnect(timeout=T)
        hub.wait_for(1, timeout=T)  # the hub welcomes first, then counts the client in
        hub.send("r", {"v": np.arange(5)})
        assert np.array_equal(ch.recv(timeout=T)["v"], np.arange(5))
        ch.send({"v": np.arange(4)})
        assert hub.recv(timeout=T)[0] == "r"
        assert hub.clients == ["r"]
    finally:
        ch.close()


def test_a_reconnected_clients_sends_go_to_its_new_session_from_its_welcome_on(hub, monkeypatch):
    # Beside a CPU hog the hub's reader was held up between queueing a welcome and moving
    # the client's route: the client had its welcome, the hub still counted its old session,
    # and a send went to that session's closed pipe ("not connected"). The route and the
    # membership (its codecs) now move in the same hold of the ROUTER lock as the welcome,
    # just before it is queued (libzmq's I/O thread may send it at once).
    ch = tensorwire.connect(hub.url, client_id="r")
    seen: dict[str, bytes | None] = {}
    say = hub._say

    def watched(ident, enc, what, first=None):
        queued = say(ident, enc, what, first=first)
        if what == "welcome":
            with hub._lock:
                seen.update(ident=ident, route=hub._route.get("r"))
            with hub._cond:
                seen["member"] = hub._members["r"].session.ident
        return queued

    try:
        hub.wait_for(1, timeout=T)
        monkeypatch.setattr(hub, "_say", watched)
        ch.reconnect(timeout=T)
        assert until(lambda: "ident" in seen)
        # already this session's when the welcome left: its route, and its membership (codecs)
        assert seen["route"] == seen["ident"] == seen["member"]
        hub.wait_for(1, timeout=T)
        hub.send("r", {"v": np.arange(5)}, timeout=T)
        assert np.array_equal(ch.recv(timeout=T)["v"], np.arange(5))
    finally:
        ch.close()


def test_messages_to_a_client_arrive_in_the_order_sent(hub):
    ch = tensorwire.connect(hub.url, client_id="o")
    try:
        hub.wait_for(1, timeout=T)
        hub.send("o", {"v": np.zeros(1 << 20)}, meta={"i": 0})
        hub.broadcast({"v": np.zeros(10)}, meta={"i": 1})
        hub.send("o", None, meta={"i": 2})
        assert [ch.recv(timeout=T).meta["i"] for _ in range(3)] == [0, 1, 2]
    finally:
        ch.close()


def test_a_channel_sends_while_another_thread_waits_in_recv(hub):
    ch = tensorwire.connect(hub.url, client_id="t")
    try:
        hub.wait_for(1, timeout=T)
        got: list[object] = []
        waiter = threading.Thread(target=lambda: got.append(ch.recv(timeout=T)))
        waiter.start()
        until_inside(waiter, "_recv_message")
        ch.send({"u": np.ones(3)})
        assert hub.recv(timeout=T)[0] == "t"
        hub.send("t", {"w": np.arange(2)})
        waiter.join(T)
        assert np.array_equal(got[0]["w"], np.arange(2))
    finally:
        ch.close()


def test_on_join_may_send(hub):
    hub.on_join = lambda cid: hub.send(cid, {"hello": np.arange(3)})
    ch = tensorwire.connect(hub.url, client_id="j")
    try:
        assert np.array_equal(ch.recv(timeout=T)["hello"], np.arange(3))
    finally:
        ch.close()


def test_an_impostor_with_a_clients_routing_id_gets_none_of_its_messages(hub, ctx):
    victim = tensorwire.connect(hub.url, client_id="victim")
    try:
        hub.wait_for(1, timeout=T)
        routing_id = victim._dealer.routing_id  # the session id: secret, but say it leaked
        assert routing_id == victim._session.session.encode()
        # One impostor takes the routing id while the victim is connected and says the
        # victim's hello; another takes the client id, the routing id of the old protocol.
        twin = _raw_client(ctx, hub, "victim", hello=False, routing_id=routing_id)
        _send_raw(twin, _hello("victim", routing_id.decode()))
        named = _raw_client(ctx, hub, "victim", hello=False, routing_id=b"victim")
        _send_raw(named, encode_message({"v": np.zeros(2)}))
        assert _recv_raw(named).kind == "bye"  # no session on that connection
        for i in range(3):
            hub.send("victim", {"v": np.full(4, i)}, meta={"i": i})
            assert hub.broadcast(None, meta={"b": i}).keys() == {"victim"}
        for i in range(3):
            assert victim.recv(timeout=T).meta == {"i": i}
            assert victim.recv(timeout=T).meta == {"b": i}
        assert not twin.poll(500), "the impostor received the victim's messages"
        assert not named.poll(100)
        victim.send({"v": np.arange(3)}, meta={"from": "victim"})
        client, msg = hub.recv(timeout=T)
        assert (client, msg.meta) == ("victim", {"from": "victim"})
        assert hub.clients == ["victim"]
        assert [e.kind for e in hub.events] == ["joined"]  # never replaced
    finally:
        victim.close()


def test_a_hello_on_a_routing_id_other_than_its_session_is_refused(hub, ctx):
    wrong = _raw_client(ctx, hub, "w", hello=False, routing_id=b"w" * 32)
    _send_raw(wrong, _hello("w", uuid.uuid4().hex))
    assert _recv_raw(wrong).kind == "refuse"
    short = _raw_client(ctx, hub, "s", hello=False, routing_id=b"abc")
    _send_raw(short, _hello("s", "abc"))  # a guessable session id
    answer = _recv_raw(short)
    assert answer.kind == "refuse" and "routing id" in answer.meta["reason"]
    assert hub.clients == []
    assert until(lambda: sum(e.kind == "refused" for e in hub.events) == 2)


def test_unfinished_messages_of_strangers_are_bounded(hub, ctx):
    hello = _hello("x", uuid.uuid4().hex).to_bytes()
    socks = []
    for _ in range(MAX_STRANGERS + 20):
        sock = _raw_client(ctx, hub, "x", hello=False)
        sock.send_multipart([START + hello[:30]])  # the start of a hello, never finished
        socks.append(sock)
    assert until(lambda: any("too many strangers" in str(e) for _, e in hub.errors))
    assert len(hub._strangers) <= MAX_STRANGERS
    good = tensorwire.connect(hub.url, client_id="good")
    try:
        hub.wait_for(1, timeout=T)
        hub.send("good", {"v": np.arange(3)})
        assert np.array_equal(good.recv(timeout=T)["v"], np.arange(3))
    finally:
        good.close()


def test_sends_to_a_client_that_does_not_read_time_out_and_it_is_served_after(hub):
    hub.set_codec(None)  # 1 MiB on the wire per message, not a compressed few KiB
    ch = tensorwire.connect(hub.url, client_id="lazy", codec=None)
    other = tensorwire.connect(hub.url, client_id="busy", codec=None)
    try:
        hub.wait_for(2, timeout=T)
        piece = np.ones(1 << 18, np.float32)  # 1 MiB: one ZeroMQ message
        sent = 0
        with pytest.raises(TransportTimeout, match="lazy"):
            for _ in range(1000):  # queues and socket buffers hold far fewer
                hub.send("lazy", {"v": piece}, meta={"n": sent}, timeout=0.5)
                sent += 1
        assert 1 <= sent < 200
        t0 = time.monotonic()
        result = hub.broadcast({"v": piece}, meta={"n": -1}, timeout=0.5)
        assert time.monotonic() - t0 < 3
        assert set(result) == {"busy"} and isinstance(result.failed["lazy"], TransportTimeout)
        assert ("slow", "lazy") in [(e.kind, e.client_id) for e in hub.events]
        assert other.recv(timeout=T).meta == {"n": -1}
        got = []
        while True:  # what was queued arrives in order, whole or (a timed-out one) cut short
            try:
                got.append(ch.recv(timeout=1).meta["n"])
            except TruncatedMessage:
                continue
            except TransportTimeout:
                break
        assert got[:sent] == list(range(sent))
        hub.send("lazy", {"v": np.arange(3)}, meta={"n": "after"}, timeout=T)
        assert ch.recv(timeout=T).meta == {"n": "after"}
    finally:
        ch.close()
        other.close()


def test_channel_sends_time_out_when_the_hub_does_not_read(ctx):
    fake = ctx.socket(zmq.ROUTER)
    fake.rcvhwm = 4
    port = fake.bind_to_random_port("tcp://127.0.0.1")
    t = threading.Thread(target=fake_welcome, args=(fake,))
    t.start()
    ch = tensorwire.connect(f"zmq+tcp://127.0.0.1:{port}", client_id="c", timeout=T, codec=None)
    t.join(T)
    try:
        piece = np.ones(1 << 18, np.float32)
        sent = 0
        t0 = time.monotonic()
        with pytest.raises(TransportTimeout, match="hub"):
            for _ in range(1000):  # the fake hub reads nothing more
                ch.send({"v": piece}, timeout=0.5)
                sent += 1
        assert 1 <= sent < 200 and time.monotonic() - t0 < 60
    finally:
        ch._drop()


def test_a_stranger_that_reads_nothing_cannot_stall_the_hub(hub, ctx):
    good = tensorwire.connect(hub.url, client_id="good")
    try:
        hub.wait_for(1, timeout=T)
        stranger = _raw_client(ctx, hub, "s", hello=False)
        data = encode_message({"v": np.zeros(2)}).to_bytes()
        for _ in range(2000):  # each is answered with a bye it never reads
            stranger.send_multipart([START + data])
        assert until(lambda: hub.errors.total >= 2000)
        t0 = time.monotonic()
        hub.send("good", {"v": np.arange(3)}, timeout=T)
        assert np.array_equal(good.recv(timeout=T)["v"], np.arange(3))
        good.send({"v": np.arange(2)})
        assert hub.recv(timeout=T)[0] == "good" and time.monotonic() - t0 < 5
    finally:
        good.close()


def test_the_credential_check_sees_only_hellos_on_their_own_routing_id(ctx):
    seen = []

    def authenticate(hello, tls_name):
        seen.append(hello.client_id)
        if hello.client_id != "friend":
            raise AuthenticationError(f"{hello.client_id!r} is not enrolled")
        return {}, None

    with tensorwire.serve("zmq+tcp://127.0.0.1:0", authenticate=authenticate) as hub:
        with pytest.raises(AuthenticationError, match="not enrolled"):
            tensorwire.connect(hub.url, client_id="foe", timeout=T)
        spoof = _raw_client(ctx, hub, "friend", hello=False, routing_id=b"f" * 32)
        _send_raw(spoof, _hello("friend", uuid.uuid4().hex))
        assert _recv_raw(spoof).kind == "refuse"  # refused before the credential check
        with tensorwire.connect(hub.url, client_id="friend", timeout=T) as ch:
            hub.wait_for(1, timeout=T)
            hub.send("friend", {"v": np.arange(2)})
            assert np.array_equal(ch.recv(timeout=T)["v"], np.arange(2))
        assert seen == ["foe", "friend"]
