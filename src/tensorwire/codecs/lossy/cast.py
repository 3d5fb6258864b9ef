"""Casting to a 16-bit float: ``fp16`` (IEEE binary16) and ``bf16`` (bfloat16).

Payload: the tensor's ``n`` elements cast to the 16-bit type, ``2 × n`` bytes, little-endian,
nothing else::

    offset  size    field
    0       2 × n   the elements as binary16 (fp16) or bfloat16 (bf16), in tensor order

Decoding casts them back to ``dtype``; a payload of odd length is invalid. Casting rounds
to nearest, ties to even, so ``|x - x̂| <= ulp(x̂) / 2`` of the 16-bit type (float64
elements go to bfloat16 through float32, as ml_dtypes does: half a float32 ulp more).
fp16 overflows to ±inf beyond ±65504 (as ``torch.Tensor.half`` does) and flushes below
about 6e-8 to zero; bfloat16 has float32's range with 8 significant bits.
"""

from __future__ import annotations

from typing import Any, ClassVar

import ml_dtypes
import numpy as np

from tensorwire.codecs.lossy.base import LossyCodec
from tensorwire.errors import CodecDataError


class _Cast(LossyCodec):
    """Casts elements to the 16-bit float ``_half`` and back."""

    _half: ClassVar[np.dtype]

    def _encode(self, x: np.ndarray) -> np.ndarray:
        with np.errstate(over="ignore"):  # out of range is ±inf, as IEEE casts do
            return x.astype(self._half).view(np.uint8)

    def _parse(self, src: memoryview) -> tuple[int, Any]:
        if src.nbytes % 2:
            raise CodecDataError(f"a {self.codec_id} payload has an odd length ({src.nbytes})")
        return src.nbytes // 2, src

    def _decode_into(self, parsed: Any, target: np.ndarray) -> None:
        np.copyto(target, np.frombuffer(parsed, dtype=self._half), casting="unsafe")


class FP16(_Cast):
    """Sends elements as IEEE half precision (binary16): half the bytes of float32."""

    codec_id = "fp16"
    _half = np.dtype("<f2")


class BF16(_Cast):
    """Sends elements as bfloat16: float32's range, 8 significant bits, half its bytes."""

    codec_id = "bf16"
    _half = np.dtype(ml_dtypes.bfloat16)
