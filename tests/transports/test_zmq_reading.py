"""zmq+tcp:// reading and copying: small frames copied and big ones shared until written, recv
reading the socket on the caller's thread and the reader thread taking over after, several
threads in recv or sending while one waits, close ending a recv, a raising on_leave."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from waiting import until, until_inside

zmq = pytest.importorskip("zmq", reason="pyzmq is not installed (extra 'zmq')")

from zmq_helpers import (  # noqa: E402
    T,
    fixture_ctx,  # noqa: F401  (a fixture: ctx)
    fixture_hub,  # noqa: F401  (a fixture: hub)
)

import tensorwire  # noqa: E402
from tensorwire.errors import TransportTimeout  # noqa: E402
from tensorwire.transports.zmq.pieces import START  # noqa: E402


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
