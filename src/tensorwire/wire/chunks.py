"""Chunking for size-capped transports (MQTT, AMQP, UDP datagrams, gRPC) and reassembly.

A chunk is a 40-byte header followed by a slice of the encoded message::

    magic "TWCK" | version u8 | flags u8 | reserved u16 | message_id u64
    | index u32 | count u32 | offset u64 | total_length u64 | payload ...

Every chunk but the last carries exactly ``chunk_payload`` bytes at ``offset = index *
chunk_payload``; the last carries the rest. The reassembler is sans-IO: the caller passes
the clock (``now``, seconds) so timeouts are testable without sleeping.

What a reassembler holds is bounded by the bytes that arrived, never by what a chunk
declares (``count`` and ``total_length`` are the sender's word):

- sparse: while less than 1/8 of a message's ``total_length`` has arrived, it is held as
  copies of its chunks: those from chunk 0 on without a gap in one buffer whose capacity
  doubles, the others in a dict by index. That is at most 2x its arrived payload bytes, plus
  ``_ENTRY_OVERHEAD`` (256) bytes per chunk in the dict; missing chunks are the gaps between
  the held indices, reported as (start, stop) ranges;
- dense: at 1/8 it gets its one ``total_length``-byte buffer (the copies move in once) and a
  bitmap of ``count / 8 <= total_length / 8`` bytes, and is written in place from then on:
  at most 9x its arrived payload bytes. So a pending message holds at most 9x its arrived
  payload bytes + 256 bytes per held chunk + ``_MESSAGE_OVERHEAD`` (2 KiB), whatever it
  declares; that footprint is what the budgets count;
- each source may have ``max_pending`` messages and ``max_pending_bytes_per_source`` bytes
  pending (over either, its own least recently fed message is evicted, never another
  source's), and all sources together ``max_pending_bytes`` (over it, the source holding the
  most loses its least recently fed message). The message being fed is never evicted, so
  one message may exceed a budget alone only by its bookkeeping (its data fits or is refused);
- evicted messages are held until the next :meth:`ChunkReassembler.expire` hands them out,
  and the whole-length buffer of a sparse message that was dropped is made only when its
  ``PartialMessage.data`` is read;
- at most ``_MAX_DONE`` completed message keys are remembered (to drop late duplicates).

Feeding a chunk costs amortized O(1) plus copying its payload (twice for the first 1/8 of
a message). Listing gaps costs O(k log k) for k chunks held sparse, or numpy passes over
the bitmap.
"""

from __future__ import annotations

import random
import struct
from collections import OrderedDict
from collections.abc import Hashable, Iterator, Sequence
from itertools import islice
from typing import Any, NamedTuple

import numpy as np

from tensorwire.errors import ChunkError, MessageTooLarge
from tensorwire.wire.encoder import _as_byte_view

CHUNK_MAGIC = b"TWCK"
CHUNK_VERSION = 1
CHUNK_HEADER = struct.Struct("<4sBBHQIIQQ")
CHUNK_HEADER_SIZE = CHUNK_HEADER.size  # 40
MAX_MISSING = 1 << 16  # default cap on the indices or ranges ``missing*`` return
_MAX_DONE = 1 << 16  # completed message keys remembered at most (bounds memory)
_PROMOTE_AT = 8  # a message gets its whole buffer once 1/_PROMOTE_AT of its bytes arrived
_ENTRY_OVERHEAD = 256  # bytes charged per chunk held as a copy: its dict entry and objects
_MESSAGE_OVERHEAD = 2048  # bytes charged per pending message: its objects and keys
_GAP_SCAN = 1 << 20  # chunk indices per numpy pass over a bitmap (bounds its temporaries)
_EMPTY = np.empty(0, np.uint8)


def new_message_id() -> int:
    """A random 64-bit message id (unique per sender with overwhelming probability)."""
    return random.getrandbits(64)


class ChunkHeader(NamedTuple):  # a NamedTuple: built per chunk, 3x cheaper than a dataclass
    message_id: int
    # index and count hide tuple's methods of those names: the wire format's names win.
    index: int  # type: ignore[assignment]
    count: int  # type: ignore[assignment]
    offset: int
    total_length: int


