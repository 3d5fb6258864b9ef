"""``randomk``: send ``k = ceil(ratio × n)`` entries chosen at random, and the seed that chose them.

The payload carries no indices: the receiver derives the same ``k`` distinct indices from
the 64-bit seed, in O(k) time and memory, with the permutation below. The decoded tensor is
zero except at those entries (no rescaling: with error feedback, nothing is lost for good).

Payload (little-endian)::

    offset  size            field
    0       8   u64         n       elements of the tensor
    8       8   u64         seed    seed of the index permutation (fresh for every encode)
    16      4   u32         k       entries sent, k <= n
    20      4               zero    reserved, must be 0
    24      k × itemsize    values  the entries at idx_0, ..., idx_(k-1), in the tensor's dtype

The payload is exactly ``24 + k × itemsize`` bytes, and ``n < 2**62`` (else invalid).

Index permutation. All arithmetic is on unsigned 64-bit integers, modulo 2**64::

    mix(z):   z ^= z >> 30; z *= 0xBF58476D1CE4E5B9; z ^= z >> 27; z *= 0x94D049BB133111EB;
              return z ^ (z >> 31)                                     (SplitMix64's finaliser)
    key_r   = mix(seed + (r + 1) × 0x9E3779B97F4A7C15)   for r = 0, 1, 2, 3
    h       = max(1, ceil(bit_length(n - 1) / 2)),   M = 2**h - 1      (so 4**h >= n)
    perm(j):  L = j >> h; R = j & M
              for r = 0, 1, 2, 3:  L, R = R, L ^ (mix(R + key_r) & M)
              return (L << h) | R

``perm`` is a bijection of ``[0, 4**h)`` (a four-round Feistel network). The indices are
the first ``k`` values of ``perm(0), perm(1), perm(2), ...`` that are below ``n``, in that
order, which is the order of ``values``. ``seed`` in the config (None: from the OS) starts
the stream the encoder draws each payload's seed from.
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np

from tensorwire.codecs.lossy.base import (
    LossyCodec,
    check_fraction,
    check_seed,
    kept_count,
    payload_length,
    read_fields,
)
from tensorwire.errors import CodecDataError

HEADER = struct.Struct("<QQI4x")
"""n (u64), seed (u64), k (u32), four zero bytes: 24 bytes, so values start aligned."""

DEFAULT_RATIO = 0.01
MAX_ELEMENTS = (1 << 62) - 1  # so that 4**h fits in 64 bits
_GOLDEN = 0x9E3779B97F4A7C15
_M64 = (1 << 64) - 1
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
_ROUNDS = 4


def _mix(z: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser on a uint64 array (modifies and returns ``z``)."""
    z ^= z >> np.uint64(30)
    z *= _MIX1
    z ^= z >> np.uint64(27)
    z *= _MIX2
    z ^= z >> np.uint64(31)
    return z


def random_indices(n: int, k: int, seed: int) -> np.ndarray:
    """Return the ``k`` distinct indices below ``n`` that ``seed`` picks (module docstring)."""
    if k == 0:
        return np.arange(0, dtype=np.uint64)
    starts = [(seed + (r + 1) * _GOLDEN) & _M64 for r in range(_ROUNDS)]
    keys = _mix(np.array(starts, dtype=np.uint64))
    half = max(1, -(-(n - 1).bit_length() // 2))
    mask, shift = np.uint64((1 << half) - 1), np.uint64(half)
    domain = 1 << (2 * half)
    found: list[np.ndarray] = []
    count = start = 0
    while count < k:  # over batches of candidates, about one batch in all
        size = min(domain - start, (k - count) * domain // n + (k - count) // 8 + 64)
        j = np.arange(start, start + size, dtype=np.uint64)
        left, right = j >> shift, j & mask
        for key in keys:
            left, right = right, left ^ (_mix(right + key) & mask)
        candidates = (left << shift) | right
        candidates = candidates[candidates < n]
        found.append(candidates[: k - count])
        count += found[-1].size
        start += size
    return np.concatenate(found)


class RandomK(LossyCodec):
    """Sends ``ceil(ratio × n)`` randomly chosen entries and the seed that chose them."""

    codec_id = "randomk"
    sparse = True

    def __init__(self, dtype: str, ratio: float = DEFAULT_RATIO, seed: int | None = None) -> None:
        super().__init__(dtype)
        self.ratio = check_fraction("ratio", ratio)
        self.seed = check_seed(seed)
        self._rng = np.random.default_rng(self.seed)

    def _encode(self, x: np.ndarray) -> np.ndarray:
        n = x.size
        if n > MAX_ELEMENTS:
            raise ValueError(f"randomk handles at most {MAX_ELEMENTS} elements, got {n}")
        k = kept_count(self.ratio, n)
        seed = int(self._rng.integers(0, 1 << 64, dtype=np.uint64))
        values = x[random_indices(n, k, seed)]
        payload = np.empty(HEADER.size + values.nbytes, dtype=np.uint8)
        HEADER.pack_into(payload.data, 0, n, seed, k)
        payload[HEADER.size :] = values.view(np.uint8)
        return payload

    def _parse(self, src: memoryview) -> tuple[int, Any]:
        n, seed, k = read_fields(src, HEADER, "randomk")
        if src[20:24] != b"\0\0\0\0":
            raise CodecDataError("a randomk payload's reserved bytes are not zero")
        if n > MAX_ELEMENTS or k > n:
            raise CodecDataError(f"a randomk payload sends {k} entries of a {n}-element tensor")
        payload_length(src, HEADER.size + k * self._dtype.itemsize, "randomk")
        values = np.frombuffer(src, dtype=self._dtype, offset=HEADER.size)
        return n, (seed, values)

    def _decode_into(self, parsed: Any, target: np.ndarray) -> None:
        seed, values = parsed
        target[...] = 0
        target[random_indices(target.size, values.size, seed)] = values
