"""The ring allreduce with every piece compressed on the wire (fp16, bf16, int8).

As :func:`tensorwire.collective.ring.allreduce`, in the same segments and pieces, but:

- **reduce-scatter**: a rank sends its partial sum of a piece compressed; the next rank
  decompresses it to float32 (float64 for float64 tensors) *before* adding its own values,
  and sends that float32 partial sum on, compressed afresh (int8: new scales per block, so
  a scale always fits the sum it carries). Partial sums are never added in the compressed
  form, and each hop's error is that of one compression of the partial sum.
- **allgather**: the rank that holds a segment's final sums compresses them once; every rank,
  that one included, keeps the decompressed values, and the compressed bytes are passed on
  unchanged. So every rank ends bit-identical, and the result has at most ``N`` compression
  errors (``N - 1`` hops and the final one), each relative to the partial sum's magnitude.
"""

from __future__ import annotations

import numpy as np

from tensorwire.codecs.lossy import LossyCodec
from tensorwire.collective.operation import Operation
from tensorwire.collective.ring import piece_elements, pieces, segment_bounds


def allreduce(
    opn: Operation, work: np.ndarray, codec: LossyCodec, rank: int, size: int, piece_bytes: int
) -> None:
    """Sum ``work`` (float32 or float64, ``codec``'s dtype) over every rank, in place, with
    every piece sent through ``codec`` (``piece_bytes``: uncompressed bytes per piece)."""
    if size == 1:
        return
    bounds = segment_bounds(work.size, size)
    piece = piece_elements(work, piece_bytes)
    scratch = np.empty(min(piece, work.size), work.dtype)
    right, left = (rank + 1) % size, (rank - 1) % size
    for part in pieces(bounds, (rank - 1) % size, piece):
        opn.send(right, codec.encode(work[part]))
    for step in range(size - 1):
        forward = step < size - 2
        for part in pieces(bounds, (rank - step - 2) % size, piece):
            acc = work[part]
            received = scratch[: acc.size]
            codec.decode(opn.recv(left), out=received)
            acc += received  # in float32: the partial sum is never added compressed
            if forward:
                opn.send(right, codec.encode(acc))
    for part in pieces(bounds, rank, piece):
        payload = codec.encode(work[part])
        codec.decode(payload, out=work[part])  # keep what the others will have
        opn.send(right, payload)
    # the last segment to arrive (the right neighbour's) goes no further
    last = (rank + 1) % size
    for step in range(size - 1):
        segment = (rank - step - 1) % size
        for part in pieces(bounds, segment, piece):
            payload = opn.recv(left)
            codec.decode(payload, out=work[part])
            if segment != last:
                opn.send(right, payload)
    opn.wait_sent()
