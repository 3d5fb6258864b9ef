"""zmq+tcp:// beyond the conformance suite: zero-copy send semantics, framing recovery,
connection loss, reconnect takeover, routing ids nobody else can take, bounded queues, thread
use, CURVE (key files, mismatched encryption, what crosses the wire)."""

from __future__ import annotations

import importlib.util
import shutil
import socket
import threading
import time
import uuid
from pathlib import Path

import numpy as np
import pytest
from recording_proxy import RecordingProxy
from waiting import until, until_inside

zmq = pytest.importorskip("zmq", reason="pyzmq is not installed (extra 'zmq')")

import tensorwire  # noqa: E402
from tensorwire.errors import (  # noqa: E402
    AuthenticationError,
    ChecksumMismatch,
    PeerGone,
    TransportError,
    TransportTimeout,
    TruncatedMessage,
    WireError,
)
from tensorwire.transports.session import ClientSession, HubSession  # noqa: E402
from tensorwire.transports.zmq.hub import MAX_STRANGERS  # noqa: E402
from tensorwire.transports.zmq.pieces import MORE, PIECE_BYTES, START, message_pieces  # noqa: E402
from tensorwire.wire import decode_message, encode_message  # noqa: E402

T = 20.0


@pytest.fixture
def hub():
    with tensorwire.serve("zmq+tcp://127.0.0.1:0") as h:
        yield h


@pytest.fixture
def ctx():
    c = zmq.Context()
    yield c
    c.destroy(linger=0)


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


def _fake_welcome(fake) -> None:
    """Answer the first hello on the ROUTER ``fake`` as a hub would."""
    assert fake.poll(T * 1000)
    ident, *frames = fake.recv_multipart()
    session = HubSession(decoders=[], max_message_bytes=1 << 30)
    session.receive(decode_message(b"".join([frames[0][1:], *frames[1:]])))
    fake.send_multipart([ident, START, session.welcome().to_bytes()])


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
    _fake_welcome(fake)
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
    t = threading.Thread(target=_fake_welcome, args=(fake,))
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


# -- CURVE ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def enrolment(tmp_path_factory):
    pytest.importorskip("cryptography", reason="cryptography is not installed")
    from tensorwire.transports.certs import make_certs

    return make_certs(tmp_path_factory.mktemp("certs"), hosts=["127.0.0.1"], clients=["d1", "d2"])


@pytest.fixture
def curve_hub(enrolment):
    """A hub encrypting with CURVE (``hub.curve``) and admitting only enrolled devices."""
    d = enrolment.directory
    with tensorwire.serve(
        f"zmq+tcp://127.0.0.1:0?curve={d / 'hub.curve'}&keys={enrolment.keys}", codec=None
    ) as h:
        yield h


def _secured(enrolment, cid: str) -> dict:
    return {"curve": enrolment.directory / "hub.curve.pub", "key": enrolment.devices[cid]["secret"]}


def test_curve_and_secrets_from_url_options(curve_hub, enrolment):
    d = enrolment.directory
    url = f"{curve_hub.url}?curve={d / 'hub.curve.pub'}&secret={enrolment.devices['d1']['secret']}"
    with tensorwire.connect(url, client_id="d1", codec=None) as ch:
        curve_hub.wait_for(1, timeout=T)
        arr = np.arange(3 << 20, dtype=np.float32)  # 12 MiB: many pieces, zero-copy frames
        curve_hub.send("d1", {"x": arr}, timeout=T)
        assert np.array_equal(ch.recv(timeout=T)["x"], arr)
        ch.send({"x": arr[:5]}, timeout=T)
        assert np.array_equal(curve_hub.recv(timeout=T)[1]["x"], arr[:5])


def test_unknown_url_options_raise(enrolment):
    with pytest.raises(TransportError, match="unknown option"):
        tensorwire.serve("zmq+tcp://127.0.0.1:0?curv=x")
    with pytest.raises(TransportError, match="unknown option"):
        tensorwire.connect("zmq+tcp://127.0.0.1:1?linger=5", timeout=1)
    with pytest.raises(TransportError, match="differ"):
        tensorwire.serve("zmq+tcp://127.0.0.1:0?curve=a", curve="b")


