"""Allreduce by top-k or random-k with error feedback: every rank's pieces, summed locally.

A ring's reduce-scatter cannot carry sparse pieces sensibly: the sum of two ranks' top-k
has up to twice the entries, so pieces would grow at every hop (or be cut again, losing
values no rank keeps a residual of). So, as sparse allreduces usually do, each rank
compresses its whole tensor once, through :class:`tensorwire.codecs.lossy.ErrorFeedback`
(what it drops is kept, per tensor key, and added to its next call), sends the payload to
every other rank, and every rank decompresses all ``N`` payloads and adds them in rank
order in float32 (float64 for float64 tensors): the same operands in the same order, so
every rank ends bit-identical. Each rank sends ``(N - 1) x`` its payload, top-k's
``r x (itemsize + 2)`` bytes per element at ratio ``r``, where the exact ring sends
``2 (N - 1) / N x itemsize``: fewer bytes while ``r < 2 itemsize / (N (itemsize + 2))``
(float32: ``r < 1.33 / N``, a third at 4 ranks).
"""

from __future__ import annotations

import numpy as np

from tensorwire.codecs.lossy import ErrorFeedback, LossyCodec
from tensorwire.collective.operation import Operation


def allreduce(
    opn: Operation,
    work: np.ndarray,
    feedback: ErrorFeedback,
    key: str,
    decoder: LossyCodec,
    rank: int,
    size: int,
) -> None:
    """Sum ``work`` (float32 or float64) over every rank, in place, each rank's part
    compressed by ``feedback`` with the residual kept under ``key``; ``decoder`` is the
    compressor for ``work``'s dtype (its decoding needs no state)."""
    if size == 1:
        return
    chain = feedback(key, work)
    payload = chain[0].encode(work) if chain else work
    if payload.nbytes >= work.nbytes:  # as the wire encoder does, and feedback settles it so
        payload = work
    for peer in range(size):
        if peer != rank:
            opn.send(peer, payload)
    total = np.zeros_like(work)
    decoded = np.empty_like(work)
    for peer in range(size):
        piece = payload if peer == rank else opn.recv(peer)
        if piece.dtype == np.uint8:
            decoder.decode(piece, out=decoded)
            piece = decoded
        total += piece.reshape(total.shape)
    opn.wait_sent()
    work[...] = total
