"""Streams on every scheme: send_many / stream both ways, a window that holds back a sender
whose receiver stops consuming, a receiver that dies or lies, messages that are not part of
the stream left for recv."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest

from tensorwire.errors import PeerGone, TransportTimeout
from tensorwire.transports.streams import PIPELINE_BYTES, STREAM_KEY, StreamError, send_stream

T = 30.0


def _batches(n: int, size: int = 1024):
    for i in range(n):
        yield {"x": np.full(size, i, dtype=np.float32)}


def test_a_stream_arrives_whole_and_in_order_both_ways(make_hub, connect):
    hub = make_hub(codec=None)
    ch = connect(hub.url, client_id="s1", codec=None)
    hub.wait_for(1, timeout=T)
    got: list[float] = []
    latencies: list[float] = []

    def consume() -> None:
        for batch in hub.stream("s1", timeout=T):
            got.append(float(batch.message["x"][0]))
            latencies.append(batch.latency)

    reader = threading.Thread(target=consume)
    reader.start()
    result = ch.send_many(_batches(50), window=4, timeout=T)
    reader.join(T)
    assert got == [float(i) for i in range(50)]
    assert result.batches == 50 and result.bytes >= 50 * 4096 and result.mb_per_s > 0
    assert all(0 <= lat < T for lat in latencies)

    back: list[float] = []

    def consume_back() -> None:
        for batch in ch.stream(timeout=T):
            back.append(float(batch.message["x"][1]))

    reader = threading.Thread(target=consume_back)
    reader.start()
    result = hub.send_many("s1", _batches(20, 16), window=3, timeout=T)
    reader.join(T)
    assert back == [float(i) for i in range(20)] and result.batches == 20


def test_a_receiver_that_stops_consuming_holds_the_sender_at_its_window(make_hub, connect):
    hub = make_hub(codec=None)
    ch = connect(hub.url, client_id="s2", codec=None)
    hub.wait_for(1, timeout=T)
    it = hub.stream("s2", timeout=T)
    sent = []

    def batches():
        for i in range(100):
            sent.append(i)
            yield {"x": np.full(8, i, dtype=np.float32)}

    err: list[BaseException] = []

    def send() -> None:
        try:
            ch.send_many(batches(), window=5, timeout=2.0)
        except BaseException as exc:
            err.append(exc)

    sender = threading.Thread(target=send)
    sender.start()
    first = next(it)  # consume one, then stop
    assert first.seq == 0
    sender.join(T)
    assert err and isinstance(err[0], TransportTimeout)
    # five went out; the sixth was taken from the iterator and waited for room until timeout
    assert len(sent) == 6


def test_other_messages_stay_for_recv(make_hub, connect):
    hub = make_hub(codec=None)
    ch = connect(hub.url, client_id="s3", codec=None)
    hub.wait_for(1, timeout=T)
    ch.send({"plain": np.arange(3)}, timeout=T)

    def consume() -> None:
        list(hub.stream("s3", timeout=T))

    reader = threading.Thread(target=consume)
    reader.start()
    ch.send_many(_batches(5), window=2, timeout=T)
    reader.join(T)
    cid, msg = hub.recv(timeout=T)
    assert cid == "s3" and np.array_equal(msg["plain"], np.arange(3))
    # a message the hub sends while the channel streams is kept for the channel's recv
    hub.send("s3", {"note": np.arange(2)}, timeout=T)
    reader = threading.Thread(target=lambda: list(hub.stream("s3", timeout=T)))
    reader.start()
    time.sleep(0.2)
    ch.send_many(_batches(5), window=2, timeout=T)
    reader.join(T)
    assert np.array_equal(ch.recv(timeout=T)["note"], np.arange(2))


def test_a_sender_that_dies_mid_stream_ends_the_receiver_with_an_error(make_hub, connect):
    hub = make_hub(codec=None)
    ch = connect(hub.url, client_id="s4", codec=None)
    hub.wait_for(1, timeout=T)
    ch.send({"x": np.zeros(4)}, meta={STREAM_KEY: ["abc", 0, 4, time.monotonic()]}, timeout=T)
    it = hub.stream("s4", timeout=5.0)
    assert next(it).seq == 0
    ch.close()
    with pytest.raises((PeerGone, TransportTimeout)):
        next(it)


def test_a_lying_sender_gets_a_stream_error_not_a_hang(make_hub, connect):
    hub = make_hub(codec=None)
    ch = connect(hub.url, client_id="s5", codec=None)
    hub.wait_for(1, timeout=T)
    now = time.monotonic()
    ch.send({"x": np.zeros(4)}, meta={STREAM_KEY: ["abc", 0, 4, now]}, timeout=T)
    ch.send({"x": np.zeros(4)}, meta={STREAM_KEY: ["abc", 5, 4, now]}, timeout=T)  # a gap
    it = hub.stream("s5", timeout=5.0)
    next(it)
    with pytest.raises(StreamError, match="batch 5 arrived where 1 was due"):
        next(it)
    # an end that claims more than came
    ch.send({"x": np.zeros(4)}, meta={STREAM_KEY: ["def", 0, 4, now]}, timeout=T)
    ch.send(None, meta={STREAM_KEY: ["def", -1, 9, now]}, timeout=T)
    it = hub.stream("s5", timeout=5.0)
    next(it)
    with pytest.raises(StreamError, match="ended after 9"):
        next(it)


def test_a_hub_stream_holds_at_its_window_and_counts_what_it_sent(make_hub, connect):
    hub = make_hub(codec=None)
    ch = connect(hub.url, client_id="s6", codec=None)
    hub.wait_for(1, timeout=T)
    # whole: every batch's record, in order, and the bytes they add up to
    reader = threading.Thread(target=lambda: list(ch.stream(timeout=T)))
    reader.start()
    result = hub.send_many("s6", _batches(30, 256), window=4, timeout=T)
    reader.join(T)
    assert result.batches == 30 and len(result.records) == 30
    assert result.bytes == sum(r.bytes_encoded for r in result.records) >= 30 * 1024
    # a channel that stops consuming stops the hub at the window, with a timeout
    it = ch.stream(timeout=T)
    sent: list[int] = []

    def batches():
        for i in range(100):
            sent.append(i)
            yield {"x": np.full(8, i, dtype=np.float32)}

    err: list[BaseException] = []

    def send() -> None:
        try:
            hub.send_many("s6", batches(), window=5, timeout=1.0)
        except BaseException as exc:
            err.append(exc)

    sender = threading.Thread(target=send)
    sender.start()
    assert next(it).seq == 0
    sender.join(T)
    assert err and isinstance(err[0], TransportTimeout), err
    assert len(sent) == 6


def test_a_hub_streaming_to_a_client_that_leaves_gets_an_error_not_a_hang(make_hub, connect):
    hub = make_hub(codec=None)
    ch = connect(hub.url, client_id="s7", codec=None)
    hub.wait_for(1, timeout=T)
    it = ch.stream(timeout=T)
    err: list[BaseException] = []

    def send() -> None:
        try:
            hub.send_many("s7", _batches(1000, 4096), window=8, timeout=10.0)
        except BaseException as exc:
            err.append(exc)

    sender = threading.Thread(target=send)
    sender.start()
    assert next(it).seq == 0
    ch.close()
    sender.join(T)
    assert not sender.is_alive()
    assert err and isinstance(err[0], (PeerGone, TransportTimeout)), err


@pytest.mark.parametrize("size", [PIPELINE_BYTES // 4, 2 * PIPELINE_BYTES])
def test_a_stream_queues_sends_up_to_its_byte_budget_and_raises_what_a_queued_send_raised(size):
    events: list[tuple[str, int]] = []
    fail_at = 9

    def send(tensors, meta):
        seq = meta[STREAM_KEY][1]
        events.append(("start", seq))

        def wait():
            events.append(("wait", seq))
            if seq == fail_at:
                raise PeerGone("the writer found the client gone")
            return SimpleNamespace(bytes_encoded=size)

        return size, wait

    with pytest.raises(PeerGone, match="found the client gone"):
        send_stream(
            send,
            lambda sid, n, d: True,
            ({"x": i} for i in range(20)),
            window=16,
            timeout=T,
            peer="test",
        )
    outstanding = most = 0
    for what, _ in events:
        outstanding += 1 if what == "start" else -1
        most = max(most, outstanding)
    # small messages: up to the budget queued (and the one being written); big ones: none
    assert most == (5 if size < PIPELINE_BYTES else 1), events
    waited = [seq for what, seq in events if what == "wait"]
    assert waited == sorted(waited) and waited[-1] == fail_at  # in order, up to the failure
