"""tcp:// reading turns: a ``hub.recv`` reads a single client's connection itself, and the
connection's reader thread serves everything else; deadlines with SO_RCVTIMEO on channels."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

import tensorwire
from tensorwire.errors import TransportTimeout
from tensorwire.transports.tcp.hub import CALLER_LINGER_S

T = 20.0


@pytest.fixture
def hub():
    with tensorwire.serve("tcp://127.0.0.1:0") as h:
        yield h


def _until(cond, timeout=T) -> bool:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


def _ready(hub, n=1) -> None:
    """``n`` clients joined, and their reader threads take turns: a ``recv`` that starts
    earlier reads through the inbox for the whole call (on_join runs first)."""
    hub.wait_for(n, timeout=T)
    assert _until(lambda: all(p.turns for p in list(hub._peers.values())))


def test_recv_reads_the_one_connection_itself(hub):
    """Ping-pong with one client: the messages are read by the thread in recv, in order,
    back-to-back ones included, and the reader thread stays out of the way."""
    with tensorwire.connect(hub.url, client_id="a") as ch:
        _ready(hub)
        read_by = []
        real = hub._read_for_caller

        def spy(*args):
            read_by.append(threading.current_thread().name)
            return real(*args)

        hub._read_for_caller = spy
        by_reader_thread = []  # the connection's reader thread hands messages over this way
        handed = hub._delivered
        hub._delivered = lambda cid, msg: (by_reader_thread.append(1), handed(cid, msg))
        for i in range(50):
            ch.send({"x": np.full(1024, i, np.float32)}, meta={"i": i})
            cid, msg = hub.recv(timeout=T)
            assert (cid, msg.meta["i"], float(msg["x"][0])) == ("a", i, i)
        for i in range(5):  # a burst: one recv may read several, the next ones are buffered
            ch.send({"x": np.arange(4)}, meta={"i": i})
        assert [hub.recv(timeout=T)[1].meta["i"] for _ in range(5)] == list(range(5))
        assert read_by and set(read_by) == {threading.current_thread().name}
        assert len(by_reader_thread) <= 3  # the first (sent before any recv), maybe a burst's


def test_gather_after_recv_is_served_by_the_reader_thread(hub):
    with tensorwire.connect(hub.url, client_id="a") as ch:
        _ready(hub)
        ch.send({"x": np.arange(3)})
        hub.recv(timeout=T)
        ch.send({"x": np.arange(4)})
        t = time.monotonic()
        got = list(hub.gather(timeout=T))  # no recv: the reader thread reads it
        assert [c for c, _ in got] == ["a"] and len(got[0][1]["x"]) == 4
        assert time.monotonic() - t < 5  # after at most the linger, not a timeout


def test_a_second_client_wakes_a_recv_reading_the_first(hub):
    """A recv reading client a's connection returns client b's message as soon as it comes."""
    with tensorwire.connect(hub.url, client_id="a"):
        _ready(hub)
        result = {}

        def receive():
            t = time.monotonic()
            result["got"] = hub.recv(timeout=T)
            result["s"] = time.monotonic() - t

        reader = threading.Thread(target=receive)
        reader.start()
        assert _until(lambda: hub._callers_reading == 1)
        with tensorwire.connect(hub.url, client_id="b") as b:
            b.send({"y": np.ones(5)})
            reader.join(timeout=T)
        assert not reader.is_alive()
        assert result["got"][0] == "b" and result["s"] < T / 2


def test_a_client_that_leaves_while_recv_reads_is_gone(hub):
    left = []
    hub.on_leave = lambda cid, reason: left.append(cid)
    ch = tensorwire.connect(hub.url, client_id="a")
    _ready(hub)
    errors = []

    def receive():
        try:
            hub.recv(timeout=1.0)
        except TransportTimeout as exc:
            errors.append(exc)

    reader = threading.Thread(target=receive)
    reader.start()
    assert _until(lambda: hub._callers_reading == 1)
    ch.close()
    reader.join(timeout=T)
    assert not reader.is_alive() and len(errors) == 1  # its deadline, not a hang
    assert _until(lambda: left == ["a"] and hub.clients == [])


def test_recv_deadline_with_one_quiet_client(hub):
    with tensorwire.connect(hub.url, client_id="a") as ch:
        _ready(hub)
        t = time.monotonic()
        with pytest.raises(TransportTimeout):
            hub.recv(timeout=0.3)
        assert 0.29 <= time.monotonic() - t < 3
        ch.send({"x": np.arange(2)})  # the partial state is fine: the next recv gets it
        assert hub.recv(timeout=T)[0] == "a"


def test_close_while_recv_reads(hub):
    ch = tensorwire.connect(hub.url, client_id="a")
    _ready(hub)
    errors = []

    def receive():
        try:
            hub.recv(timeout=T)
        except TransportTimeout as exc:
            errors.append(exc)

    reader = threading.Thread(target=receive)
    reader.start()
    assert _until(lambda: hub._callers_reading == 1)
    t = time.monotonic()
    hub.close()
    reader.join(timeout=T)
    assert not reader.is_alive() and len(errors) == 1 and time.monotonic() - t < T / 2
    ch.close()


@pytest.mark.parametrize("timeout", [0.02, 0.3])
def test_channel_recv_deadline(hub, timeout):
    """Short waits go to poll, longer ones block in recv under SO_RCVTIMEO; both end on time
    and leave the channel usable."""
    with tensorwire.connect(hub.url, client_id="a") as ch:
        _ready(hub)
        for _ in range(2):
            t = time.monotonic()
            with pytest.raises(TransportTimeout):
                ch.recv(timeout=timeout)
            assert timeout * 0.95 <= time.monotonic() - t < timeout + 2
        hub.send("a", {"x": np.arange(3)})
        assert list(ch.recv(timeout=T)["x"]) == [0, 1, 2]
        hub.send("a", {"x": np.arange(4)})
        assert list(ch.recv()["x"]) == [0, 1, 2, 3]  # no deadline after deadlines: blocks


def test_linger_is_bounded():
    assert 0 < CALLER_LINGER_S <= 0.1


def test_a_streams_sender_reads_its_acknowledgements_itself(hub):
    """hub.send_many reads the client's acknowledgements on its own thread (no hand-off per
    window); a data message the client sends mid-stream is kept, in order, for recv."""
    with tensorwire.connect(hub.url, client_id="a") as ch:
        _ready(hub)
        read_by = []
        real = hub._turn_read

        def spy(*args):
            read_by.append(threading.current_thread().name)
            return real(*args)

        hub._turn_read = spy  # reads in a turn: by recv or by a stream's sender
        got = []

        def consume() -> None:
            for batch in ch.stream(timeout=T):
                got.append(batch.seq)
                if batch.seq == 10:
                    ch.send({"x": np.arange(3)}, meta={"mid": 1})

        consumer = threading.Thread(target=consume)
        consumer.start()
        result = hub.send_many("a", ({"x": np.full(256, i)} for i in range(64)), window=4)
        consumer.join(timeout=T)
        assert result.batches == 64 and got == list(range(64))
        assert read_by and set(read_by) == {threading.current_thread().name}
        cid, msg = hub.recv(timeout=T)
        assert (cid, msg.meta) == ("a", {"mid": 1})
        np.testing.assert_array_equal(msg["x"], np.arange(3))


def test_a_stream_whose_client_stops_reading_times_out_and_the_client_stays(hub):
    with tensorwire.connect(hub.url, client_id="a") as ch:
        _ready(hub)
        with pytest.raises(TransportTimeout):
            hub.send_many("a", ({"x": np.zeros(16)} for _ in range(20)), window=2, timeout=0.5)
        assert hub.clients == ["a"]
        ch.send({"x": np.ones(2)})
        assert hub.recv(timeout=T)[0] == "a"
