"""One peer of a udp:// endpoint: its messages' datagrams in both directions, and the
control messages about them.

Sending: a message is encoded once and cut into chunks (``iter_chunks``), one datagram each,
paced by the link's token bucket; then a ``sent`` control message says the sender is done.

- ``reliable``: the receiver answers ``sent`` with ``nack`` (the missing chunk indices as
  ranges, from ``ChunkReassembler.missing_ranges``, and the rate it received at) or, once it has
  every chunk, ``ack``. The sender resends what a NACK lists and says ``sent`` again, until
  the ack. Both go over TCP, so no timer is needed to detect a lost NACK; the only waits
  are the caller's deadline and a bound on an unanswered peer.
- ``best-effort``: no tensor byte is resent. ``sent`` also carries the chunks that hold the
  message's prefix and header (over TCP), so a message is never lost whole. The receiver
  decodes what arrived one grace period (two control-link RTTs) after ``sent``, or after an
  idle timeout if ``sent`` never comes (a long one while the header is still missing).

Receiving runs in the endpoint's I/O thread; each message has its own ``ChunkReassembler``
so finishing one (complete, partial or dropped) never touches another.
"""

from __future__ import annotations

import logging
import struct
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tensorwire.codecs import get_codec
from tensorwire.errors import (
    MalformedHeader,
    PeerGone,
    TransportError,
    TransportTimeout,
    TruncatedMessage,
    WireError,
)
from tensorwire.transports.base import deadline_after, remaining
from tensorwire.transports.stream_socket import send_encoded
from tensorwire.transports.udp.options import UdpOptions
from tensorwire.transports.udp.pacing import TokenBucket
from tensorwire.transports.udp.sockets import ControlReader, control_rtt, send_datagram
from tensorwire.wire import (
    CHUNK_HEADER_SIZE,
    ChunkReassembler,
    EncodedMessage,
    Limits,
    Message,
    encode_message,
    iter_chunks,
    new_message_id,
    parse_chunk,
)
from tensorwire.wire.format import PREFIX, PREFIX_SIZE
from tensorwire.wire.partial import decode_partial
from tensorwire.wire.tensors import TensorPath, flatten

log = logging.getLogger("tensorwire.transports.udp")

CONTROL_SEND_TIMEOUT = 10.0  # seconds a control message may take to be written
FEEDBACK_TIMEOUT = 60.0  # seconds a reliable sender waits for an answer to ``sent``
MAX_STALLED_ROUNDS = 30  # NACK rounds in a row that recover nothing before giving up
MAX_NACK_RANGES = 1 << 16  # ranges per NACK (bounds a control message); the rest next round
MAX_INCOMING = 16  # messages per peer being reassembled at once; a new one evicts the oldest
FINISHED_MEMORY = 4096  # ids of finished messages remembered, to drop their late datagrams
RELIABLE_IDLE = 120.0  # seconds a reliable message may get no datagram before it is dropped
IDLE_FLOOR = 1.0  # seconds: best-effort idle timeout at least (thread scheduling hiccups)
IDLE_RTTS = 64  # best-effort idle timeout in RTTs / datagram times, when that is longer
HEAVY_LOSS = 0.05  # a round losing more than this fraction paces its resends to the receiver
PACE_HEADROOM = 1.25  # resends go this much faster than the receiver last managed
MIN_PACE = 125_000.0  # bytes/s: floor of the receiver-reported rate resends are paced to
RATE_SAMPLE = 16  # datagrams a round needs before its receive rate is reported
_MESSAGE_ID = struct.Struct("<Q")  # at offset 8 of a chunk header


@dataclass
class UdpStats:
    """Counters of one endpoint (all its peers), since it opened."""

    datagrams_sent: int = 0
    retransmits: int = 0  # datagrams sent again because a NACK listed them
    nack_rounds: int = 0  # NACKs a reliable sender acted on
    partial_messages: int = 0  # best-effort messages delivered with lost ranges
    lost_messages: int = 0  # best-effort messages whose header (or everything) was lost
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, **counts: int) -> None:
        with self._lock:
            for name, n in counts.items():
                setattr(self, name, getattr(self, name) + n)