def parse_chunk(chunk: Any) -> tuple[ChunkHeader, memoryview]:
    """Split a chunk into its validated header and payload view; ``ChunkError`` if malformed."""
    mv = _as_byte_view(chunk)
    if len(mv) < CHUNK_HEADER_SIZE:
        raise ChunkError(
            f"chunk of {len(mv)} bytes is shorter than its {CHUNK_HEADER_SIZE}-byte header"
        )
    magic, version, flags, reserved, mid, index, count, offset, total = CHUNK_HEADER.unpack_from(mv)
    if magic != CHUNK_MAGIC:
        raise ChunkError(f"bad chunk magic {bytes(magic)!r} (expected {CHUNK_MAGIC!r})")
    if version != CHUNK_VERSION or flags or reserved:
        raise ChunkError(
            f"unsupported chunk version {version} / flags {flags} / reserved {reserved}"
        )
    payload = mv[CHUNK_HEADER_SIZE:]
    if count == 0 or index >= count:
        raise ChunkError(f"chunk index {index} is out of range for count {count}")
    if count > max(total, 1):  # checked before a reassembler allocates per-chunk state
        raise ChunkError(f"{count} chunks cannot carry a message of {total} bytes")
    if offset + len(payload) > total:
        raise ChunkError(
            f"chunk [{offset}, {offset + len(payload)}) runs past the message end {total}"
        )
    return ChunkHeader(mid, index, count, offset, total), payload


