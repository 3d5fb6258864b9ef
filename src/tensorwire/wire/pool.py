"""Reusable scratch buffers, so each round's compressed payloads land in memory already mapped."""

from __future__ import annotations

import threading
from collections import OrderedDict

import numpy as np


def size_class(nbytes: int) -> int:
    """Round up to one of 8 steps per power of two (at most 12.5 % slack), 4 KiB minimum."""
    if nbytes <= 4096:
        return 4096
    step = 1 << max((nbytes - 1).bit_length() - 4, 0)
    return -(-nbytes // step) * step


class BufferPool:
    """Hands out uint8 arrays of an exact length, backed by blocks kept for reuse.

    At most ``max_cached_bytes`` of idle blocks are kept; the least recently released go first.
    Thread-safe.
    """

    def __init__(self, max_cached_bytes: int = 1 << 30) -> None:
        self.max_cached_bytes = max_cached_bytes
        self._free: OrderedDict[int, list[np.ndarray]] = OrderedDict()
        self._cached = 0
        self._lock = threading.Lock()

    @property
    def cached_bytes(self) -> int:
        """Bytes held in idle blocks."""
        return self._cached

    def acquire(self, nbytes: int) -> np.ndarray:
        """Return a writable uint8 array of ``nbytes`` (contents undefined)."""
        cls = size_class(nbytes)
        with self._lock:
            blocks = self._free.get(cls)
            if blocks:
                block = blocks.pop()
                self._cached -= block.nbytes
                if not blocks:
                    del self._free[cls]
                return block[:nbytes]
        return np.empty(cls, np.uint8)[:nbytes]

    def release(self, arr: np.ndarray) -> None:
        """Give back an array from :meth:`acquire`; the caller must not use it afterwards."""
        block = arr if arr.base is None else arr.base
        if not isinstance(block, np.ndarray) or block.nbytes != size_class(block.nbytes):
            return
        with self._lock:
            self._free.setdefault(block.nbytes, []).append(block)
            self._free.move_to_end(block.nbytes)
            self._cached += block.nbytes
            while self._cached > self.max_cached_bytes and self._free:
                cls, blocks = next(iter(self._free.items()))
                self._cached -= blocks.pop().nbytes
                if not blocks:
                    del self._free[cls]
