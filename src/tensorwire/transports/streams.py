"""Streams: many messages one way, with a window of messages in flight, on every transport.

A stream is an ordinary sequence of messages whose metadata carries the stream's id and the
message's place in it; the receiver acknowledges what it has *consumed* (taken out of the
iterator), and the sender keeps at most ``window`` messages unacknowledged. So a receiver
that stops consuming stops the sender (backpressure, on brokers as on sockets), and a
stream's memory on either side is bounded by the window, whatever the transport buffers.

Metadata (``docs/session.md`` reserves the ``tw.`` prefix)::

    data: meta["tw.stream"] = [stream_id, seq, window, sent_at]   # seq = 0, 1, ...
    end:  meta["tw.stream"] = [stream_id, -1, count, sent_at]     # no tensors
    ack:  meta["tw.ack"]    = [stream_id, consumed]               # receiver -> sender

``sent_at`` is the sender's ``time.monotonic()``: on one host, the receiver's clock minus it
is the batch's latency (``StreamBatch.latency``); across hosts it means nothing.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from tensorwire.errors import TransportError, TransportTimeout, WireError
from tensorwire.wire import Message

STREAM_KEY = "tw.stream"
ACK_KEY = "tw.ack"
DEFAULT_WINDOW = 16
PIPELINE_BYTES = 1 << 20
"""Most bytes of a stream's messages started and not yet waited for, on a transport that
queues sends for a writer thread (flight's hub). With 128 KiB messages, queueing up to 1 MiB
made flight streams 15-20% faster; with 2 MiB messages, queueing even one more made them
slower (the receiver spent more CPU per batch), so big messages are not queued at all."""


class StreamError(TransportError):
    """A stream's messages came out of order or its end did not match what was sent."""


@dataclass
class StreamResult:
    """What a sender's :meth:`send_many` did: batches and bytes sent, wall seconds until the
    receiver had consumed the last one, and one transfer record per batch."""

    stream: str
    batches: int = 0
    bytes: int = 0
    seconds: float = 0.0
    records: list[Any] = field(default_factory=list)

    @property
    def mb_per_s(self) -> float:
        return self.bytes / self.seconds / 1e6 if self.seconds else 0.0

    @property
    def batches_per_s(self) -> float:
        return self.batches / self.seconds if self.seconds else 0.0


@dataclass
class StreamBatch:
    """One message of a stream as the receiver sees it."""

    message: Message
    seq: int
    latency: float  # seconds from the sender's send to this side's receipt (same host only)


def new_stream_id() -> str:
    return os.urandom(6).hex()


def stream_fields(meta: Mapping[str, Any] | None) -> list[Any] | None:
    """The ``tw.stream`` field of a message's metadata, if it is a well-formed one."""
    if not meta:
        return None
    value = meta.get(STREAM_KEY)
    if (
        isinstance(value, list)
        and len(value) == 4
        and isinstance(value[0], str)
        and isinstance(value[1], int)
        and isinstance(value[2], int)
        and isinstance(value[3], float)
    ):
        return value
    return None


def ack_fields(meta: Mapping[str, Any] | None) -> tuple[str, int] | None:
    """``(stream_id, consumed)`` if ``meta`` is an acknowledgement."""
    if not meta:
        return None
    value = meta.get(ACK_KEY)
    if (
        isinstance(value, list)
        and len(value) == 2
        and isinstance(value[0], str)
        and isinstance(value[1], int)
    ):
        return value[0], value[1]
    return None


class AckBook:
    """Acknowledgements that arrived, per (peer, stream), for senders waiting on a window."""

    MAX_STREAMS = 1024  # acks for streams nobody sends are forgotten past this many

    def __init__(self) -> None:
        self._acked: dict[tuple[str, str], int] = {}
        self._cond = threading.Condition()

    def note(self, peer: str, stream: str, consumed: int) -> None:
        with self._cond:
            key = (peer, stream)
            if key not in self._acked and len(self._acked) >= self.MAX_STREAMS:
                self._acked.pop(next(iter(self._acked)))
            self._acked[key] = max(consumed, self._acked.get(key, 0))
            self._cond.notify_all()

    def acked(self, peer: str, stream: str) -> int:
        return self._acked.get((peer, stream), 0)  # one dict lookup: atomic, no lock

    def wait(self, peer: str, stream: str, at_least: int, deadline: float | None) -> bool:
        """Wait until ``at_least`` are acknowledged; False at the deadline."""
        with self._cond:
            while self._acked.get((peer, stream), 0) < at_least:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._cond.wait(left if left is None else min(left, 0.05))
            return True

    def forget(self, peer: str, stream: str) -> None:
        with self._cond:
            self._acked.pop((peer, stream), None)


def send_stream(
    send: Callable[[Mapping[str, Any] | None, Mapping[str, Any]], tuple[int, Callable[[], Any]]],
    wait_acked: Callable[[str, int, float | None], bool],
    batches: Iterable[Any],
    *,
    window: int,
    timeout: float | None,
    peer: str,
) -> StreamResult:
    """Send ``batches`` (mappings of tensors, or ``(tensors, meta)`` pairs) as one stream.

    ``send(tensors, meta)`` starts sending one message and returns its size in bytes and a
    call that waits until it is sent and returns its record. A transport that queues sends
    for a writer thread returns before the write, so its writer writes queued messages back to
    back while this thread encodes the next, instead of the two threads taking turns per
    message; up to :data:`PIPELINE_BYTES` (and ``window`` messages) are queued so.
    ``wait_acked(stream, n, deadline)`` waits until the receiver has consumed ``n``.
    ``timeout`` bounds each wait for the window to open (and the last wait for the end to
    be consumed).
    """
    if window < 1:
        raise ValueError(f"window must be at least 1, not {window}")
    sid = new_stream_id()
    result = StreamResult(stream=sid)
    started = time.perf_counter()
    pending: deque[tuple[int, Callable[[], Any]]] = deque()  # started, not waited for
    queued = 0  # their bytes

    def settle(budget: int) -> None:
        nonlocal queued
        while pending and (queued > budget or len(pending) > window):
            nbytes, wait = pending.popleft()
            queued -= nbytes
            record = wait()
            result.records.append(record)
            result.bytes += int(getattr(record, "bytes_encoded", 0) or 0)

    seq = 0
    for item in batches:
        tensors, meta = item if isinstance(item, tuple) else (item, None)
        if seq >= window and not wait_acked(sid, seq - window + 1, _deadline(timeout)):
            raise TransportTimeout(
                f"{peer} consumed nothing of stream {sid} for {timeout} s "
                f"({seq} sent, window {window})"
            )
        fields = [sid, seq, window, time.monotonic()]
        nbytes, wait = send(tensors, {**(meta or {}), STREAM_KEY: fields})
        pending.append((nbytes, wait))
        queued += nbytes
        settle(PIPELINE_BYTES)
        seq += 1
    settle(-1)  # every batch written, its error (if any) raised
    send(None, {STREAM_KEY: [sid, -1, seq, time.monotonic()]})[1]()
    if not wait_acked(sid, seq + 1, _deadline(timeout)):
        raise TransportTimeout(f"{peer} did not finish consuming stream {sid} in {timeout} s")
    result.batches = seq
    result.seconds = time.perf_counter() - started
    return result


def receive_stream(
    next_message: Callable[[float | None, str | None], Message],
    send_ack: Callable[[str, int], None],
    *,
    timeout: float | None,
) -> Iterator[StreamBatch]:
    """Yield the batches of the next stream that ``next_message(deadline, stream)`` brings
    (``stream`` is None until the first batch names it), acknowledging as they are consumed;
    stop at its end. Raises :class:`StreamError` if a batch is missing or the count differs.
    """
    sid: str | None = None
    expected = 0
    acked = 0
    every = 1
    while True:
        msg = next_message(_deadline(timeout), sid)
        fields = stream_fields(msg.meta)
        if fields is None:
            raise WireError("a message without stream metadata reached a stream")
        now = time.monotonic()
        this_sid, seq, third, sent_at = fields
        sid = this_sid
        if seq == -1:
            if third != expected:
                raise StreamError(f"stream {sid} ended after {third} batches, {expected} arrived")
            send_ack(sid, expected + 1)
            return
        if seq != expected:
            raise StreamError(f"stream {sid}: batch {seq} arrived where {expected} was due")
        every = max(1, math.ceil(max(1, third) / 2))
        yield StreamBatch(message=msg, seq=seq, latency=max(0.0, now - sent_at))
        expected += 1
        if expected - acked >= every:
            send_ack(sid, expected)
            acked = expected


def _deadline(timeout: float | None) -> float | None:
    return None if timeout is None else time.monotonic() + timeout
