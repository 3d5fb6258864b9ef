"""Reassembly of chunked messages, sans-IO: the caller passes the clock (``now``, seconds)
so timeouts are testable without sleeping.

What a reassembler holds is bounded by the bytes that arrived, never by what a chunk
declares: a pending message holds at most 9x its arrived payload bytes + 256 bytes per held
chunk + 2 KiB, whatever it declares (``pending.py`` says how); that footprint is what the
budgets count:

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

from collections import OrderedDict
from collections.abc import Hashable
from itertools import islice
from typing import Any

import numpy as np

from tensorwire.errors import ChunkError, MessageTooLarge
from tensorwire.wire.chunks.chunk import ChunkHeader, parse_chunk
from tensorwire.wire.chunks.pending import PartialMessage, Pending

MAX_MISSING = 1 << 16  # default cap on the indices or ranges ``missing*`` return
_MAX_DONE = 1 << 16  # completed message keys remembered at most (bounds memory)


class _Source:
    """The messages one source has pending (least recently fed first) and their bytes."""

    __slots__ = ("messages", "nbytes")

    def __init__(self) -> None:
        self.messages: OrderedDict[int, Pending] = OrderedDict()
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
        self._pending: OrderedDict[tuple[Hashable, int], Pending] = OrderedDict()
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
            p = Pending(source, head.message_id, head.count, head.total_length, now)
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

    def _check_consistent(self, p: Pending, head: ChunkHeader, n: int) -> None:
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

    def _admit(self, p: Pending) -> None:
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

    def _make_room(self, p: Pending, src: _Source) -> None:
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

    def _drop(self, p: Pending) -> None:
        del self._pending[(p.source, p.message_id)]
        src = self._sources[p.source]
        del src.messages[p.message_id]
        src.nbytes -= p.charged
        self._nbytes -= p.charged
        p.charged = 0
        if not src.messages:
            del self._sources[p.source]

    def _evict(self, p: Pending) -> None:
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
