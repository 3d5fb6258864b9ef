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
  decodes what arrived one grace period (two control-link RTTs) after the datagrams end:
  after ``sent``, or after the message's last datagram if that brings it what it can
  deliver first (a loss on the control link holds ``sent`` back for TCP's retransmission
  timeout, 200 ms or more), or after an idle timeout if neither comes (a long one while the
  header is still missing), if its header and at least half of its bytes came (else it is
  lost).

With a ``seal`` (``secure.py``: the control link is under TLS) every datagram is sealed with
an AEAD on its way out and opened on its way in; one that does not verify, or came before, is
dropped and counted before the chunk path sees it.

Receiving runs in the endpoint's I/O thread, and so does everything that touches a link's
incoming messages; each message has its own ``ChunkReassembler`` so finishing one
(complete, partial or dropped) never touches another. What a message costs is bounded by
the bytes that arrived, never by the sizes its chunks or header declare.
"""

from __future__ import annotations

import contextlib
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
    AuthenticationError,
    MalformedHeader,
    MessageTooLarge,
    PeerGone,
    TransportError,
    TransportTimeout,
    TruncatedMessage,
    WireError,
)
from tensorwire.transports.base import deadline_after, remaining
from tensorwire.transports.udp.options import UdpOptions
from tensorwire.transports.udp.pacing import TokenBucket
from tensorwire.transports.udp.secure import SEAL_OVERHEAD, DatagramSeal
from tensorwire.transports.udp.sockets import (
    MAX_DATAGRAM,
    ControlReader,
    ControlWriter,
    control_rtt,
    send_datagram,
)
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
from tensorwire.wire.format import (
    DIGEST_SIZE,
    PREFIX,
    PREFIX_SIZE,
    parse_header,
    parse_prefix,
    verify_header,
)
from tensorwire.wire.partial import decode_partial
from tensorwire.wire.tensors import TensorPath, flatten

log = logging.getLogger("tensorwire.transports.udp")

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
PARTIAL_MIN_ARRIVED = 0.5  # a best-effort message with less of its bytes than this is lost
PARTIAL_EXPANSION = 64  # a partial message's lost compressed tensors may decode to this x arrived
CONTROL_HEADER_BYTES = 64 << 10  # a control message's header (a few fields) is far smaller
REFUSED_REPORT_S = 1.0  # datagrams that do not verify are reported at most this often (seconds)
_MESSAGE_ID = struct.Struct("<Q")  # at offset 8 of a chunk header
_PLACE = struct.Struct("<IIQQ")  # index, count, offset, total_length: at offset 16


def control_limits(limits: Limits) -> Limits:
    """What a joined peer's control messages may be: small headers, and bodies up to a
    NACK's ranges or the header chunks a best-effort ``sent`` carries (those of a message
    whose header is within ``limits``, cut with an mtu of 80 bytes or more)."""
    body = max(16 * MAX_NACK_RANGES, 2 * limits.max_header_bytes) + 2 * MAX_DATAGRAM
    return Limits(max_header_bytes=CONTROL_HEADER_BYTES, max_message_bytes=body, max_tensors=2)


@dataclass
class UdpStats:
    """Counters of one endpoint (all its peers), since it opened."""

    datagrams_sent: int = 0
    retransmits: int = 0  # datagrams sent again because a NACK listed them
    nack_rounds: int = 0  # NACKs a reliable sender acted on
    partial_messages: int = 0  # best-effort messages delivered with lost ranges
    lost_messages: int = 0  # best-effort messages whose header or half their bytes were lost
    stranger_datagrams: int = 0  # datagrams from addresses of no joined peer, dropped
    refused_datagrams: int = 0  # sealed sessions: datagrams that did not verify or came before
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, **counts: int) -> None:
        with self._lock:
            for name, n in counts.items():
                setattr(self, name, getattr(self, name) + n)


@dataclass
class Received:
    """A message a peer sent: whole (``missing`` empty) or with lost byte ranges
    (``(offset, length)``, best-effort) and ``arrived`` bytes of it received; ``first_at``
    is ``time.perf_counter()`` at its first datagram."""

    message_id: int
    data: np.ndarray
    missing: list[tuple[int, int]]
    first_at: float
    arrived: int


class _Incoming:
    """A message being reassembled, and what this round of it looked like.

    Best-effort: ``finalize_at`` is when it is finished (one grace period after ``sent`` or
    after its last datagram); ``announced`` whether its ``sent`` came; ``tail`` its last
    chunk's ``(index, offset, total_length)`` once it came."""

    __slots__ = (
        "announced",
        "finalize_at",
        "first_at",
        "last_at",
        "nack",
        "reassembler",
        "round_bytes",
        "round_first",
        "round_n",
        "tail",
    )

    def __init__(self, reassembler: ChunkReassembler, now: float) -> None:
        self.reassembler = reassembler
        self.first_at = now
        self.last_at = now
        self.finalize_at: float | None = None
        self.announced = False
        self.tail: tuple[int, int, int] | None = None
        # The last NACK, while no datagram came since: a repeated 'sent' costs no new one.
        self.nack: EncodedMessage | None = None
        self.round_bytes = 0
        self.round_first = now
        self.round_n = 0

    def note(self, nbytes: int, now: float) -> None:
        self.nack = None
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


