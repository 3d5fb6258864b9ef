"""``signsgd``: scaled sign compression, one bit per element plus one scale.

Every element is sent as its sign, and the tensor as the single scale ``mean|x|`` (float32):
decoding gives ``x̂ = scale × sign(x)`` with ``sign(x) = -1`` for ``x < 0`` and ``+1``
otherwise (including 0), so ``Σ|x̂| = Σ|x|``. With error feedback this is EF-SignSGD
(Karimireddy et al., 2019). A float32 tensor shrinks 32 times.

Payload (little-endian)::

    offset  size            field
    0       8   u64         n       elements of the tensor
    8       4   f32         scale   mean |x|, finite and >= 0
    12      ceil(n / 8)     signs   bit i (byte i // 8, bit i % 8, least significant first)
                                    is 1 if element i is negative (padding bits: 0)

The payload is exactly ``12 + ceil(n / 8)`` bytes.
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np

from tensorwire.codecs.lossy.base import (
    LossyCodec,
    payload_length,
    read_fields,
    read_scales,
    require_finite,
)

HEADER = struct.Struct("<Qf")
"""n (u64) and scale (f32)."""


class SignSGD(LossyCodec):
    """Sends one sign bit per element and the mean magnitude as the scale."""

    codec_id = "signsgd"

    def _encode(self, x: np.ndarray) -> np.ndarray:
        n = x.size
        work = x.astype(self._work, copy=False)
        scale = np.float32(np.mean(np.abs(work), dtype=np.float64) if n else 0.0)
        require_finite(np.array([scale]), self.codec_id)
        signs = np.packbits(work < 0, bitorder="little")
        payload = np.empty(HEADER.size + signs.size, dtype=np.uint8)
        HEADER.pack_into(payload.data, 0, n, scale)
        payload[HEADER.size :] = signs
        return payload

    def _parse(self, src: memoryview) -> tuple[int, Any]:
        n, _ = read_fields(src, HEADER, "signsgd")
        payload_length(src, HEADER.size + -(-n // 8), "signsgd")
        (scale,) = read_scales(src, 8, 1, "signsgd").astype(self._work)
        signs = np.frombuffer(src, dtype=np.uint8, offset=HEADER.size)
        return n, (scale, signs)

    def _decode_into(self, parsed: Any, target: np.ndarray) -> None:
        scale, signs = parsed
        negative = np.unpackbits(signs, count=target.size, bitorder="little")
        values = target if target.dtype == self._work else np.empty(target.size, self._work)
        np.multiply(negative, -2 * scale, out=values)  # exact: scale - 2 × scale is -scale
        values += scale
        if values is not target:
            np.copyto(target, values, casting="unsafe")
