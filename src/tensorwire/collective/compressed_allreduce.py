"""A compressed allreduce: the array it adds in, the algorithm for the method, the
error-feedback memory a group keeps for top-k and random-k."""

from __future__ import annotations

import numpy as np

from tensorwire.codecs.lossy import ErrorFeedback
from tensorwire.codecs.lossy.feedback import FeedbackSnapshot
from tensorwire.collective import quantised_ring, sparse_sum
from tensorwire.collective.compression import Compression, work_dtype
from tensorwire.collective.operation import Operation
from tensorwire.wire.dtypes import name_of_dtype


class FeedbackMemory:
    """A group's error-feedback residuals, per compression and tensor key, across calls."""

    def __init__(self) -> None:
        self._by_compression: dict[Compression, ErrorFeedback] = {}

    def of(self, compression: Compression) -> ErrorFeedback:
        """The memory of ``compression`` (made on first use)."""
        feedback = self._by_compression.get(compression)
        if feedback is None:
            feedback = ErrorFeedback(compression.codec, min_size=0)
            self._by_compression[compression] = feedback
        return feedback

    def snapshot(self) -> dict[Compression, FeedbackSnapshot]:
        """A copy of every residual, for :meth:`restore` (an elastic group's redone call)."""
        return {c: f.snapshot() for c, f in self._by_compression.items()}

    def restore(self, snapshot: dict[Compression, FeedbackSnapshot]) -> None:
        for compression, saved in snapshot.items():
            self._by_compression[compression].restore(saved)


def allreduce(
    opn: Operation,
    flat: np.ndarray,
    compression: Compression,
    memory: FeedbackMemory,
    key: str,
    rank: int,
    size: int,
    piece_bytes: int,
) -> None:
    """Sum the float array ``flat`` over every rank, in place, compressed on the wire; the
    sums are kept in float32 (float64 for float64 arrays) and rounded to ``flat``'s dtype once."""
    dtype = work_dtype(flat.dtype)
    work = flat if flat.dtype == dtype else flat.astype(dtype)
    codec = compression.codec(name_of_dtype(dtype))
    if compression.sparse:
        sparse_sum.allreduce(opn, work, memory.of(compression), key, codec, rank, size)
    else:
        quantised_ring.allreduce(opn, work, codec, rank, size, piece_bytes)
    if work is not flat:
        flat[...] = work
