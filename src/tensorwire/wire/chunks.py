"""Chunking for size-capped transports (MQTT, AMQP, UDP datagrams, gRPC) and reassembly.

A chunk is a 40-byte header followed by a slice of the encoded message::

    magic "TWCK" | version u8 | flags u8 | reserved u16 | message_id u64
    | index u32 | count u32 | offset u64 | total_length u64 | payload ...

Every chunk but the last carries exactly ``chunk_payload`` bytes at ``offset = index *
chunk_payload``; the last carries the rest. The reassembler is sans-IO: the caller passes
the clock (``now``, seconds) so timeouts are testable without sleeping.
"""

from __future__ import annotations

import random
import struct
from collections import OrderedDict
from collections.abc import Hashable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tensorwire.errors import ChunkError, MessageTooLarge
from tensorwire.wire.encoder import _as_byte_view

CHUNK_MAGIC = b"TWCK"
CHUNK_VERSION = 1
CHUNK_HEADER = struct.Struct("<4sBBHQIIQQ")
CHUNK_HEADER_SIZE = CHUNK_HEADER.size  # 40
_MAX_DONE = 1 << 16  # completed message keys remembered at most (bounds memory)


def new_message_id() -> int:
    """A random 64-bit message id (unique per sender with overwhelming probability)."""
    return random.getrandbits(64)


@dataclass(frozen=True)
class ChunkHeader:
    message_id: int
    index: int
    count: int
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


@dataclass
class PartialMessage:
    """A message whose chunks stopped coming: ``missing`` holds (offset, length) byte ranges."""

    source: Hashable
    message_id: int
    data: np.ndarray
    missing: list[tuple[int, int]]


@dataclass
class _Pending:
    data: np.ndarray
    count: int
    total: int
    received: np.ndarray  # bool per chunk index
    chunk_payload: int | None
    last_seen: float
    n_received: int = 0


class ChunkReassembler:
    """Collects chunks per ``(source, message_id)`` into whole messages.

    Handles reordering and duplicates; a message that gets no chunk for ``timeout``
    seconds is dropped by :meth:`expire`, which returns what arrived of it. At most
    ``max_pending`` messages are held at once (the oldest is expired to make room) and
    none larger than ``max_message_bytes``.
    """

    def __init__(
        self,
        *,
        max_message_bytes: int = 16 << 30,
        timeout: float = 30.0,
        max_pending: int = 64,
    ) -> None:
        self.max_message_bytes = max_message_bytes
        self.timeout = timeout
        self.max_pending = max_pending
        self._pending: dict[tuple[Hashable, int], _Pending] = {}
        self._evicted: list[PartialMessage] = []
        # Keys of messages completed in the last ``timeout`` seconds: their late duplicate
        # chunks are dropped instead of opening a new message that would expire as a loss.
        self._done: OrderedDict[tuple[Hashable, int], float] = OrderedDict()

    def __len__(self) -> int:
        return len(self._pending)

    def feed(self, chunk: Any, now: float, source: Hashable = None) -> np.ndarray | None:
        """Add one chunk; return the whole message (uint8 array) when this chunk completes it."""
        head, payload = parse_chunk(chunk)
        key = (source, head.message_id)
        p = self._pending.get(key)
        new = p is None
        if p is None:
            if key in self._done:
                return None  # a late duplicate of a message already delivered
            if head.total_length > self.max_message_bytes:
                raise MessageTooLarge(
                    f"chunked message of {head.total_length} bytes exceeds the limit of "
                    f"{self.max_message_bytes} bytes"
                )
            p = _Pending(
                data=np.empty(head.total_length, np.uint8),
                count=head.count,
                total=head.total_length,
                received=np.zeros(head.count, np.bool_),
                chunk_payload=None,
                last_seen=now,
            )
        self._check_consistent(p, head, len(payload))
        if new:  # only a valid first chunk may displace a pending message
            while len(self._pending) >= self.max_pending:
                oldest = min(self._pending, key=lambda k: self._pending[k].last_seen)
                self._evicted.append(self._to_partial(oldest, self._pending.pop(oldest)))
            self._pending[key] = p
        p.last_seen = now
        if p.received[head.index]:
            return None  # duplicate
        p.data[head.offset : head.offset + len(payload)] = payload
        p.received[head.index] = True
        p.n_received += 1
        if p.n_received == p.count:
            del self._pending[key]
            self._done[key] = now
            if len(self._done) > _MAX_DONE:
                self._done.popitem(last=False)
            return p.data
        return None

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

    def leading_bytes(self, message_id: int, source: Hashable = None) -> memoryview:
        """The bytes of a pending message from offset 0 up to its first missing chunk (empty
        if chunk 0 has not come): enough, say, to tell whether its header is there yet."""
        p = self._pending.get((source, message_id))
        if p is None or not p.received.size or not p.received[0]:
            return memoryview(b"")
        gaps = np.flatnonzero(~p.received)
        if not gaps.size:
            return memoryview(p.data)
        return memoryview(p.data)[: int(gaps[0]) * (p.chunk_payload or p.total)]

    def missing(self, message_id: int, source: Hashable = None) -> list[int]:
        """Indices of the chunks not yet received for a pending message (for NACKs)."""
        p = self._pending.get((source, message_id))
        return [] if p is None else np.flatnonzero(~p.received).tolist()

    def expire(self, now: float) -> list[PartialMessage]:
        """Drop messages idle for ``timeout`` seconds (and any evicted); return what arrived."""
        out, self._evicted = self._evicted, []
        while self._done and now - next(iter(self._done.values())) >= self.timeout:
            self._done.popitem(last=False)
        for key in [k for k, p in self._pending.items() if now - p.last_seen >= self.timeout]:
            out.append(self._to_partial(key, self._pending.pop(key)))
        return out

    def _to_partial(self, key: tuple[Hashable, int], p: _Pending) -> PartialMessage:
        size = p.chunk_payload or p.total
        ranges = []
        for index in np.flatnonzero(~p.received).tolist():
            start = index * size
            ranges.append((start, min(size, p.total - start)))
        return PartialMessage(key[0], key[1], p.data, ranges)
