"""Ring algorithms: reduce-scatter, allgather and their sequence, allreduce.

The flat array is cut into ``size`` segments; rank ``r`` sends to ``r + 1`` and receives from
``r - 1``. Reduce-scatter takes ``size - 1`` steps, after which rank ``r`` holds segment ``r``
reduced over every rank; allgather passes each reduced segment round in ``size - 1`` more.
Each rank sends and receives ``(size - 1) / size`` of the array in each phase: the
bandwidth-optimal ``2 (N - 1) / N x bytes`` for an allreduce. Segments move in pieces of at
most ``piece_bytes``, and a piece is sent on as soon as it is reduced, so the next link is
busy while this one still delivers the rest of the segment.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from tensorwire.collective.operation import Operation
from tensorwire.collective.reduce import combine

SPARES = 3
"""Buffers a reduce-scatter receives its pieces into, in turn (kept by the group)."""


def segment_bounds(n: int, size: int) -> list[int]:
    """Where each of ``size`` near-equal segments of ``n`` elements starts (and the end)."""
    return [i * n // size for i in range(size + 1)]


def pieces(bounds: list[int], segment: int, piece: int) -> Iterator[slice]:
    """The slices of segment ``segment`` that travel as one piece (``piece`` elements)."""
    start, end = bounds[segment], bounds[segment + 1]
    for lo in range(start, end, piece):
        yield slice(lo, min(lo + piece, end))


def piece_elements(flat: np.ndarray, piece_bytes: int) -> int:
    """Elements of ``flat`` in a piece of at most ``piece_bytes`` (at least one)."""
    return max(1, piece_bytes // max(flat.itemsize, 1))


def reduce_scatter(
    opn: Operation, flat: np.ndarray, op: str, rank: int, size: int, piece_bytes: int
) -> list[int]:
    """Reduce ``flat`` in place until segment ``rank`` holds every rank's values combined
    (the other segments hold partial results); returns the segment bounds."""
    bounds = segment_bounds(flat.size, size)
    if size == 1:
        return bounds
    piece = piece_elements(flat, piece_bytes)
    right, left = (rank + 1) % size, (rank - 1) % size
    for part in pieces(bounds, (rank - 1) % size, piece):
        opn.send(right, flat[part])
    incoming = [
        part for step in range(size - 1) for part in pieces(bounds, (rank - step - 2) % size, piece)
    ]
    # the last segment (this rank's own) goes no further
    forwarded_until = len(incoming) - len(list(pieces(bounds, rank, piece)))
    # pieces arrive in the group's spare buffers taken in turn, each expected again once
    # reduced: no fresh array (and its page faults) per piece. One that began to arrive
    # before it was expected is reduced from where it landed.
    spare = opn.spares(min(SPARES, len(incoming)), min(piece, flat.size), flat.dtype)
    for i, part in enumerate(incoming[: len(spare)]):
        opn.expect(left, spare[i][: part.stop - part.start])
    for i, part in enumerate(incoming):
        acc = flat[part]
        combine(op, acc, opn.recv(left, size=acc.size))
        if i + len(spare) < len(incoming):
            after = incoming[i + len(spare)]
            opn.expect(left, spare[i % len(spare)][: after.stop - after.start])
        if i < forwarded_until:
            opn.send(right, acc)
    opn.wait_sent()
    return bounds


def allgather(
    opn: Operation, flat: np.ndarray, rank: int, size: int, piece_bytes: int, bounds: list[int]
) -> None:
    """Fill every segment of ``flat`` from the rank that holds it (rank ``r``, segment ``r``)."""
    if size == 1:
        return
    piece = piece_elements(flat, piece_bytes)
    right, left = (rank + 1) % size, (rank - 1) % size
    incoming = [
        part for step in range(size - 1) for part in pieces(bounds, (rank - step - 1) % size, piece)
    ]
    for part in incoming:
        opn.expect(left, flat[part])
    for part in pieces(bounds, rank, piece):
        opn.send(right, flat[part])
    # the last segment to arrive (the right neighbour's) goes no further
    forwarded_until = len(incoming) - len(list(pieces(bounds, (rank + 1) % size, piece)))
    for i, part in enumerate(incoming):
        opn.recv(left, into=flat[part])
        if i < forwarded_until:
            opn.send(right, flat[part])
    opn.wait_sent()


def allreduce(
    opn: Operation, flat: np.ndarray, op: str, rank: int, size: int, piece_bytes: int
) -> None:
    """Combine ``flat`` over every rank, in place: reduce-scatter, then allgather."""
    bounds = reduce_scatter(opn, flat, op, rank, size, piece_bytes)
    allgather(opn, flat, rank, size, piece_bytes, bounds)