def iter_chunks(frames: Sequence[Any], message_id: int, chunk_payload: int) -> Iterator[list[Any]]:
    """Yield each chunk as a list of buffers (its header, then views of ``frames``), no copies.

    ``frames`` is the message as buffers in order (e.g. ``EncodedMessage.frames()``);
    ``chunk_payload`` is the most payload bytes per chunk.
    """
    if chunk_payload <= 0:
        raise ValueError("chunk_payload must be positive")
    views = [_as_byte_view(f) for f in frames]
    total = sum(len(v) for v in views)
    count = max(-(-total // chunk_payload), 1)
    fi, fpos = 0, 0
    for index in range(count):
        offset = index * chunk_payload
        want = min(chunk_payload, total - offset)
        parts: list[Any] = [
            CHUNK_HEADER.pack(
                CHUNK_MAGIC, CHUNK_VERSION, 0, 0, message_id, index, count, offset, total
            )
        ]
        while want:
            v = views[fi]
            take = min(want, len(v) - fpos)
            if take:
                parts.append(v[fpos : fpos + take])
            fpos += take
            want -= take
            if fpos == len(v):
                fi, fpos = fi + 1, 0
        yield parts


class PartialMessage:
    """A message whose chunks stopped coming (or that was evicted to make room).

    ``missing`` holds its lost (byte offset, byte length) ranges, one per gap between the
    runs of chunks that came, in order. ``data`` is the whole message (``total_length``
    bytes, uint8; the bytes in the gaps are unspecified), made on first access when less than
    1/8 of it had arrived, so a dropped message that declared a huge size costs only what
    arrived until a caller reads its bytes.
    """

    __slots__ = ("_data", "_pieces", "message_id", "missing", "source", "total_length")

    def __init__(
        self,
        source: Hashable,
        message_id: int,
        total_length: int,
        missing: list[tuple[int, int]],
        data: np.ndarray | None,
        pieces: list[tuple[int, Any]],
    ) -> None:
        self.source = source
        self.message_id = message_id
        self.total_length = total_length
        self.missing = missing
        self._data = data
        self._pieces = pieces  # (byte offset, bytes) of what arrived, while ``_data`` is None

    @property
    def data(self) -> np.ndarray:
        """The whole message as one contiguous uint8 array of ``total_length`` bytes."""
        if self._data is None:
            data = np.zeros(self.total_length, np.uint8)  # calloc: untouched gaps cost no RSS
            for offset, piece in self._pieces:
                data[offset : offset + len(piece)] = np.frombuffer(piece, np.uint8)
            self._data, self._pieces = data, []
        return self._data

    def __repr__(self) -> str:
        return (
            f"PartialMessage(source={self.source!r}, message_id={self.message_id:#x}, "
            f"total_length={self.total_length}, missing={len(self.missing)} ranges)"
        )


def _bit_gaps(bits: bytearray, count: int, start: int) -> Iterator[tuple[int, int]]:
    """The runs of clear bits at indices [start, count) of a little-endian bitmap, as
    [start, stop), in order; the bits below ``start`` must be set."""
    carried: int | None = None  # start of a gap that reaches the end of the previous pass
    for lo in range(start - start % 8, count, _GAP_SCAN):
        hi = min(lo + _GAP_SCAN, count)
        packed = np.frombuffer(bits, np.uint8, -(-(hi - lo) // 8), lo // 8)
        clear = np.unpackbits(packed, count=hi - lo, bitorder="little") == 0
        edges = [lo, *(np.flatnonzero(clear[1:] != clear[:-1]) + lo + 1).tolist(), hi]
        if carried is not None and not clear[0]:
            yield carried, lo
            carried = None
        for k in range(0 if clear[0] else 1, len(edges) - 1, 2):
            a, b = edges[k], edges[k + 1]
            if carried is not None:  # only the first run of this pass can continue it
                a, carried = carried, None
            if b == hi < count:
                carried = a
            else:
                yield a, b


class _Pending:
    """A message being reassembled: which chunks came, and their bytes.

    Sparse (less than 1/8 arrived): chunks ``[0, lead)`` are copied into ``head`` (its
    capacity doubles), the others into ``pieces``. Dense: ``data`` is the whole message,
    written in place, and ``bits`` has a bit per chunk index (set: received); ``lead`` is
    then only advanced when asked for.
    """

    __slots__ = (
        "arrived",
        "bits",
        "charged",
        "chunk_payload",
        "count",
        "data",
        "head",
        "head_len",
        "last_seen",
        "lead",
        "message_id",
        "n_received",
        "pieces",
        "pieces_bytes",
        "source",
        "total",
    )

    def __init__(
        self, source: Hashable, message_id: int, count: int, total: int, now: float
    ) -> None:
        self.source = source
        self.message_id = message_id
        self.count = count
        self.total = total
        self.chunk_payload: int | None = None
        self.last_seen = now
        self.n_received = 0
        self.arrived = 0  # payload bytes of the distinct chunks received
        self.charged = 0  # bytes this message is charged in the budgets
        self.lead = 0  # chunks [0, lead) have all come
        self.head = _EMPTY
        self.head_len = 0
        self.pieces: dict[int, bytes] = {}
        self.pieces_bytes = 0
        self.data: np.ndarray | None = None
        self.bits: bytearray | None = None

    def add(self, index: int, offset: int, payload: memoryview) -> int | None:
        """Record chunk ``index`` and keep its bytes; return by how many bytes that changed
        :meth:`footprint`, or None if the chunk had come already."""
        n = len(payload)
        bits = self.bits
        if bits is not None and self.data is not None:  # the hot path of a big message
            if bits[index >> 3] >> (index & 7) & 1:
                return None
            bits[index >> 3] |= 1 << (index & 7)
            self.data[offset : offset + n] = payload
            self.n_received += 1
            self.arrived += n
            return 0
        if index < self.lead or index in self.pieces:
            return None
        before = self.footprint()
        self.n_received += 1
        self.arrived += n
        if index == self.lead:  # extends the run from chunk 0: append it and what it joins
            self._append_head(payload)
            lead = index + 1
            while lead in self.pieces:
                piece = self.pieces.pop(lead)
                self.pieces_bytes -= len(piece)
                self._append_head(memoryview(piece))
                lead += 1
            self.lead = lead
        else:
            self.pieces[index] = bytes(payload)
            self.pieces_bytes += n
        if self.arrived * _PROMOTE_AT >= self.total:
            self._promote()
        return self.footprint() - before

    def _append_head(self, piece: memoryview) -> None:
        end = self.head_len + len(piece)
        if end > len(self.head):
            grown = np.empty(min(self.total, max(2 * len(self.head), end)), np.uint8)
            grown[: self.head_len] = self.head[: self.head_len]
            self.head = grown
        self.head[self.head_len : end] = piece
        self.head_len = end

    def _promote(self) -> None:
        """Move the held copies into one ``total``-byte buffer; write in place from now on."""
        size = self.chunk_payload or 0
        data = np.empty(self.total, np.uint8)
        data[: self.head_len] = self.head[: self.head_len]
        bits = bytearray(-(-self.count // 8))
        full, rest = divmod(self.lead, 8)
        bits[:full] = b"\xff" * full
        if rest:
            bits[full] = (1 << rest) - 1
        for j, piece in self.pieces.items():
            data[j * size : j * size + len(piece)] = np.frombuffer(piece, np.uint8)
            bits[j >> 3] |= 1 << (j & 7)
        self.data, self.bits = data, bits
        self.head, self.head_len, self.pieces, self.pieces_bytes = _EMPTY, 0, {}, 0

    def footprint(self) -> int:
        """Bytes this message holds: its data or copies, and its bookkeeping (estimated)."""
        if self.data is not None and self.bits is not None:
            return self.data.nbytes + len(self.bits) + _MESSAGE_OVERHEAD
        held = self.head.nbytes + self.pieces_bytes
        return held + _ENTRY_OVERHEAD * len(self.pieces) + _MESSAGE_OVERHEAD

    def _advance_lead(self) -> int:
        """Move ``lead`` past the chunks received since (dense); each bit is passed once."""
        bits, lead = self.bits, self.lead
        if bits is not None:
            while lead < self.count:
                byte = bits[lead >> 3]
                if byte == 0xFF and not lead & 7:
                    lead += 8
                elif byte >> (lead & 7) & 1:
                    lead += 1
                else:
                    break
            self.lead = lead = min(lead, self.count)
        return lead

    def gaps(self) -> Iterator[tuple[int, int]]:
        """The runs of missing chunk indices, as [start, stop), in order."""
        lead = self._advance_lead()
        if self.bits is not None:
            yield from _bit_gaps(self.bits, self.count, lead)
            return
        prev = lead
        for index in sorted(self.pieces):
            if index > prev:
                yield prev, index
            prev = index + 1
        if prev < self.count:
            yield prev, self.count

    def leading_bytes(self) -> memoryview:
        buf = self.head if self.data is None else self.data
        end = min(self._advance_lead() * (self.chunk_payload or 0), self.total)
        return buf.data[:end]

    def to_partial(self) -> PartialMessage:
        size = self.chunk_payload or 0
        missing = []
        for start, stop in self.gaps():
            offset = start * size
            missing.append((offset, min(stop * size, self.total) - offset))
        pieces: list[tuple[int, Any]] = []
        if self.data is None:
            pieces.append((0, self.head[: self.head_len]))
            pieces.extend((j * size, piece) for j, piece in self.pieces.items())
        return PartialMessage(self.source, self.message_id, self.total, missing, self.data, pieces)


class _Source:
    """The messages one source has pending (least recently fed first) and their bytes."""

    __slots__ = ("messages", "nbytes")

    def __init__(self) -> None:
        self.messages: OrderedDict[int, _Pending] = OrderedDict()
        self.nbytes = 0


class ChunkReassembler:
    """Collects chunks per ``(source, message_id)`` into whole messages.

    Handles reordering and duplicates; a message that gets no chunk for ``timeout``
    seconds is dropped by :meth:`expire`, which returns what arrived of it. None larger
    than ``max_message_bytes`` is accepted. Per source at most ``max_pending`` messages and
    ``max_pending_bytes_per_source`` bytes (default 2x ``max_message_bytes``) are held, and
    ``max_pending_bytes`` bytes in all (default 4x ``max_message_bytes``); over a budget a
    message is evicted as described in the module docstring, and :meth:`expire` returns it.

    Memory: a pending message holds at most 9x its arrived payload bytes (2x while less
    than 1/8 of it arrived), plus 256 bytes per chunk held as a copy and 2 KiB; that is
    what the budgets count (:attr:`pending_bytes`), whatever its chunks declare.
    ``now`` is a monotonic clock: :meth:`expire` stops at the first message still live in
    the order messages were last fed.
    """

    def __init__(
        self,
        *,
        max_message_bytes: int = 16 << 30,
        timeout: float = 30.0,
        max_pending: int = 64,
        max_pending_bytes_per_source: int | None = None,
        max_pending_bytes: int | None = None,
    ) -> None:
        if max_pending < 1:
            raise ValueError(f"max_pending must be at least 1, not {max_pending}")
        per_source = (
            2 * max_message_bytes
            if max_pending_bytes_per_source is None
            else max_pending_bytes_per_source
        )
        total = (
            max(4 * max_message_bytes, per_source)
            if max_pending_bytes is None
            else max_pending_bytes
        )
        if per_source <= 0 or total <= 0:
            raise ValueError("max_pending_bytes_per_source and max_pending_bytes must be positive")
        self.max_message_bytes = max_message_bytes
        self.timeout = timeout
        self.max_pending = max_pending
        self.max_pending_bytes_per_source = per_source
        self.max_pending_bytes = total
        self._pending: OrderedDict[tuple[Hashable, int], _Pending] = OrderedDict()
        self._sources: dict[Hashable, _Source] = {}
        self._nbytes = 0
        self._evicted: list[PartialMessage] = []
        # Keys of messages completed in the last ``timeout`` seconds: their late duplicate
        # chunks are dropped instead of opening a new message that would expire as a loss.
        self._done: OrderedDict[tuple[Hashable, int], float] = OrderedDict()

    def __len__(self) -> int:
        return len(self._pending)

    @property
    def pending_bytes(self) -> int:
        """Bytes charged to the pending messages of all sources (see the class docstring)."""
        return self._nbytes

    def feed(self, chunk: Any, now: float, source: Hashable = None) -> np.ndarray | None:
        """Add one chunk; return the whole message (uint8 array) when this chunk completes it.

        Raises ``ChunkError`` for a malformed chunk or one inconsistent with its message and
        ``MessageTooLarge`` for a message over ``max_message_bytes`` or a budget; such a
        chunk changes nothing.
        """
        head, payload = parse_chunk(chunk)
        key = (source, head.message_id)
        p = self._pending.get(key)
        if p is None:
            if key in self._done:
                return None  # a late duplicate of a message already delivered
            self._check_size(head.total_length)
            p = _Pending(source, head.message_id, head.count, head.total_length, now)
            self._check_consistent(p, head, len(payload))
            self._admit(p)  # only a valid first chunk may displace a pending message
        else:
            self._check_consistent(p, head, len(payload))
        p.last_seen = now
        self._pending.move_to_end(key)
        src = self._sources[source]
        src.messages.move_to_end(head.message_id)
        grown = p.add(head.index, head.offset, payload)
        if grown is None:
            return None  # duplicate
        if p.n_received == p.count:
            self._drop(p)
            self._done[key] = now
            if len(self._done) > _MAX_DONE:
                self._done.popitem(last=False)
            return p.data
        p.charged += grown
        src.nbytes += grown
        self._nbytes += grown
        if src.nbytes > self.max_pending_bytes_per_source or self._nbytes > self.max_pending_bytes:
            self._make_room(p, src)
        return None

    def _check_size(self, total: int) -> None:
        if total > self.max_message_bytes:
            raise MessageTooLarge(
                f"chunked message of {total} bytes exceeds the limit of "
                f"{self.max_message_bytes} bytes"
            )
        budget = min(self.max_pending_bytes_per_source, self.max_pending_bytes)
        if total > budget:
            raise MessageTooLarge(
                f"chunked message of {total} bytes exceeds the reassembly budget of {budget} "
                "bytes (max_pending_bytes_per_source / max_pending_bytes)"
            )

    def _check_consistent(self, p: _Pending, head: ChunkHeader, n: int) -> None:
        if head.count != p.count or head.total_length != p.total:
            raise ChunkError(
                f"chunk says count={head.count} total={head.total_length}, its message says "
                f"count={p.count} total={p.total}"
            )
        last = head.index == p.count - 1
        if not last:
            size = n
        elif head.index:
            size, rem = divmod(head.offset, head.index)
            if rem:
                raise ChunkError(f"last chunk offset {head.offset} is not index x chunk size")
        else:
            size = p.total
        if p.chunk_payload is None:
            p.chunk_payload = size
        if (
            size != p.chunk_payload
            or head.offset != head.index * size
            or (p.count > 1 and (size == 0 or -(-p.total // size) != p.count))
        ):
            raise ChunkError(
                f"chunk {head.index} at offset {head.offset} with {n} bytes does not fit a chunk "
                f"size of {p.chunk_payload}"
            )
        if last and head.offset + n != p.total:
            raise ChunkError(f"last chunk ends at {head.offset + n}, message is {p.total} bytes")

    def _admit(self, p: _Pending) -> None:
        """Register a new message; its source's least recently fed ones make room for it."""
        src = self._sources.setdefault(p.source, _Source())
        while len(src.messages) >= self.max_pending:
            self._evict(next(iter(src.messages.values())))
        self._sources[p.source] = src  # evicting its last message unregistered it
        src.messages[p.message_id] = p
        self._pending[(p.source, p.message_id)] = p
        p.charged = p.footprint()  # its bookkeeping, before any chunk
        src.nbytes += p.charged
        self._nbytes += p.charged

    def _make_room(self, p: _Pending, src: _Source) -> None:
        """Evict until the budgets hold again, never ``p`` (just fed, so last in its source)."""
        while src.nbytes > self.max_pending_bytes_per_source and len(src.messages) > 1:
            self._evict(next(iter(src.messages.values())))
        while self._nbytes > self.max_pending_bytes:
            victim = max(
                (s for s in self._sources.values() if s is not src or len(s.messages) > 1),
                key=lambda s: s.nbytes,
                default=None,
            )
            if victim is None:
                return
            self._evict(next(iter(victim.messages.values())))

    def _drop(self, p: _Pending) -> None:
        del self._pending[(p.source, p.message_id)]
        src = self._sources[p.source]
        del src.messages[p.message_id]
        src.nbytes -= p.charged
        self._nbytes -= p.charged
        p.charged = 0
        if not src.messages:
            del self._sources[p.source]

    def _evict(self, p: _Pending) -> None:
        self._drop(p)
        self._evicted.append(p.to_partial())

    def is_pending(self, message_id: int, source: Hashable = None) -> bool:
        """Whether chunks of this message are held, waiting for the rest."""
        return (source, message_id) in self._pending

    def leading_bytes(self, message_id: int, source: Hashable = None) -> memoryview:
        """The bytes of a pending message from offset 0 up to its first missing chunk (empty
        if chunk 0 has not come): enough, say, to tell whether its header is there yet."""
        p = self._pending.get((source, message_id))
        return memoryview(b"") if p is None else p.leading_bytes()

    def missing_ranges(
        self, message_id: int, source: Hashable = None, limit: int = MAX_MISSING
    ) -> list[tuple[int, int]]:
        """The first ``limit`` runs of chunk indices not yet received for a pending message,
        as ``(start, stop)`` with ``stop`` exclusive, in order (for NACKs)."""
        p = self._pending.get((source, message_id))
        return [] if p is None else list(islice(p.gaps(), limit))

    def missing(
        self, message_id: int, source: Hashable = None, limit: int = MAX_MISSING
    ) -> list[int]:
        """The first ``limit`` indices of the chunks not yet received for a pending message."""
        p = self._pending.get((source, message_id))
        out: list[int] = []
        if p is None:
            return out
        for start, stop in p.gaps():
            out.extend(range(start, min(stop, start + limit - len(out))))
            if len(out) >= limit:
                break
        return out

    def expire(self, now: float) -> list[PartialMessage]:
        """Drop messages idle for ``timeout`` seconds (and any evicted); return what arrived."""
        out, self._evicted = self._evicted, []
        while self._done and now - next(iter(self._done.values())) >= self.timeout:
            self._done.popitem(last=False)
        while self._pending:
            p = next(iter(self._pending.values()))
            if now - p.last_seen < self.timeout:
                break
            self._drop(p)
            out.append(p.to_partial())
        return out
