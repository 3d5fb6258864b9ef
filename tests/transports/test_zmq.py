"""zmq+tcp:// beyond the conformance suite: zero-copy send semantics, framing recovery,
connection loss, reconnect takeover, thread use."""

from __future__ import annotations

import importlib.util
import threading
import time
from pathlib import Path

import numpy as np
import pytest

zmq = pytest.importorskip("zmq", reason="pyzmq is not installed (extra 'zmq')")

import tensorwire  # noqa: E402
from tensorwire.errors import ChecksumMismatch, PeerGone, TruncatedMessage, WireError  # noqa: E402
from tensorwire.transports.zmq import MORE, START, _batches, _frames  # noqa: E402
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


def _until(cond, timeout=T) -> bool:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def _send_raw(sock, enc) -> None:
    for i, batch in enumerate(_batches(enc)):
        sock.send_multipart(_frames(START if i == 0 else MORE, batch))


def _recv_raw(sock):
    assert sock.poll(T * 1000), "no answer"
    frames = sock.recv_multipart()
    assert frames[0][:1] == START
    return decode_message(b"".join([frames[0][1:], *frames[1:]]))


def _raw_client(ctx, hub, ident: bytes, hello: bool = True):
    sock = ctx.socket(zmq.DEALER)
    sock.identity = ident
    sock.connect(hub.url.removeprefix("zmq+"))
    if hello:
        meta = {"client_id": ident.decode(), "decoders": []}
        _send_raw(sock, encode_message(None, meta, kind="hello"))
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
        assert _until(lambda: len(hub.errors) >= 2)
        assert all(isinstance(e, WireError) for _, e in hub.errors)
        hub.send("good", {"v": np.arange(3)})
        assert np.array_equal(good.recv(timeout=T)["v"], np.arange(3))
    finally:
        good.close()


def test_a_bad_message_is_dropped_and_the_next_one_from_that_client_delivered(hub, ctx):
    sock = _raw_client(ctx, hub, b"raw")
    hub.wait_for(1, timeout=T)
    data = np.arange(1 << 18, dtype=np.float64)  # 2 MiB: the message spans several pieces
    corrupt = bytearray(encode_message({"x": data}).to_bytes())
    corrupt[len(corrupt) // 2] ^= 0xFF
    sock.send_multipart([START, bytes(corrupt)])
    whole = encode_message({"x": data}).to_bytes()
    sock.send_multipart([START, whole[:1000]])  # cut short by the next START
    _send_raw(sock, encode_message({"x": data}, {"n": 3}))
    client, msg = hub.recv(timeout=T)
    assert client == "raw" and msg.meta == {"n": 3} and np.array_equal(msg["x"], data)
    kinds = [type(e) for _, e in hub.errors]
    assert kinds == [ChecksumMismatch, TruncatedMessage]


def test_data_without_a_hello_is_answered_with_bye(hub, ctx):
    sock = _raw_client(ctx, hub, b"stranger", hello=False)
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
    assert fake.poll(T * 1000)
    ident = fake.recv_multipart()[0]
    welcome = encode_message(None, {"decoders": []}, kind="welcome")
    fake.send_multipart([ident, START, welcome.to_bytes()])
    time.sleep(0.2)  # let the client get into recv
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
        time.sleep(0.2)  # the waiter is in poll
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
