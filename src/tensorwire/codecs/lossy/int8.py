"""``int8``: symmetric 8-bit quantisation, one scale per block, round to nearest.

The tensor's ``n`` elements are cut into blocks of ``block_size`` (the last may be
shorter). Block ``b`` has ``scale_b = max|x| / 127`` over the block (stored as float32)
and each of its elements is sent as ``q = clip(rint(x / scale_b), -127, 127)``, decoded as
``x̂ = q × scale_b``. The error is ``|x - x̂| <= scale_b / 2`` (up to float rounding:
about 1e-5 of ``scale_b``, plus the rounding of ``x̂`` to a 16-bit ``dtype``), so never
more than half the per-tensor scale ``max|x| / 127``.

Payload (little-endian)::

    offset      size        field
    0           8   u64     n        elements of the tensor
    8           4 × nb      f32[nb]  scale of each block, finite and >= 0; nb = ceil(n / block_size)
    8 + 4·nb    n   i8[n]   q        the quantised elements, in [-127, 127], in tensor order

The payload is exactly ``8 + 4 × nb + n`` bytes, with ``block_size`` from the config.
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np

from tensorwire.codecs.abc import check_int
from tensorwire.codecs.lossy.base import (
    LossyCodec,
    block_rows,
    block_starts,
    payload_length,
    read_fields,
    read_scales,
    require_finite,
)
from tensorwire.errors import CodecDataError

HEADER = struct.Struct("<Q")
"""n: elements of the tensor."""

DEFAULT_BLOCK_SIZE = 4096
"""Elements per scale: the 4 bytes of a scale add 0.1% to the payload."""
MAX_BLOCK_SIZE = 1 << 31


class Int8(LossyCodec):
    """Quantises elements to int8 with one symmetric scale per ``block_size`` elements."""

    codec_id = "int8"

    def __init__(self, dtype: str, block_size: int = DEFAULT_BLOCK_SIZE) -> None:
        super().__init__(dtype)
        self.block_size = check_int("block_size", block_size, 1, MAX_BLOCK_SIZE)

    def _encode(self, x: np.ndarray) -> np.ndarray:
        n, nblocks = x.size, -(-x.size // self.block_size)
        work = x.astype(self._work, copy=False)
        scales = np.zeros(nblocks, dtype=np.float32)
        if n:
            amax = np.maximum.reduceat(np.abs(work), block_starts(n, self.block_size))
            scales[:] = amax / 127
        require_finite(scales, self.codec_id)
        payload = np.empty(HEADER.size + 4 * nblocks + n, dtype=np.uint8)
        HEADER.pack_into(payload.data, 0, n)
        payload[HEADER.size : HEADER.size + 4 * nblocks].view("<f4")[:] = scales
        q = payload[HEADER.size + 4 * nblocks :].view(np.int8)
        divisors = np.where(scales > 0, scales, 1).astype(self._work)  # an all-zero block: q = 0
        for (rows, blocks), (q_rows, _) in zip(
            block_rows(work, self.block_size), block_rows(q, self.block_size), strict=True
        ):
            scaled = rows / divisors[blocks, None]
            np.rint(scaled, out=scaled)
            np.clip(scaled, -127, 127, out=scaled)
            np.copyto(q_rows, scaled, casting="unsafe")
        return payload

    def _parse(self, src: memoryview) -> tuple[int, Any]:
        (n,) = read_fields(src, HEADER, "int8")
        nblocks = -(-n // self.block_size)
        payload_length(src, HEADER.size + 4 * nblocks + n, "int8")
        scales = read_scales(src, HEADER.size, nblocks, "int8")
        q = np.frombuffer(src, dtype=np.int8, offset=HEADER.size + 4 * nblocks)
        if n and q.min() < -127:
            raise CodecDataError("an int8 payload holds -128, outside the symmetric range")
        return n, (scales.astype(self._work), q)

    def _decode_into(self, parsed: Any, target: np.ndarray) -> None:
        scales, q = parsed
        for (q_rows, blocks), (out_rows, _) in zip(
            block_rows(q, self.block_size), block_rows(target, self.block_size), strict=True
        ):
            np.multiply(q_rows, scales[blocks, None], out=out_rows, casting="unsafe")
