"""Timed, bounded reassembly of what a broker delivers: chunks in, whole messages out, per
source, each message id once, with the time its first chunk came (for transfer records)."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Hashable
from typing import Any

from tensorwire.errors import ChunkError, MessageTooLarge
from tensorwire.wire import ChunkReassembler, parse_chunk

MAX_PENDING = 8  # messages one source may have half-arrived (a sender sends one at a time)
MAX_SEEN = 1 << 14  # ids of one-chunk messages remembered to drop a repeat


class Inflow:
    """A :class:`ChunkReassembler` (bounded per source and in total) that also dates messages.

    One-chunk messages, the common small ones, skip the reassembler (no copy) and a bounded set
    of their ids drops a repeat (a broker sends again what it is not sure we got); longer ones
    go through it, whose done-keys drop theirs. Fed from a network thread and expired from
    another, hence the lock. Times are ``time.perf_counter()``.
    """

    def __init__(self, max_message_bytes: int, timeout: float) -> None:
        self.timeout = timeout
        self._chunks = ChunkReassembler(
            max_message_bytes=max_message_bytes, timeout=timeout, max_pending=MAX_PENDING
        )
        self._seen: OrderedDict[tuple[Hashable, int], None] = OrderedDict()
        self._first: dict[tuple[Hashable, int], float] = {}  # when a pending one began to arrive
        self._lock = threading.Lock()

    def feed(self, payload: Any, source: Hashable) -> tuple[Any, float] | None:
        """The whole message and its first chunk's arrival time, once ``payload`` completes a
        message not seen before; ``ChunkError`` / ``MessageTooLarge`` for a bad chunk."""
        now = time.perf_counter()
        head, body = parse_chunk(payload)
        key = (source, head.message_id)
        with self._lock:
            if head.count == 1:
                if len(body) != head.total_length:
                    raise ChunkError(f"single chunk of {len(body)} bytes, says {head.total_length}")
                if head.total_length > self._chunks.max_message_bytes:
                    raise MessageTooLarge(
                        f"message of {head.total_length} bytes exceeds the limit of "
                        f"{self._chunks.max_message_bytes} bytes"
                    )
                if key in self._seen:
                    return None
                self._seen[key] = None
                if len(self._seen) > MAX_SEEN:
                    self._seen.popitem(last=False)
                return body, now
            data = self._chunks.feed(payload, now, source)
            if data is None:
                if self._chunks.is_pending(head.message_id, source):  # not a late duplicate
                    self._first.setdefault(key, now)
                return None
            return data, self._first.pop(key, now)

    def expire(self) -> list[tuple[Hashable, ChunkError]]:
        """Drop the messages whose chunks stopped coming (or that were evicted to make room);
        return ``(source, error)`` for each."""
        out = []
        with self._lock:
            for partial in self._chunks.expire(time.perf_counter()):
                self._first.pop((partial.source, partial.message_id), None)
                lost = sum(n for _, n in partial.missing)
                error = ChunkError(
                    f"message {partial.message_id:#x} dropped: {lost} of {partial.total_length} "
                    f"bytes never arrived within {self.timeout} s"
                )
                out.append((partial.source, error))
        return out
