"""A flow's receiving state: the peer's messages being reassembled (one
``ChunkReassembler`` each, so finishing one never touches another), NACKs for what a
reliable one misses, and when a best-effort one is finished, delivered or lost.

Everything here runs in the endpoint's I/O thread. What a message costs is bounded by the
bytes that arrived, never by the sizes its chunks or header declare.
"""

from __future__ import annotations

import struct
from collections import OrderedDict
from typing import Any

import numpy as np

from tensorwire.errors import AuthenticationError, MalformedHeader, TruncatedMessage
from tensorwire.transports.udp.flow_base import (
    MAX_NACK_RANGES,
    RELIABLE_IDLE,
    FlowBase,
    int_field,
    log,
)
from tensorwire.transports.udp.loss import PARTIAL_MIN_ARRIVED, Received, header_arrived
from tensorwire.wire import (
    CHUNK_HEADER_SIZE,
    ChunkReassembler,
    EncodedMessage,
    Message,
    encode_message,
    parse_chunk,
)

MAX_INCOMING = 16  # messages per peer being reassembled at once; a new one evicts the oldest
FINISHED_MEMORY = 4096  # ids of finished messages remembered, to drop their late datagrams
RATE_SAMPLE = 16  # datagrams a round needs before its receive rate is reported
REFUSED_REPORT_S = 1.0  # datagrams that do not verify are reported at most this often (seconds)
_MESSAGE_ID = struct.Struct("<Q")  # at offset 8 of a chunk header
_PLACE = struct.Struct("<IIQQ")  # index, count, offset, total_length: at offset 16


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


class FlowReceiving(FlowBase):
    """The receiving half of a flow (in the I/O thread only)."""

    _incoming: dict[int, _Incoming]
    _finished: OrderedDict[int, bool]
    _refused: int
    _refused_reported: float

    def _init_receiving(self) -> None:
        """Set up the receiving state (once, by the flow's constructor)."""
        self._refused = 0  # datagrams that did not verify since the last report
        self._refused_reported = -REFUSED_REPORT_S  # time.perf_counter() of the last report
        self._incoming = {}
        # Ids of finished messages -> delivered (True) or given up (False).
        self._finished = OrderedDict()

    def _on_sent(self, msg: Message, now: float) -> None:
        mid = int_field(msg, "id", 0, 2**64 - 1)
        count = int_field(msg, "count", 1, 2**32)
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
        back for tens of seconds); a dead peer ends it sooner, when its control connection drops."""
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

    def flush(self, now: float) -> None:
        """Give up every incoming message at once (the peer left): best-effort delivers
        what arrived of each. In the I/O thread only."""
        for mid in list(self._incoming):
            inc = self._incoming.pop(mid, None)
            if inc is not None:  # a message given up while delivering another is gone already
                self._give_up(mid, inc, now, "the peer left")
