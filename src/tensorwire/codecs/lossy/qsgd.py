"""``qsgd``: QSGD (Alistarh et al., 2017), unbiased stochastic quantisation to ``levels`` levels.

The tensor's ``n`` elements are cut into blocks ("buckets") of ``block_size``; block ``b``
has the L2 norm ``norm_b`` of its elements (stored as float32, rounded up so that
``|x| <= norm_b``). With ``s = levels``, an element becomes the integer level
``l = floor(|x| × s / norm_b + u)``, ``u`` uniform in [0, 1), so ``E[l] = |x| × s / norm_b``,
and is sent as the code ``c = s + sign(x) × l`` in ``[0, 2s]``. Decoding gives
``x̂ = (c - s) × norm_b / s``: ``E[x̂] = x`` (unbiased), with variance at most
``min(d / s², √d / s) × norm_b²`` per block of ``d`` elements.

Codes take ``w`` bits: 2 if ``s == 1``, 4 if ``s <= 7``, else 8 (``s <= 127``), packed
``8 / w`` to a byte, the first code in the least significant bits.

Payload (little-endian)::

    offset      size                field
    0           8   u64             n       elements of the tensor
    8           4 × nb  f32[nb]     norms   L2 norm of each block, finite and >= 0
    8 + 4·nb    ceil(n × w / 8)     codes   packed codes, each <= 2s (padding bits: 0)

with ``nb = ceil(n / block_size)``. The payload is exactly ``8 + 4 × nb + ceil(n × w / 8)``
bytes, with ``levels`` and ``block_size`` from the config; a code above ``2s`` is invalid
(a decoder ignores the padding bits). ``seed`` (None: from the
OS) starts the encoder's random stream, which advances with every encode; the decoder
needs no randomness.
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
    check_seed,
    payload_length,
    read_fields,
    read_scales,
    require_finite,
)
from tensorwire.errors import CodecDataError

HEADER = struct.Struct("<Q")
"""n: elements of the tensor."""

DEFAULT_LEVELS = 127
DEFAULT_BLOCK_SIZE = 512
"""The QSGD paper's bucket size: a norm per 512 elements keeps the variance low."""
MAX_LEVELS = 127
MAX_BLOCK_SIZE = 1 << 31


def code_width(levels: int) -> int:
    """Return the bits per code for ``levels`` levels: 2, 4 or 8."""
    return 2 if levels == 1 else 4 if levels <= 7 else 8


def pack_codes(codes: np.ndarray, width: int) -> np.ndarray:
    """Pack uint8 codes of ``width`` bits (2, 4 or 8), low bits first, into bytes."""
    per_byte = 8 // width
    if per_byte == 1:
        return codes
    padded = np.zeros(-(-codes.size // per_byte) * per_byte, dtype=np.uint8)
    padded[: codes.size] = codes
    grouped = padded.reshape(-1, per_byte)
    packed = grouped[:, 0].copy()
    for j in range(1, per_byte):  # over the codes in a byte, not over elements
        packed |= grouped[:, j] << (width * j)
    return packed


def unpack_codes(packed: np.ndarray, count: int, width: int) -> np.ndarray:
    """Return the first ``count`` codes of ``width`` bits from ``packed`` (as uint8)."""
    per_byte = 8 // width
    if per_byte == 1:
        return packed[:count]
    codes = np.empty((packed.size, per_byte), dtype=np.uint8)
    for j in range(per_byte):  # over the codes in a byte, not over elements
        np.bitwise_and(packed >> (width * j), (1 << width) - 1, out=codes[:, j])
    return codes.reshape(-1)[:count]


def uniforms(rng: np.random.Generator, count: int) -> np.ndarray:
    """Return ``count`` float32 numbers uniform in [0, 1), 23 random bits each.

    Made from the generator's raw bits: several times faster than ``rng.random``.
    """
    bits = rng.bit_generator.random_raw(-(-count // 2)).view(np.uint32)[:count]
    bits >>= 9
    bits |= 0x3F800000  # the float32 exponent of [1, 2)
    result = bits.view(np.float32)
    result -= 1
    return result


class QSGD(LossyCodec):
    """Unbiased stochastic quantisation to ``levels`` levels per sign, one norm per block."""

    codec_id = "qsgd"

    def __init__(
        self,
        dtype: str,
        levels: int = DEFAULT_LEVELS,
        block_size: int = DEFAULT_BLOCK_SIZE,
        seed: int | None = None,
    ) -> None:
        super().__init__(dtype)
        self.levels = check_int("levels", levels, 1, MAX_LEVELS)
        self.block_size = check_int("block_size", block_size, 1, MAX_BLOCK_SIZE)
        self.seed = check_seed(seed)
        self._width = code_width(self.levels)
        self._rng = np.random.default_rng(self.seed)

    def _encode(self, x: np.ndarray) -> np.ndarray:
        n, s = x.size, self.levels
        nblocks = -(-n // self.block_size)
        work = x.astype(self._work, copy=False)
        norms = np.zeros(nblocks, dtype=np.float32)
        if n:
            # Squares in float64: they overflow float32 for elements above about 1.8e19.
            exact = np.sqrt(
                np.add.reduceat(np.square(work, dtype=np.float64), block_starts(n, self.block_size))
            )
            norms[:] = exact
            # Round up, so that |x| <= norm and no level exceeds s.
            low = norms < exact
            norms[low] = np.nextafter(norms[low], np.float32(np.inf))
        require_finite(norms, self.codec_id)
        factors = np.where(norms > 0, s / np.where(norms > 0, norms, 1), 0).astype(self._work)
        magnitude = np.abs(work)
        for rows, blocks in block_rows(magnitude, self.block_size):
            rows *= factors[blocks, None]
        magnitude += uniforms(self._rng, n)
        np.floor(magnitude, out=magnitude)
        np.minimum(magnitude, s, out=magnitude)
        np.copysign(magnitude, work, out=magnitude)  # -0 for 0 levels: code s either way
        magnitude += s
        packed = pack_codes(magnitude.astype(np.uint8), self._width)
        payload = np.empty(HEADER.size + 4 * nblocks + packed.size, dtype=np.uint8)
        HEADER.pack_into(payload.data, 0, n)
        payload[HEADER.size : HEADER.size + 4 * nblocks].view("<f4")[:] = norms
        payload[HEADER.size + 4 * nblocks :] = packed
        return payload

    def _parse(self, src: memoryview) -> tuple[int, Any]:
        (n,) = read_fields(src, HEADER, "qsgd")
        nblocks = -(-n // self.block_size)
        packed_size = -(-n * self._width // 8)
        payload_length(src, HEADER.size + 4 * nblocks + packed_size, "qsgd")
        norms = read_scales(src, HEADER.size, nblocks, "qsgd")
        packed = np.frombuffer(src, dtype=np.uint8, offset=HEADER.size + 4 * nblocks)
        return n, (norms, packed)

    def _decode_into(self, parsed: Any, target: np.ndarray) -> None:
        norms, packed = parsed
        codes = unpack_codes(packed, target.size, self._width)
        if codes.size and codes.max() > 2 * self.levels:
            raise CodecDataError(f"a qsgd payload holds a code above {2 * self.levels}")
        steps = norms.astype(self._work) / self.levels
        values = codes.astype(self._work)
        values -= self.levels
        for (rows, blocks), (out_rows, _) in zip(
            block_rows(values, self.block_size), block_rows(target, self.block_size), strict=True
        ):
            np.multiply(rows, steps[blocks, None], out=out_rows, casting="unsafe")