def header_arrived(lead: memoryview) -> bool:
    """Whether ``lead`` (a message's bytes from offset 0 without a gap) holds its prefix and
    its whole header, so that every tensor can be placed."""
    return len(lead) >= PREFIX_SIZE and len(lead) >= PREFIX_SIZE + PREFIX.unpack_from(lead)[4]


def _check_partial(got: Received, limits: Limits) -> None:
    """Raise ``MessageTooLarge`` when a partial message's lost compressed tensors would
    decode to more than ``PARTIAL_EXPANSION`` x its arrived bytes: each gets a whole new
    array (zeros where there is no previous one), which its lost bytes cannot bound."""
    mv = got.data.data
    prefix = parse_prefix(mv, limits)
    end = PREFIX_SIZE + prefix.header_length
    verify_header(mv[PREFIX_SIZE:end], prefix)
    plan = parse_header(mv[PREFIX_SIZE:end], prefix, limits)
    starts = np.fromiter((o for o, _ in got.missing), np.int64, len(got.missing))
    ends = starts + np.fromiter((n for _, n in got.missing), np.int64, len(got.missing))
    lost, offset = 0, end
    for spec in plan.tensors:
        a, b = offset, offset + spec.size
        offset = b + (DIGEST_SIZE if plan.digests else 0)
        i = int(np.searchsorted(ends, a, side="right"))  # the first gap ending after a
        if spec.codecs and i < len(starts) and starts[i] < b:
            lost += spec.nbytes
    if lost > PARTIAL_EXPANSION * got.arrived:
        raise MessageTooLarge(
            f"a partial message whose lost compressed tensors decode to {lost} bytes, over "
            f"{PARTIAL_EXPANSION} x the {got.arrived} bytes that arrived"
        )


