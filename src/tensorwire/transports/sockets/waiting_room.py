"""Connections a hub has accepted that have not said their first word yet, oldest first,
bounded in all and per source address: a new one pushes out the oldest (of its own source
when that source is at its bound), so whoever opens idle connections pushes out their own,
and a device, which speaks at once, gets in."""

from __future__ import annotations

from collections.abc import Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


class WaitingRoom(Generic[K]):
    """At most ``total`` entries, at most ``per_source`` of them from one source."""

    def __init__(self, total: int, per_source: int) -> None:
        self.total = total
        self.per_source = per_source
        self._since: dict[K, tuple[Hashable, float]] = {}  # in arrival order
        self._by_source: dict[Hashable, dict[K, None]] = {}  # each in arrival order

    def __len__(self) -> int:
        return len(self._since)

    def __contains__(self, key: object) -> bool:
        return key in self._since

    def add(self, key: K, source: Hashable, now: float) -> list[tuple[K, str]]:
        """Let ``key`` in; return the entries pushed out to make room, each with why."""
        pushed: list[tuple[K, str]] = []
        same = self._by_source.get(source)
        if same is not None and len(same) >= self.per_source:
            oldest = next(iter(same))
            pushed.append((oldest, f"{self.per_source} newer ones from its address came"))
        elif len(self._since) >= self.total:
            pushed.append((next(iter(self._since)), f"{self.total} newer ones came"))
        for old, _ in pushed:
            self.remove(old)
        self._since[key] = (source, now)
        self._by_source.setdefault(source, {})[key] = None
        return pushed

    def would_push(self, source: Hashable) -> float | None:
        """When the entry that a newcomer from ``source`` would push out came (None: there
        is room for it)."""
        same = self._by_source.get(source)
        if same is not None and len(same) >= self.per_source:
            return self._since[next(iter(same))][1]
        if len(self._since) >= self.total:
            return next(iter(self._since.values()))[1]
        return None

    def remove(self, key: K) -> bool:
        """Take ``key`` out (it spoke, or ended); False if it was not in."""
        entry = self._since.pop(key, None)
        if entry is None:
            return False
        source = entry[0]
        same = self._by_source[source]
        del same[key]
        if not same:
            del self._by_source[source]
        return True

    def oldest_since(self) -> float | None:
        """When the oldest entry came, or None when empty."""
        for _, since in self._since.values():
            return since
        return None

    def older_than(self, cutoff: float) -> list[K]:
        """The entries that came before ``cutoff``."""
        old = []
        for key, (_, since) in self._since.items():  # oldest first
            if since >= cutoff:
                break
            old.append(key)
        return old
