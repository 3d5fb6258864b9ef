"""What a hub or channel keeps of its traffic: a bounded log of transfer records, a bounded log
of rejected messages, and what a broadcast reached."""

from __future__ import annotations

import operator
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, fields
from typing import Any

MAX_RECORDS = 100_000  # transfer records kept per endpoint (older ones are only counted)
MAX_ERRORS = 1_000  # rejected messages kept per hub (all are counted, by type)


@dataclass(slots=True)
class TransferRecord:
    """One message sent or received: sizes in bytes, times in seconds.

    ``wall_s`` is, for a send, from the start of encoding to the last byte handed to the
    transport; for a receive, from the first byte arriving to the last tensor decoded.
    ``e2e_s`` (receives only) runs from the sender's start of encoding, by the two clocks.
    """

    direction: str  # "send" or "recv"
    peer: str
    protocol: str
    kind: str
    tensors: int
    bytes_raw: int
    bytes_encoded: int
    codecs: str
    encode_s: float
    wire_s: float
    decode_s: float
    wall_s: float
    e2e_s: float | None
    started_at: float  # unix seconds

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


_RECORD_VALUES = operator.attrgetter(*(f.name for f in fields(TransferRecord)))
RECENT_RECORDS = 64  # the newest records a RecordLog keeps as the objects it was given


class RecordLog:
    """The last ``maxlen`` transfer records, oldest first, and a count of all ever added.

    ``mark()`` then ``since(mark)`` gives the records added in between (as many as are still
    kept); ``subscribe(fn)`` streams every record out as it is made (from transport threads).

    Records are kept as tuples of their values, which the garbage collector stops tracking
    (a full log of objects cost a 4 KiB message ~4 us in collections), and made records again
    when read; the newest ``RECENT_RECORDS`` are read back as the very objects appended.
    """

    def __init__(self, maxlen: int = MAX_RECORDS) -> None:
        self._items: deque[tuple[Any, ...]] = deque(maxlen=maxlen)
        self._recent: deque[TransferRecord] = deque(maxlen=RECENT_RECORDS)
        self.total = 0
        self._subscribers: list[Callable[[TransferRecord], None]] = []

    def append(self, rec: TransferRecord) -> None:
        self.add(rec, _RECORD_VALUES(rec))

    def add(self, rec: TransferRecord, values: tuple[Any, ...]) -> None:
        """:meth:`append` of a record made from ``values`` (its fields in order)."""
        self._items.append(values)
        self._recent.append(rec)
        self.total += 1
        for fn in self._subscribers:
            fn(rec)

    def _records(self, values: list[tuple[Any, ...]]) -> list[TransferRecord]:
        """Records of the newest ``len(values)`` items, given as ``values``."""
        recent = list(self._recent)
        k = min(len(recent), len(values))
        return [TransferRecord(*v) for v in values[: len(values) - k]] + recent[len(recent) - k :]

    def subscribe(self, fn: Callable[[TransferRecord], None]) -> None:
        self._subscribers.append(fn)

    def mark(self) -> int:
        return self.total

    def since(self, mark: int) -> list[TransferRecord]:
        n = min(self.total - mark, len(self._items))
        return self._records(list(self._items)[len(self._items) - n :]) if n > 0 else []

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[TransferRecord]:
        return iter(self._records(list(self._items)))

    def __getitem__(self, index: int) -> TransferRecord:
        n = len(self._items)
        i = index + n if index < 0 else index
        if not 0 <= i < n:
            raise IndexError("record index out of range")
        if n - i <= len(self._recent):
            return self._recent[i - n]
        return TransferRecord(*self._items[i])

    def __bool__(self) -> bool:
        return bool(self._items)


class ErrorLog:
    """``(peer, exception)`` of the last ``maxlen`` rejected messages; ``counts`` has them all
    by exception type."""

    def __init__(self, maxlen: int = MAX_ERRORS) -> None:
        self._items: deque[tuple[str, Exception]] = deque(maxlen=maxlen)
        self.counts: dict[str, int] = {}

    def append(self, item: tuple[str, Exception]) -> None:
        # a kept traceback would pin its frames, and with them a stranger's buffers
        self._items.append((item[0], item[1].with_traceback(None)))
        name = type(item[1]).__name__
        self.counts[name] = self.counts.get(name, 0) + 1

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[tuple[str, Exception]]:
        return iter(list(self._items))

    def __getitem__(self, index: int) -> tuple[str, Exception]:
        return self._items[index]

    def __bool__(self) -> bool:
        return bool(self._items)


class BroadcastResult(dict[str, TransferRecord]):
    """``broadcast``'s result: a record per client reached; ``failed`` maps each client it did
    not reach (not connected, gone, or past its deadline) to the error."""

    def __init__(self) -> None:
        super().__init__()
        self.failed: dict[str, Exception] = {}