def test_a_client_without_curve_is_told_at_once(curve_hub, enrolment):
    t = time.monotonic()
    with pytest.raises(AuthenticationError, match="CURVE"):
        tensorwire.connect(curve_hub.url, client_id="d1", key=enrolment.devices["d1"]["secret"])
    assert time.monotonic() - t < 10  # not the 30 s default timeout
    assert until(lambda: any(e.kind == "refused" for e in curve_hub.events))
    # "it connected without CURVE", or, when the client saw the mismatch first and hung up,
    # "it closed the connection during the ZMTP handshake (a client without CURVE ...?)"
    assert "without CURVE" in next(e.reason for e in curve_hub.events if e.kind == "refused")
    assert curve_hub.clients == []


def test_a_curve_client_does_not_talk_to_a_hub_in_clear(hub, enrolment):
    with pytest.raises(AuthenticationError, match="not encrypt"):  # both ways libzmq tells it
        tensorwire.connect(hub.url, client_id="d1", **_secured(enrolment, "d1"))
    assert hub.clients == []


def test_a_wrong_hub_key_is_an_authentication_error(curve_hub, enrolment):
    with pytest.raises(AuthenticationError, match="its key is not the public key"):
        tensorwire.connect(
            curve_hub.url,
            client_id="d1",
            curve=enrolment.directory / "d2.curve",  # some other key pair's public key
            key=enrolment.devices["d1"]["secret"],
        )
    assert until(lambda: any("public key" in e.reason for e in curve_hub.events))


def test_the_hub_key_is_found_beside_the_ca_and_hub_curve_is_a_fallback(
    curve_hub, enrolment, tmp_path, caplog
):
    key = enrolment.devices["d1"]["secret"]
    with tensorwire.connect(
        curve_hub.url, client_id="d1", tls=tensorwire.TLS(ca=enrolment.ca), key=key
    ):
        curve_hub.wait_for(1, timeout=T)
    for name in ("ca.pem", "hub.curve"):  # an older directory: no hub.curve.pub
        shutil.copy(enrolment.directory / name, tmp_path / name)
    with tensorwire.connect(
        curve_hub.url, client_id="d1", tls=tensorwire.TLS(ca=tmp_path / "ca.pem"), key=key
    ):
        pass
    assert any("SECRET" in r.getMessage() for r in caplog.records)
    (tmp_path / "hub.curve").unlink()
    with pytest.raises(TransportError, match=r"hub\.curve\.pub"):
        tensorwire.connect(
            curve_hub.url, client_id="d1", tls=tensorwire.TLS(ca=tmp_path / "ca.pem")
        )


def test_a_hub_that_would_check_certificates_it_cannot_see_is_refused(enrolment):
    e = enrolment
    mutual = tensorwire.TLS(cert=e.hub_cert, key=e.hub_key, ca=e.ca)
    with pytest.raises(TransportError, match="cannot check client certificates"):
        tensorwire.serve("zmq+tcp://127.0.0.1:0", tls=mutual)
    with (
        tensorwire.serve("zmq+tcp://127.0.0.1:0", tls=mutual, auth=e.keys) as h,  # keys: fine
        tensorwire.connect(h.url, client_id="d2", **_secured(e, "d2")),
    ):
        h.wait_for(1, timeout=T)
    with pytest.raises(TransportError, match="curve=FILE"):
        tensorwire.serve("zmq+tcp://127.0.0.1:0", tls=tensorwire.TLS(), auth=e.keys)


def test_key_file_errors_name_the_file_and_never_the_key(enrolment, tmp_path):
    public, secret = (enrolment.directory / "hub.curve").read_text().split()
    cases = {
        "swapped.curve": f"{secret}\n{public}\n",  # the secret first
        "public-only.curve": f"{public}\n",
        "bad.curve": f"{public}\n{secret[:-1]}~~\n",
        "binary.curve": "\u00e9" * 80,
    }
    for name, text in cases.items():
        (tmp_path / name).write_text(text)
        with pytest.raises(TransportError) as info:
            tensorwire.serve("zmq+tcp://127.0.0.1:0", curve=tmp_path / name, auth=enrolment.keys)
        assert name in str(info.value) and secret not in str(info.value)
        assert secret[:8] not in str(info.value)
    with pytest.raises(TransportError, match="cannot read"):
        tensorwire.serve("zmq+tcp://127.0.0.1:0", curve=tmp_path / "missing.curve")


