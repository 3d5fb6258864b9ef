"""The soonest of many peers' timers, each re-armed as it changes: an I/O thread with
thousands of peers finds the ones due without looking at the others (as asyncio's
``call_at`` heap does). Not thread-safe: one I/O thread owns it."""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)

COMPACT_FACTOR = 4
"""The heap is rebuilt from the live timers once it holds this many times more entries
(stale ones from re-arming) than there are timers, plus a few: its size stays O(timers)."""


class TimerHeap(Generic[K]):
    """One timer per key (a time, any clock, or none); :meth:`due` pops the keys whose
    time has come. Re-arming leaves the old entry in the heap, skipped when it surfaces."""

    def __init__(self) -> None:
        self._at: dict[K, float] = {}  # each key's current time
        self._heap: list[tuple[float, int, K]] = []
        self._seq = itertools.count()  # ties never compare keys

    def __len__(self) -> int:
        return len(self._at)

    def arm(self, key: K, when: float | None) -> None:
        """Set ``key``'s timer to ``when`` (None: no timer)."""
        if when is None:
            self._at.pop(key, None)
            return
        if self._at.get(key) == when:
            return
        self._at[key] = when
        heapq.heappush(self._heap, (when, next(self._seq), key))
        if len(self._heap) > COMPACT_FACTOR * len(self._at) + 64:
            self._heap = [(t, next(self._seq), k) for k, t in self._at.items()]
            heapq.heapify(self._heap)

    def discard(self, key: K) -> None:
        """Forget ``key``'s timer."""
        self._at.pop(key, None)

    def _drop_stale(self) -> None:
        heap = self._heap
        while heap and self._at.get(heap[0][2]) != heap[0][0]:
            heapq.heappop(heap)

    def soonest(self) -> float | None:
        """The earliest time armed, or None."""
        self._drop_stale()
        return self._heap[0][0] if self._heap else None

    def due(self, now: float) -> list[K]:
        """Pop and return the keys whose time is ``now`` or earlier (their timers are unset)."""
        out: list[K] = []
        heap = self._heap
        while True:
            self._drop_stale()
            if not heap or heap[0][0] > now:
                return out
            _, _, key = heapq.heappop(heap)
            del self._at[key]
            out.append(key)