@dataclass
class Received:
    """A message a peer sent: whole (``missing`` empty) or with lost byte ranges
    (``(offset, length)``, best-effort); ``first_at`` is ``time.perf_counter()`` at its
    first datagram."""

    message_id: int
    data: np.ndarray
    missing: list[tuple[int, int]]
    first_at: float


class _Incoming:
    """A message being reassembled, and what this round of it looked like."""

    __slots__ = (
        "finalize_at",
        "first_at",
        "last_at",
        "reassembler",
        "round_bytes",
        "round_first",
        "round_n",
    )

    def __init__(self, reassembler: ChunkReassembler, now: float) -> None:
        self.reassembler = reassembler
        self.first_at = now
        self.last_at = now
        self.finalize_at: float | None = None
        self.round_bytes = 0
        self.round_first = now
        self.round_n = 0

    def note(self, nbytes: int, now: float) -> None:
        if not self.round_n:
            self.round_first = now
        self.round_bytes += nbytes
        self.round_n += 1
        self.last_at = now

    def take_round_rate(self) -> float | None:
        """Bytes/s received since the last NACK (None if too few datagrams); resets."""
        rate = None
        if self.round_n >= RATE_SAMPLE and self.last_at > self.round_first:
            rate = self.round_bytes / (self.last_at - self.round_first)
        self.round_bytes = self.round_n = 0
        return rate


@dataclass
class _Feedback:
    acked: bool
    ranges: np.ndarray | None = None  # (k, 2) int64 [start, stop) chunk indices
    rate: float | None = None  # bytes/s the receiver got the last round at


class _Outgoing:
    """A reliable message of ``count`` chunks waiting for its receiver's answers."""

    def __init__(self, count: int) -> None:
        self.count = count
        self._cond = threading.Condition()
        self._feedback: deque[_Feedback] = deque()
        self._error: Exception | None = None

    def post(self, fb: _Feedback) -> None:
        with self._cond:
            self._feedback.append(fb)
            self._cond.notify_all()

    def fail(self, exc: Exception) -> None:
        with self._cond:
            self._error = exc
            self._cond.notify_all()

    def wait(self, deadline: float | None, peer: str) -> _Feedback:
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


def _int_field(msg: Message, name: str, low: int, high: int) -> int:
    value = msg.meta.get(name)
    if type(value) is not int or not low <= value <= high:
        raise MalformedHeader(
            f"control message {msg.kind!r}: {name!r} must be an integer in [{low}, {high}], "
            f"got {value!r}"
        )
    return value


def _nack_ranges(msg: Message, count: int) -> np.ndarray:
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


def decode_received(
    endpoint: Any, got: Received, out: Mapping[TensorPath, np.ndarray] | None
) -> Message:
    """Decode what a link delivered; the message gets ``loss``, the fraction of each
    tensor's bytes (``"a/b"`` path -> 0.0 to 1.0) this message did not deliver."""
    if got.missing:
        msg, loss = decode_partial(
            got.data, got.missing, out=out, limits=endpoint.limits, codec_lookup=get_codec
        )
        msg.recv_s = time.perf_counter() - got.first_at
    else:
        msg = endpoint._decode_whole(got.data, got.first_at, out)
        loss = {"/".join(path): 0.0 for path, _ in flatten(msg.tensors)}
    msg.loss = loss  # type: ignore[attr-defined]
    return msg


