"""Recursive doubling: an allreduce in ``log2(N)`` steps, for small tensors.

At step ``k`` rank ``r`` swaps its whole array with rank ``r XOR 2**k`` and combines the
two; after ``log2(N)`` steps every rank holds the result. A group whose size is not a power
of two first folds its first ``2 * extra`` ranks pairwise (the even one hands its values to
the odd one, which takes part) and hands the result back at the end.
"""

from __future__ import annotations

import numpy as np

from tensorwire.collective.operation import Operation
from tensorwire.collective.reduce import combine


def allreduce(opn: Operation, flat: np.ndarray, op: str, rank: int, size: int) -> None:
    """Combine ``flat`` over every rank, in place."""
    if size == 1:
        return
    opn.read_inline(flat.nbytes)
    power = 1 << (size.bit_length() - 1)  # the largest power of two <= size
    extra = size - power
    if rank < 2 * extra and rank % 2 == 0:  # folded: hand over, then wait for the result
        opn.send(rank + 1, flat)
        opn.recv(rank + 1, into=flat)
        opn.wait_sent()
        return
    if rank < 2 * extra:
        combine(op, flat, opn.recv(rank - 1, size=flat.size))
        virtual = rank // 2
    else:
        virtual = rank - extra
    mask = 1
    while mask < power:
        partner_virtual = virtual ^ mask
        partner = partner_virtual * 2 + 1 if partner_virtual < extra else partner_virtual + extra
        opn.send(partner, flat.copy())  # a snapshot: flat changes before the send is out
        combine(op, flat, opn.recv(partner, size=flat.size))
        mask <<= 1
    if rank < 2 * extra:
        opn.send(rank - 1, flat)
    opn.wait_sent()