def test_the_same_credential_replaces_a_session_and_another_cannot(curve_hub, enrolment):
    first = tensorwire.connect(curve_hub.url, client_id="d1", **_secured(enrolment, "d1"))
    second = tensorwire.connect(curve_hub.url, client_id="d1", **_secured(enrolment, "d1"))
    try:
        assert until(lambda: any(e.kind == "replaced" for e in curve_hub.events))
        with pytest.raises(AuthenticationError, match="does not know its secret"):
            tensorwire.connect(
                curve_hub.url,
                client_id="d1",
                curve=enrolment.directory / "hub.curve.pub",
                key=enrolment.devices["d2"]["secret"],
            )
        curve_hub.send("d1", {"v": np.arange(3)}, timeout=T)
        assert np.array_equal(second.recv(timeout=T)["v"], np.arange(3))
        assert curve_hub.clients == ["d1"]
    finally:
        first.close()
        second.close()


@pytest.fixture
def proxy(curve_hub):
    p = RecordingProxy(("127.0.0.1", int(curve_hub.url.rsplit(":", 1)[1])))
    yield p
    p.close()


def _through(proxy: RecordingProxy, enrolment, cid: str = "d1") -> tensorwire.Channel:
    url = f"zmq+tcp://127.0.0.1:{proxy.port}"
    return tensorwire.connect(url, client_id=cid, codec=None, **_secured(enrolment, cid))


def test_neither_tensors_nor_client_and_session_ids_cross_in_clear(curve_hub, proxy, enrolment):
    """Under CURVE the routing id (= session id) travels encrypted too: nobody on the path
    learns which routing id would receive a client's messages."""
    pattern = np.frombuffer(b"ZMQ-CURVE-CLEARTEXT-CHECK-PATTERN" * 64, np.uint8)
    with _through(proxy, enrolment) as ch:
        curve_hub.wait_for(1, timeout=T)
        session = ch._session.session
        curve_hub.send("d1", {"p": pattern}, timeout=T)
        assert np.array_equal(ch.recv(timeout=T)["p"], pattern)
        ch.send({"p": pattern}, timeout=T)
        curve_hub.recv(timeout=T)
    wire = bytes(proxy.seen["up"] + proxy.seen["down"])
    assert len(wire) > 2 * pattern.nbytes and b"CURVE" in wire  # the ZMTP greeting
    for clear in (bytes(pattern[:32]), session.encode(), b"d1\x00", b'"d1"', b"hello"):
        assert clear not in wire


def test_an_altered_message_is_never_delivered(curve_hub, proxy, enrolment):
    with _through(proxy, enrolment) as ch:
        curve_hub.wait_for(1, timeout=T)
        proxy.flip_next("down")
        curve_hub.send("d1", {"v": np.arange(1000)}, timeout=T)
        with pytest.raises(PeerGone):  # at once: libzmq would stall the connection instead
            ch.recv(timeout=T)
    with _through(proxy, enrolment, "d2") as ch:
        assert until(lambda: "d2" in curve_hub.clients)
        proxy.flip_next("up")
        ch.send({"v": np.arange(1000)}, timeout=T)
        with pytest.raises(TransportTimeout):
            curve_hub.recv(timeout=2)
        assert any("altered" in e.reason for e in curve_hub.events if e.kind == "refused")


def test_a_replayed_connection_is_refused(curve_hub, proxy, enrolment):
    with _through(proxy, enrolment) as ch:
        curve_hub.wait_for(1, timeout=T)
        ch.send({"v": np.arange(4)}, timeout=T)
        curve_hub.recv(timeout=T)
    assert until(lambda: curve_hub.clients == [])
    refused = sum(e.kind == "refused" for e in curve_hub.events)
    replay = socket.create_connection(("127.0.0.1", int(curve_hub.url.rsplit(":", 1)[1])))
    try:
        replay.sendall(bytes(proxy.seen["up"]))  # the client's side of the whole connection
        # the CURVE handshake fails: the hub's per-connection cookie key is not the old one
        assert until(lambda: sum(e.kind == "refused" for e in curve_hub.events) > refused)
        with pytest.raises(TransportTimeout):
            curve_hub.recv(timeout=1)
        assert curve_hub.clients == []
    finally:
        replay.close()


