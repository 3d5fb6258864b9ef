"""Broadcast from a root: a binomial tree for small tensors, a pipelined chain for large.

The tree reaches every rank in ``ceil(log2(N))`` steps, each rank sending the whole array
to up to ``log2(N)`` others. The chain passes the array along the ring from the root in
pieces of at most ``piece_bytes``, each forwarded as soon as it arrives: every rank receives
and sends the array once, and the pieces keep every link of the chain busy.
"""

from __future__ import annotations

import itertools

import numpy as np

from tensorwire.collective.operation import Operation
from tensorwire.collective.ring import segment_bounds


def tree(opn: Operation, flat: np.ndarray, root: int, rank: int, size: int) -> None:
    """Fill ``flat`` on every rank with the root's (binomial tree)."""
    opn.read_inline(flat.nbytes)
    virtual = (rank - root) % size
    mask = 1
    while mask < size:
        if virtual & mask:
            opn.recv((rank - mask) % size, into=flat)
            break
        mask <<= 1
    mask >>= 1
    while mask > 0:
        if virtual + mask < size:
            opn.send((rank + mask) % size, flat)
        mask >>= 1
    opn.wait_sent()


def chain(
    opn: Operation, flat: np.ndarray, root: int, rank: int, size: int, piece_bytes: int
) -> None:
    """Fill ``flat`` on every rank with the root's (pipelined chain along the ring)."""
    if size == 1:
        return
    pieces = max(1, flat.size * flat.itemsize // piece_bytes)
    bounds = segment_bounds(flat.size, pieces)
    parts = [slice(lo, hi) for lo, hi in itertools.pairwise(bounds) if hi > lo]
    right, left = (rank + 1) % size, (rank - 1) % size
    last = (root - 1) % size
    if rank != root:
        for part in parts:
            opn.expect(left, flat[part])
    for part in parts:
        if rank != root:
            opn.recv(left, into=flat[part])
        if rank != last:
            opn.send(right, flat[part])
    opn.wait_sent()
