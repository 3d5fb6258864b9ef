"""A flow's sending window: one message at a time per caller, cut into chunks and sent as
paced datagrams, then ``sent``; reliable messages wait for the peer's ``ack`` or ``nack`` and
resend what a NACK lists, until the ack."""

from __future__ import annotations

import contextlib
import threading
from collections import deque
from dataclasses import dataclass
from typing import Any

import numpy as np

from tensorwire.errors import MalformedHeader, PeerGone, TransportTimeout
from tensorwire.transports.base import deadline_after, remaining
from tensorwire.transports.udp.flow_base import FlowBase
from tensorwire.transports.udp.pacing import TokenBucket
from tensorwire.transports.udp.secure import SEAL_OVERHEAD
from tensorwire.transports.udp.sockets import send_datagram
from tensorwire.wire import EncodedMessage, Message, iter_chunks, new_message_id

FEEDBACK_TIMEOUT = 60.0  # seconds a reliable sender waits for an answer to ``sent``
MAX_STALLED_ROUNDS = 30  # NACK rounds in a row that recover nothing before giving up
HEAVY_LOSS = 0.05  # a round losing more than this fraction paces its resends to the receiver
PACE_HEADROOM = 1.25  # resends go this much faster than the receiver last managed
MIN_PACE = 125_000.0  # bytes/s: floor of the receiver-reported rate resends are paced to


@dataclass
class Feedback:
    """The receiver's answer to a ``sent``: ``ack``, or ``nack`` with what it misses."""

    acked: bool
    ranges: np.ndarray | None = None  # (k, 2) int64 [start, stop) chunk indices
    rate: float | None = None  # bytes/s the receiver got the last round at


class _Outgoing:
    """A reliable message of ``count`` chunks waiting for its receiver's answers."""

    def __init__(self, count: int) -> None:
        self.count = count
        self._cond = threading.Condition()
        self._feedback: deque[Feedback] = deque()
        self._error: Exception | None = None

    def post(self, fb: Feedback) -> None:
        with self._cond:
            self._feedback.append(fb)
            self._cond.notify_all()

    def fail(self, exc: Exception) -> None:
        with self._cond:
            self._error = exc
            self._cond.notify_all()

    def wait(self, deadline: float | None, peer: str) -> Feedback:
        limit = deadline_after(FEEDBACK_TIMEOUT)
        assert limit is not None
        until = limit if deadline is None else min(deadline, limit)
        with self._cond:
            while not self._feedback:
                if self._error is not None:
                    raise self._error
                left = remaining(until)
                if not left:
                    if until == deadline:
                        raise TransportTimeout(f"{peer} did not acknowledge the message in time")
                    raise TransportTimeout(
                        f"{peer} did not answer for {FEEDBACK_TIMEOUT} s; is its process stuck?"
                    )
                self._cond.wait(left)
            return self._feedback.popleft()


def nack_ranges(msg: Message, count: int) -> np.ndarray:
    ranges = msg.tensors.get("ranges")
    if (
        not isinstance(ranges, np.ndarray)
        or ranges.dtype.kind not in "iu"
        or ranges.ndim != 2
        or ranges.shape[1] != 2
    ):
        raise MalformedHeader("control message 'nack' needs a (k, 2) integer tensor 'ranges'")
    ranges = ranges.astype(np.int64)
    if len(ranges) and (
        (ranges[:, 0] < 0).any()
        or (ranges[:, 1] > count).any()
        or (ranges[:, 0] >= ranges[:, 1]).any()
    ):
        raise MalformedHeader(f"control message 'nack' lists chunks outside [0, {count})")
    return ranges