# -- the small-message path: who reads, what is copied --------------------------------------


def test_small_frames_are_copied_and_big_ones_shared_until_written(ctx):
    """Under pyzmq's copy threshold a frame is copied (no tracker to wait for); above it the
    caller's memory is shared and tracked, our own ``bytes`` shared untracked (immutable)."""
    from tensorwire.transports.zmq.pieces import COPY_BYTES
    from tensorwire.transports.zmq.sockets import queue_piece

    a, b = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR)
    port = a.bind_to_random_port("tcp://127.0.0.1")
    b.connect(f"tcp://127.0.0.1:{port}")
    assert a.poll(T * 1000, zmq.POLLOUT), "not connected"
    small = np.arange(100, dtype=np.uint8)
    big = np.ones(2 * COPY_BYTES, np.uint8)
    trackers: list = []
    assert queue_piece(a, [START + bytes(3), memoryview(small)], trackers)
    assert trackers == []
    small[:] = 7  # copied at the send: the change must not reach the wire
    assert queue_piece(a, [START, memoryview(big)], trackers)
    assert len(trackers) <= 1  # tracked, unless libzmq already wrote it
    assert queue_piece(a, [START, bytes(big)], trackers)
    assert len(trackers) <= 1  # bytes: never tracked
    got = [b"".join(b.recv_multipart()) for _ in range(3)]
    assert got[0] == START + bytes(3) + bytes(range(100))
    assert got[1] == got[2] == START + bytes(big)
    for tracker in trackers:
        tracker.wait(T)


def test_a_small_array_may_change_once_send_returned(hub):
    with tensorwire.connect(hub.url, client_id="s", codec=None) as ch:
        hub.wait_for(1, timeout=T)
        arr = np.arange(1000, dtype=np.float32)  # 4 KB: copied into the frame
        ch.send({"x": arr})
        arr[:] = -1
        hub.send("s", {"x": arr})
        arr[:] = -2
        assert np.array_equal(hub.recv(timeout=T)[1]["x"], np.arange(1000, dtype=np.float32))
        assert np.all(ch.recv(timeout=T)["x"] == -1)


def test_recv_reads_on_the_callers_thread_and_the_reader_takes_over_after(hub):
    """Back-to-back recv calls read the ROUTER themselves; once they stop, the reader thread
    serves joins and messages again (within CALLER_LINGER_S)."""
    from tensorwire.transports.zmq.hub import CALLER_LINGER_S

    a = tensorwire.connect(hub.url, client_id="a")
    try:
        hub.wait_for(1, timeout=T)
        on_thread: dict[str, int] = {}
        hub.on_join = lambda cid: on_thread.setdefault(cid, threading.get_ident())
        readers: list[int] = []
        handle = hub._on_message

        def noting_reader(*args):
            readers.append(threading.get_ident())
            return handle(*args)

        hub._on_message = noting_reader
        for i in range(20):
            a.send({"v": np.full(3, i)})
            client, msg = hub.recv(timeout=T)
            assert client == "a" and msg["v"][0] == i
            hub.send("a", msg.tensors)
            assert a.recv(timeout=T)["v"][0] == i
        # most on this thread (the reader thread may take one read before a recv wakes it, or
        # between two recv calls further apart than CALLER_LINGER_S on a loaded machine)
        assert readers.count(threading.get_ident()) >= 10
        b = tensorwire.connect(hub.url, client_id="b")  # nobody in recv: the thread reads
        try:
            t0 = time.monotonic()
            hub.wait_for(2, timeout=T)
            assert time.monotonic() - t0 < 2 + CALLER_LINGER_S
            assert until(lambda: "b" in on_thread)  # on_join runs just after the join
            assert on_thread["b"] == hub._io.ident
            b.send({"v": np.arange(2)})
            assert until(lambda: len(hub._inbox) == 1)  # read without a recv call
            assert hub.recv(timeout=0)[0] == "b"
        finally:
            b.close()
    finally:
        a.close()