def decode_received(
    endpoint: Any, got: Received, out: Mapping[TensorPath, np.ndarray] | None
) -> Message:
    """Decode what a link delivered; the message gets ``loss``, the fraction of each
    tensor's bytes (``"a/b"`` path -> 0.0 to 1.0) this message did not deliver."""
    if got.missing:
        _check_partial(got, endpoint.limits)
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
    ``deliver`` gets each finished incoming message, or the ``WireError`` that lost a message
    the peer announced with ``sent``; ``reject`` gets the error of input that is dropped (a
    bad chunk, a message nobody announced that could not be kept). Both run in the I/O
    thread. ``session`` is the peer's session state machine (the hub's ``HubSession`` or the
    channel's ``ClientSession``), fed the session's messages on the control link.
    :meth:`send_message` runs in the caller's thread; the ``on_*`` methods,
    :meth:`tick` and :meth:`flush` in the I/O thread, which alone touches incoming messages.
    ``seal`` (None: datagrams in clear) seals and opens the datagrams of a secured session.
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
        writer: ControlWriter,
        deliver: Callable[[Received | WireError], None],
        reject: Callable[[Exception], None],
        stats: UdpStats,
        limits: Limits,
        session: Any,
        rtt_fallback: float = 0.001,
        seal: DatagramSeal | None = None,
    ) -> None:
        self.label = label
        self.session = session
        self.mode = mode
        self.reliable = mode == "reliable"
        self.options = options
        self.udp = udp
        self.address = address
        self.reader = reader
        self.writer = writer
        self.control = reader.sock
        self.stats = stats
        self.limits = limits
        self._deliver = deliver
        self._reject = reject
        self._rtt_fallback = rtt_fallback
        self.seal = seal
        # message bytes per datagram: the mtu less the chunk header and the seal, if any
        self.chunk_payload = options.chunk_payload - (SEAL_OVERHEAD if seal else 0)
        self._refused = 0  # datagrams that did not verify since the last report
        self._refused_reported = -REFUSED_REPORT_S  # time.perf_counter() of the last report
        self._incoming: dict[int, _Incoming] = {}
        # Ids of finished messages -> delivered (True) or given up (False).
        self._finished: OrderedDict[int, bool] = OrderedDict()
        self._outgoing: dict[int, _Outgoing] = {}
        self._out_lock = threading.Lock()
        self._bucket = (
            TokenBucket(options.rate / 8, 2 * options.mtu) if options.rate is not None else None
        )
        self.closed = False
        self._why = f"{label} is not connected"  # what sends raise once closed

    # -- timing ------------------------------------------------------------------------

    @property
    def rtt(self) -> float:
        """Smoothed round-trip time of the control connection, seconds."""
        return control_rtt(self.control, self._rtt_fallback)

    def grace(self) -> float:
        """Seconds a best-effort receiver waits after ``sent`` (or a message's last datagram)
        for datagrams still on the way: two control-link round trips and 1 ms."""
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
        """Queue one control message, never blocking; ``PeerGone`` if the connection is
        unusable (broken, or the peer leaves too much unread)."""
        self.writer.write(encode_message(tensors, meta, kind=kind))

    def _say(self, kind: str, meta: dict[str, Any]) -> None:
        """A control message whose loss changes nothing (the link is ending anyway)."""
        try:
            self.send_control(kind, meta)
        except TransportError as exc:
            log.debug("udp: could not send %r to %s: %s", kind, self.label, exc)

    def on_control(self, msg: Message, now: float) -> None:
        """Act on a control message from the peer (not hello/welcome/bye: the session's).
        ``WireError`` if it is malformed, ``PeerGone`` if answering it failed."""
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
                inc.announced = True
                due = now + self.grace()
                inc.finalize_at = due if inc.finalize_at is None else min(inc.finalize_at, due)
            return
        if inc is None:  # not one datagram arrived: ask for all of them
            self.send_control("nack", {"id": mid}, {"ranges": np.array([[0, count]], np.int64)})
            return
        if inc.nack is None:
            missing = inc.reassembler.missing_ranges(mid, limit=MAX_NACK_RANGES)
            ranges = np.array(missing, np.int64).reshape(-1, 2)
            rate = inc.take_round_rate()
            meta: dict[str, Any] = {"id": mid} if rate is None else {"id": mid, "rate": rate}
            inc.nack = encode_message({"ranges": ranges}, meta, kind="nack")
        self.writer.write(inc.nack)

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
        view = chunks.data
        start = 0
        for size in sizes.tolist():
            chunk = view[start : start + size]
            start += size
            (chunk_mid,) = _MESSAGE_ID.unpack_from(chunk, 8)
            if chunk_mid != mid:
                raise MalformedHeader(f"{self.label}: a header chunk of another message in 'sent'")
            self._on_chunk(chunk, now)

    # -- receiving -----------------------------------------------------------------------

    def on_datagram(self, d: memoryview, now: float) -> None:
        """Take one datagram from the peer; ``WireError`` if it is not a valid chunk (it then
        changes nothing), ``PeerGone`` if acknowledging the message it completes failed. A
        sealed session's datagram that does not verify is dropped and counted here."""
        if self.seal is not None:
            try:
                d = self.seal.open(d)
            except AuthenticationError as exc:
                self._refuse(exc, now)
                return
        self._on_chunk(d, now)

    def _refuse(self, exc: AuthenticationError, now: float) -> None:
        """Count a datagram that did not verify; report it (``reject``) at most once per
        ``REFUSED_REPORT_S``, as anyone who can spoof the peer's address can send them."""
        self.stats.add(refused_datagrams=1)
        self._refused += 1
        if now - self._refused_reported < REFUSED_REPORT_S:
            return
        self._reject(
            AuthenticationError(
                f"dropped {self._refused} datagram(s) from {self.label}'s address that were "
                f"not sealed by it for this session, the last: {exc}"
            )
        )
        self._refused, self._refused_reported = 0, now

    def _on_chunk(self, d: memoryview, now: float) -> None:
        """Take one chunk of the peer's (a datagram's, opened, or one a ``sent`` carried)."""
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
            self._deliver(Received(mid, data, [], inc.first_at, len(data)))
            if self.reliable:
                self.send_control("ack", {"id": mid})
            return
        if new:
            if len(self._incoming) >= MAX_INCOMING:
                oldest = min(self._incoming, key=lambda m: self._incoming[m].last_at)
                self._give_up(oldest, self._incoming.pop(oldest), now, "evicted by newer ones")
            self._incoming[mid] = inc
        inc.note(len(d), now)
        if not self.reliable and inc.tail is None:
            index, count, offset, total = _PLACE.unpack_from(d, 16)
            if index == count - 1:
                # The sender sends each chunk once, in order: its datagrams have ended.
                inc.tail = (index, offset, total)
                if inc.finalize_at is None:
                    inc.finalize_at = now + self.grace()

    def tick(self, now: float) -> float | None:
        """Finish best-effort messages whose grace ran out, give up idle ones; return the
        seconds until this is next needed (None: no message pending)."""
        soonest: float | None = None
        for mid, inc in list(self._incoming.items()):
            if inc.finalize_at is not None and now >= inc.finalize_at:
                if inc.announced or self._deliverable(mid, inc):
                    self._give_up(mid, self._incoming.pop(mid), now, "")
                    continue
                inc.finalize_at = None  # it would be lost: its 'sent' (or its header) decides
            idle_until = inc.last_at + self._idle_limit(mid, inc)
            if now >= idle_until:
                self._give_up(mid, self._incoming.pop(mid), now, "no datagram came for a while")
                continue
            due = idle_until if inc.finalize_at is None else min(idle_until, inc.finalize_at)
            soonest = due if soonest is None else min(soonest, due)
        return None if soonest is None else soonest - now

    def _deliverable(self, mid: int, inc: _Incoming) -> bool:
        """Whether a best-effort message whose last datagram came would be delivered if it
        were finished now: its header and at least half of its bytes are in. (One that would
        be lost waits for its ``sent``, so that the loss is reported, or for its header.)"""
        if inc.tail is None or not header_arrived(inc.reassembler.leading_bytes(mid)):
            return False
        index, offset, total = inc.tail
        ranges = inc.reassembler.missing_ranges(mid, limit=MAX_NACK_RANGES)
        if len(ranges) >= MAX_NACK_RANGES:
            return False  # too many gaps to count here: let 'sent' or the idle timeout decide
        # every chunk but the last (which came) carries offset / index bytes
        missing = offset // max(index, 1) * sum(stop - start for start, stop in ranges)
        return total - missing >= PARTIAL_MIN_ARRIVED * total

    def _idle_limit(self, mid: int, inc: _Incoming) -> float:
        """Seconds ``inc`` may go without a datagram. A best-effort message whose header has
        not come waits for ``sent``, which brings it over TCP (a lossy link can hold that
        back for tens of seconds); a dead peer ends it sooner, when its link drops."""
        limit = inc.reassembler.timeout
        if self.reliable or inc.finalize_at is not None:
            return limit
        if header_arrived(inc.reassembler.leading_bytes(mid)):
            return limit  # what is missing is tensor bytes
        return max(limit, RELIABLE_IDLE)

    def _give_up(self, mid: int, inc: _Incoming, now: float, why: str) -> None:
        """Stop waiting for a message: reliable drops it (its sender's next ``sent`` starts
        it over); best-effort delivers what arrived if its header and at least half of its
        bytes did, else it is lost. Nothing here allocates more than what arrived."""
        self._finish(mid, delivered=not self.reliable)
        if self.reliable:
            log.debug("udp: dropped an incomplete message from %s: %s", self.label, why)
            return
        has_header = header_arrived(inc.reassembler.leading_bytes(mid))  # before expire drops it
        for part in inc.reassembler.expire(now + inc.reassembler.timeout):
            arrived = part.total_length - sum(n for _, n in part.missing)
            if has_header and arrived >= PARTIAL_MIN_ARRIVED * part.total_length:
                self.stats.add(partial_messages=1)
                self._deliver(Received(mid, part.data, part.missing, inc.first_at, arrived))
                continue
            what = (
                f"{part.total_length - arrived} of its {part.total_length} bytes"
                if has_header
                else "its header"
            )
            lost = TruncatedMessage(
                f"a message from {self.label} lost {what}" + (f" ({why})" if why else "")
            )
            if not inc.announced:  # never announced: maybe not the peer's at all
                self._reject(lost)
            else:
                self.stats.add(lost_messages=1)
                self._deliver(lost)

    def _finish(self, mid: int, delivered: bool = True) -> None:
        self._finished[mid] = delivered
        if len(self._finished) > FINISHED_MEMORY:
            self._finished.popitem(last=False)

    # -- sending -----------------------------------------------------------------------

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
            # A peer that has it all may be gone already: its ack, or the link's end, decides.
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

    # -- closing -------------------------------------------------------------------------

    def flush(self, now: float) -> None:
        """Give up every incoming message at once (the peer left): best-effort delivers
        what arrived of each. In the I/O thread only."""
        for mid in list(self._incoming):
            inc = self._incoming.pop(mid, None)
            if inc is not None:  # a message given up while delivering another is gone already
                self._give_up(mid, inc, now, "the peer left")

    def close(self, reason: Exception) -> None:
        """Fail the sends waiting for this peer, and any later one, with ``PeerGone`` saying
        ``reason`` (thread-safe; incoming messages are the I/O thread's to flush)."""
        with self._out_lock:
            self.closed = True
            self._why = str(reason)
            waiting = list(self._outgoing.values())
        for out in waiting:  # each its own: one exception raised in many threads tangles
            out.fail(PeerGone(self._why))