class FlowSending(FlowBase):
    """The sending half of a flow: :meth:`send_message` runs in the caller's thread; the
    peer's answers come from the I/O thread (``Flow.on_control``) through ``_outgoing``."""

    chunk_payload: int
    closed: bool
    _outgoing: dict[int, _Outgoing]
    _out_lock: threading.Lock
    _bucket: TokenBucket | None
    _why: str

    def _init_sending(self) -> None:
        """Set up the sending state (once, by the flow's constructor)."""
        # message bytes per datagram: the mtu less the chunk header and the seal, if any
        self.chunk_payload = self.options.chunk_payload - (SEAL_OVERHEAD if self.seal else 0)
        self._outgoing = {}
        self._out_lock = threading.Lock()
        self._bucket = (
            TokenBucket(self.options.rate / 8, 2 * self.options.mtu)
            if self.options.rate is not None
            else None
        )
        self.closed = False
        self._why = f"{self.label} is not connected"  # what sends raise once closed

    def send_message(self, enc: EncodedMessage, deadline: float | None) -> None:
        """Send one encoded message to the peer (reliable: until it has all of it). A send
        that fails part way (its deadline, say) tells the peer to drop what it got."""
        mid = new_message_id()
        pending = _Outgoing(max(-(-enc.nbytes // self.chunk_payload), 1))
        with self._out_lock:
            if self.closed:
                raise PeerGone(self._why)
            self._outgoing[mid] = pending
        try:
            if self.reliable:
                self._send_reliable(enc, mid, pending, deadline)
            else:
                self._send_best_effort(enc, mid, deadline)
        except TransportTimeout:
            self._say("drop", {"id": mid})
            raise
        finally:
            with self._out_lock:
                del self._outgoing[mid]

    def _send_datagram(self, parts: list[Any], pacer: TokenBucket | None, deadline: Any) -> None:
        if self.seal is not None:
            parts = self.seal.seal(parts)
        if pacer is not None:
            pacer.take(sum(len(p) for p in parts), deadline)
        send_datagram(self.udp, parts, self.address, deadline)

    def _send_ranges(
        self, chunks: list[list[Any]], ranges: np.ndarray, pacer: TokenBucket | None, deadline: Any
    ) -> int:
        """Send the chunks in the ``[start, stop)`` index ranges; return how many."""
        sent = 0
        for start, stop in ranges.tolist():
            for i in range(start, stop):
                self._send_datagram(chunks[i], pacer, deadline)
            sent += stop - start
        return sent

    def _send_best_effort(self, enc: EncodedMessage, mid: int, deadline: float | None) -> None:
        payload = self.chunk_payload
        head_chunks = -(-len(enc.head) // payload)
        head: list[bytes] = []
        count = 0
        for parts in iter_chunks(enc.frames(), mid, payload):
            self._send_datagram(parts, self._bucket, deadline)
            if count < head_chunks:
                head.append(b"".join(parts))
            count += 1
        self.stats.add(datagrams_sent=count)
        # The chunks holding the prefix and header go again with ``sent``, over TCP: without
        # them no tensor can be placed, so only tensor bytes are ever lost (a second datagram
        # copy still lost ~12 % of whole updates at 20 % loss).
        sizes = np.array([len(c) for c in head], np.int64)
        chunks = np.frombuffer(b"".join(head), np.uint8)
        # Its datagrams are out: a peer that took them and left (or not) is the next send's.
        with contextlib.suppress(PeerGone):
            self.send_control(
                "sent", {"id": mid, "count": count}, {"head_chunks": chunks, "head_sizes": sizes}
            )

    def _send_reliable(
        self, enc: EncodedMessage, mid: int, pending: _Outgoing, deadline: float | None
    ) -> None:
        payload = self.chunk_payload
        count = pending.count
        # Kept for resends; built while the first round goes out, so sending starts at once.
        chunks: list[list[Any]] = []
        for parts in iter_chunks(enc.frames(), mid, payload):
            self._send_datagram(parts, self._bucket, deadline)
            chunks.append(parts)
        sent = count
        pacer = self._bucket
        best, stalled = count + 1, 0
        while True:
            self.stats.add(datagrams_sent=sent)
            # A peer that has it all may be gone already: its ack, or the flow's end, decides.
            with contextlib.suppress(PeerGone):
                self.send_control("sent", {"id": mid, "count": count})
            fb = pending.wait(deadline, self.label)
            if fb.acked:
                return
            assert fb.ranges is not None
            todo = fb.ranges
            missing = int((todo[:, 1] - todo[:, 0]).sum())
            stalled = 0 if missing < best else stalled + 1
            best = min(best, missing)
            if stalled >= MAX_STALLED_ROUNDS:
                raise TransportTimeout(
                    f"{MAX_STALLED_ROUNDS} rounds of resending brought no datagram to "
                    f"{self.label}: is UDP blocked on the path, or the mtu larger than "
                    "the path allows?"
                )
            if self._bucket is None and fb.rate is not None and missing > HEAVY_LOSS * sent:
                # The receiver (or its socket buffer) could not keep up: resend at about
                # its pace, a little faster so the rate can recover.
                pace = max(fb.rate * PACE_HEADROOM, MIN_PACE)
                pacer = TokenBucket(pace, 2 * self.options.mtu)
            self.stats.add(retransmits=missing, nack_rounds=1)
            sent = self._send_ranges(chunks, todo, pacer, deadline)

    def close(self, reason: Exception) -> None:
        """Fail the sends waiting for this peer, and any later one, with ``PeerGone`` saying
        ``reason`` (thread-safe; incoming messages are the I/O thread's to flush)."""
        with self._out_lock:
            self.closed = True
            self._why = str(reason)
            waiting = list(self._outgoing.values())
        for out in waiting:  # each its own: one exception raised in many threads tangles
            out.fail(PeerGone(self._why))