class Link:
    """Datagrams and control messages between this endpoint and one peer.

    ``address`` is where the peer's datagrams go (None: ``udp`` is connected to it);
    ``deliver`` gets each finished incoming message (or the error that lost it) in the I/O
    thread. :meth:`send_message` runs in the caller's thread; the ``on_*`` methods and
    :meth:`tick` in the I/O thread.
    """

    def __init__(
        self,
        *,
        label: str,
        mode: str,
        options: UdpOptions,
        udp: Any,
        address: Any,
        reader: ControlReader,
        deliver: Callable[[Received | WireError], None],
        stats: UdpStats,
        limits: Limits,
        rtt_fallback: float = 0.001,
    ) -> None:
        self.label = label
        self.mode = mode
        self.reliable = mode == "reliable"
        self.options = options
        self.udp = udp
        self.address = address
        self.reader = reader
        self.control = reader.sock
        self.stats = stats
        self.limits = limits
        self._deliver = deliver
        self._rtt_fallback = rtt_fallback
        self._incoming: dict[int, _Incoming] = {}
        # Ids of finished messages -> delivered (True) or given up (False).
        self._finished: OrderedDict[int, bool] = OrderedDict()
        self._outgoing: dict[int, _Outgoing] = {}
        self._out_lock = threading.Lock()
        self._control_lock = threading.Lock()
        self._bucket = (
            TokenBucket(options.rate / 8, 2 * options.mtu) if options.rate is not None else None
        )
        self.closed = False

    # -- timing ------------------------------------------------------------------------

    @property
    def rtt(self) -> float:
        """Smoothed round-trip time of the control connection, seconds."""
        return control_rtt(self.control, self._rtt_fallback)

    def grace(self) -> float:
        """Seconds a best-effort receiver waits after ``sent`` for datagrams still on the way."""
        return 2 * self.rtt + 0.001

    def idle_timeout(self) -> float:
        """Seconds without a datagram after which an incoming message is given up on."""
        if self.reliable:
            return RELIABLE_IDLE
        gap = self.options.mtu * 8 / self.options.rate if self.options.rate else 0.0
        return max(IDLE_FLOOR, IDLE_RTTS * self.rtt, IDLE_RTTS * gap)

    # -- control messages --------------------------------------------------------------

    def send_control(
        self, kind: str, meta: dict[str, Any], tensors: dict[str, Any] | None = None
    ) -> None:
        """Write one control message; ``TransportError`` if the connection is unusable."""
        enc = encode_message(tensors, meta, kind=kind)
        with self._control_lock:
            send_encoded(self.control, enc, deadline_after(CONTROL_SEND_TIMEOUT))

    def send_control_quietly(self, kind: str, meta: dict[str, Any], timeout: float) -> None:
        """Best-effort control message (a goodbye): errors are ignored."""
        enc = encode_message(None, meta, kind=kind)
        try:
            with self._control_lock:
                send_encoded(self.control, enc, deadline_after(timeout))
        except (TransportError, OSError) as exc:
            log.debug("udp: could not send %r to %s: %s", kind, self.label, exc)

    def on_control(self, msg: Message, now: float) -> None:
        """Act on a control message from the peer (not hello/welcome/bye: the owner's)."""
        if msg.kind == "sent":
            self._on_sent(msg, now)
        elif msg.kind in ("ack", "nack"):
            mid = _int_field(msg, "id", 0, 2**64 - 1)
            with self._out_lock:
                out = self._outgoing.get(mid)
            if out is None:
                return  # an answer about a message already acknowledged or abandoned
            if msg.kind == "ack":
                out.post(_Feedback(acked=True))
            else:
                rate = msg.meta.get("rate")
                out.post(
                    _Feedback(
                        acked=False,
                        ranges=_nack_ranges(msg, out.count),
                        rate=float(rate) if isinstance(rate, (int, float)) and rate > 0 else None,
                    )
                )
        elif msg.kind == "drop":
            mid = _int_field(msg, "id", 0, 2**64 - 1)
            if self._incoming.pop(mid, None) is not None:
                self._finish(mid, delivered=False)
        else:
            log.debug("udp: ignoring control message %r from %s", msg.kind, self.label)

    def _on_sent(self, msg: Message, now: float) -> None:
        mid = _int_field(msg, "id", 0, 2**64 - 1)
        count = _int_field(msg, "count", 1, 2**32)
        if not self.reliable:
            self._take_head_chunks(msg, mid, now)
        delivered = self._finished.get(mid)
        if delivered and self.reliable:
            self.send_control("ack", {"id": mid})
            return
        if delivered is not None and not self.reliable:
            return
        if delivered is not None:  # given up here, still being sent: start it over
            del self._finished[mid]
        inc = self._incoming.get(mid)
        if not self.reliable:
            if inc is None:
                self._finish(mid, delivered=False)
                self.stats.add(lost_messages=1)
                self._deliver(
                    TruncatedMessage(f"every datagram of a message from {self.label} was lost")
                )
            else:
                inc.finalize_at = now + self.grace()
            return
        if inc is None:  # not one datagram arrived: ask for all of them
            ranges, rate = np.array([[0, count]], np.int64), None
        else:
            missing = inc.reassembler.missing_ranges(mid, limit=MAX_NACK_RANGES)
            ranges = np.array(missing, np.int64).reshape(-1, 2)
            rate = inc.take_round_rate()
        meta: dict[str, Any] = {"id": mid}
        if rate is not None:
            meta["rate"] = rate
        self.send_control("nack", meta, {"ranges": ranges})

    def _take_head_chunks(self, msg: Message, mid: int, now: float) -> None:
        """Feed the header's chunks a best-effort ``sent`` carries, as if they had come as
        datagrams (copies of ones that did come are dropped by the reassembler)."""
        chunks, sizes = msg.tensors.get("head_chunks"), msg.tensors.get("head_sizes")
        if chunks is None or sizes is None:
            return  # a peer that sends none: the header travels by datagram only
        chunks, sizes = np.asarray(chunks), np.asarray(sizes)
        if (
            chunks.dtype != np.uint8
            or chunks.ndim != 1
            or sizes.dtype != np.int64
            or sizes.ndim != 1
            or (sizes < CHUNK_HEADER_SIZE).any()
            or int(sizes.sum()) != chunks.size
        ):
            raise MalformedHeader(f"{self.label}: a 'sent' with malformed header chunks")
        view = memoryview(chunks)
        start = 0
        for size in sizes.tolist():
            chunk = view[start : start + size]
            start += size
            (chunk_mid,) = _MESSAGE_ID.unpack_from(chunk, 8)
            if chunk_mid != mid:
                raise MalformedHeader(f"{self.label}: a header chunk of another message in 'sent'")
            self.on_datagram(chunk, now)

    # -- receiving -----------------------------------------------------------------------

    def on_datagram(self, d: memoryview, now: float) -> None:
        """Take one datagram from the peer; ``WireError`` if it is not a valid chunk."""
        if len(d) < CHUNK_HEADER_SIZE:
            parse_chunk(d)  # raises the ChunkError that says what is wrong
        (mid,) = _MESSAGE_ID.unpack_from(d, 8)
        inc = self._incoming.get(mid)
        new = inc is None
        if inc is None:
            if mid in self._finished:
                return  # a late copy: the message was delivered, given up or dropped
            inc = _Incoming(
                ChunkReassembler(
                    max_message_bytes=self.limits.max_message_bytes,
                    timeout=self.idle_timeout(),
                    max_pending=1,
                ),
                now,
            )
        data = inc.reassembler.feed(d, now)  # raises before keeping anything of a bad chunk
        if data is not None:
            if not new:
                del self._incoming[mid]
            self._finish(mid)
            if self.reliable:
                self.send_control("ack", {"id": mid})
            self._deliver(Received(mid, data, [], inc.first_at))
            return
        if new:
            if len(self._incoming) >= MAX_INCOMING:
                oldest = min(self._incoming, key=lambda m: self._incoming[m].last_at)
                self._give_up(oldest, self._incoming.pop(oldest), now, "evicted by newer ones")
            self._incoming[mid] = inc
        inc.note(len(d), now)

    def tick(self, now: float) -> float | None:
        """Finish best-effort messages whose grace ran out, give up idle ones; return the
        seconds until this is next needed (None: no message pending)."""
        soonest: float | None = None
        for mid, inc in list(self._incoming.items()):
            if inc.finalize_at is not None and now >= inc.finalize_at:
                self._give_up(mid, self._incoming.pop(mid), now, "")
                continue
            idle_until = inc.last_at + self._idle_limit(mid, inc)
            if now >= idle_until:
                self._give_up(mid, self._incoming.pop(mid), now, "no datagram came for a while")
                continue
            due = idle_until if inc.finalize_at is None else min(idle_until, inc.finalize_at)
            soonest = due if soonest is None else min(soonest, due)
        return None if soonest is None else soonest - now

    def _idle_limit(self, mid: int, inc: _Incoming) -> float:
        """Seconds ``inc`` may go without a datagram. A best-effort message whose header has
        not come waits for ``sent``, which brings it over TCP (a lossy link can hold that
        back for tens of seconds); a dead peer ends it sooner, when its link drops."""
        limit = inc.reassembler.timeout
        if self.reliable or inc.finalize_at is not None:
            return limit
        lead = inc.reassembler.leading_bytes(mid)
        if len(lead) >= PREFIX_SIZE and len(lead) >= PREFIX_SIZE + PREFIX.unpack_from(lead)[4]:
            return limit  # the header is here: what is missing is tensor bytes
        return max(limit, RELIABLE_IDLE)

    def _give_up(self, mid: int, inc: _Incoming, now: float, why: str) -> None:
        """Stop waiting for a message: best-effort delivers what arrived, reliable drops it
        (its sender's next ``sent`` starts it over)."""
        self._finish(mid, delivered=not self.reliable)
        if self.reliable:
            log.info("udp: dropped an incomplete message from %s: %s", self.label, why)
            return
        for part in inc.reassembler.expire(now + inc.reassembler.timeout):
            self.stats.add(partial_messages=1)
            self._deliver(Received(mid, part.data, part.missing, inc.first_at))

    def _finish(self, mid: int, delivered: bool = True) -> None:
        self._finished[mid] = delivered
        if len(self._finished) > FINISHED_MEMORY:
            self._finished.popitem(last=False)

    # -- sending -----------------------------------------------------------------------

    def send_message(self, enc: EncodedMessage, deadline: float | None) -> None:
        """Send one encoded message to the peer (reliable: until it has all of it)."""
        if self.closed:
            raise PeerGone(f"{self.label} is not connected")
        mid = new_message_id()
        if self.reliable:
            self._send_reliable(enc, mid, deadline)
        else:
            self._send_best_effort(enc, mid, deadline)

    def _send_datagram(self, parts: list[Any], pacer: TokenBucket | None, deadline: Any) -> None:
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
        payload = self.options.chunk_payload
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
        self.send_control(
            "sent", {"id": mid, "count": count}, {"head_chunks": chunks, "head_sizes": sizes}
        )

    def _send_reliable(self, enc: EncodedMessage, mid: int, deadline: float | None) -> None:
        payload = self.options.chunk_payload
        count = max(-(-enc.nbytes // payload), 1)
        pending = _Outgoing(count)
        with self._out_lock:
            self._outgoing[mid] = pending
        try:
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
        except TransportTimeout:
            self.send_control_quietly("drop", {"id": mid}, 1.0)
            raise
        finally:
            with self._out_lock:
                del self._outgoing[mid]

    # -- closing -------------------------------------------------------------------------

    def flush(self, now: float) -> None:
        """Give up every incoming message at once (the peer left): best-effort delivers
        what arrived of each."""
        for mid in list(self._incoming):
            self._give_up(mid, self._incoming.pop(mid), now, "the peer left")

    def close(self, reason: Exception) -> None:
        """Fail the sends waiting for this peer with ``reason``; forget incoming messages."""
        self.closed = True
        with self._out_lock:
            waiting = list(self._outgoing.values())
        for out in waiting:
            out.fail(reason)
        self._incoming.clear()