def test_recv_with_timeout_zero_reads_what_arrived(hub):
    with tensorwire.connect(hub.url, client_id="z") as ch:
        hub.wait_for(1, timeout=T)
        with pytest.raises(TransportTimeout):
            hub.recv(timeout=0)
        ch.send({"v": np.arange(4)})
        got = []

        def poll() -> bool:  # never blocks: the message, once it is in, or TransportTimeout
            try:
                got.append(hub.recv(timeout=0))
            except TransportTimeout:
                return False
            return True

        assert until(poll)
        assert got[0][0] == "z"


def test_two_threads_in_recv_share_the_messages(hub):
    n = 200
    chans = [tensorwire.connect(hub.url, client_id=f"c{i}") for i in range(2)]
    try:
        hub.wait_for(2, timeout=T)
        got: list[list[tuple[str, int]]] = [[], []]

        def take(k: int) -> None:
            while True:
                try:
                    client, msg = hub.recv(timeout=2)
                except TransportTimeout:
                    return
                got[k].append((client, int(msg.meta["i"])))

        readers = [threading.Thread(target=take, args=(k,)) for k in range(2)]
        for t in readers:
            t.start()
        for i in range(n):
            for ch in chans:
                ch.send(None, {"i": i})
        for t in readers:
            t.join(3 * T)
        assert not any(t.is_alive() for t in readers)
        every = sorted(got[0] + got[1])
        assert every == sorted((f"c{k}", i) for k in range(2) for i in range(n))
    finally:
        for ch in chans:
            ch.close()


def test_a_reader_in_recv_is_woken_for_messages_while_other_threads_send(hub):
    """Sends from other threads use the ROUTER while a recv waits on its FD, and may take
    the FD's edge: the waiting recv must still see every message."""
    n = 300
    with tensorwire.connect(hub.url, client_id="echo") as ch:
        hub.wait_for(1, timeout=T)
        stop = threading.Event()

        def echo() -> None:  # the client answers every message
            while not stop.is_set():
                try:
                    msg = ch.recv(timeout=0.2)
                except TransportTimeout:
                    continue
                ch.send(None, msg.meta)

        def send_all() -> None:
            for i in range(n):
                hub.send("echo", None, {"i": i}, timeout=T)

        echoer = threading.Thread(target=echo)
        sender = threading.Thread(target=send_all)
        echoer.start()
        sender.start()
        try:
            seen = [int(hub.recv(timeout=T)[1].meta["i"]) for _ in range(n)]
        finally:
            stop.set()
            sender.join(T)
            echoer.join(T)
        assert seen == list(range(n))


def test_close_ends_a_recv_waiting_without_a_timeout():
    hub = tensorwire.serve("zmq+tcp://127.0.0.1:0")
    result: dict[str, object] = {}

    def wait() -> None:
        try:
            hub.recv()
        except Exception as exc:
            result["exc"] = exc

    t = threading.Thread(target=wait)
    t.start()
    until_inside(t, "recv")
    t0 = time.monotonic()
    hub.close()
    t.join(T)
    assert not t.is_alive() and isinstance(result.get("exc"), TransportTimeout)
    assert time.monotonic() - t0 < 5
    with pytest.raises(TransportTimeout):
        hub.recv(timeout=1)


def test_an_on_leave_that_raises_does_not_stop_the_hub(hub):
    def fail(cid: str, reason: str) -> None:
        raise RuntimeError("on_leave broke")

    hub.on_leave = fail
    gone = tensorwire.connect(hub.url, client_id="gone")
    hub.wait_for(1, timeout=T)
    gone._drop()  # no bye: the hub learns of it from its monitor
    assert until(lambda: hub.clients == [])
    with tensorwire.connect(hub.url, client_id="next") as ch:
        hub.wait_for(1, timeout=T)
        ch.send({"v": np.arange(2)})
        assert hub.recv(timeout=T)[0] == "next"
