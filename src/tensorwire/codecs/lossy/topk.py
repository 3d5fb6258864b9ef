"""``topk``: keep exactly the ``k = ceil(ratio × n)`` entries of largest magnitude.

Among entries of equal magnitude at the cut, the lowest indices are kept, so the choice is
deterministic. The payload is the sparse layout of :mod:`tensorwire.codecs.lossy.sparse`
(values in the tensor's dtype, indices as 16-bit gaps); the decoded tensor is zero
elsewhere. At ``ratio = 0.01`` a float32 tensor shrinks to about 1.5% of its bytes.

For speed, when ``k <= n / 8`` the encoder first keeps the entries at or above a threshold
read from a sample of the magnitudes, set low enough that almost always at least ``k``
pass, and ranks only those; if fewer pass, it ranks the whole tensor. Either way the result
is the exact top ``k``: the sample decides how fast, never what.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from tensorwire.codecs.lossy.base import LossyCodec, check_fraction, kept_count
from tensorwire.codecs.lossy.sparse import pack_sparse, parse_sparse, scatter

DEFAULT_RATIO = 0.01
PREFILTER_MIN = 1 << 16
"""Elements a tensor needs for the sampled prefilter: below, ranking it all is as fast."""
PREFILTER_SAMPLE = 1 << 14
"""Magnitudes the prefilter samples (with replacement)."""


def magnitudes(x: np.ndarray, codec_id: str) -> np.ndarray:
    """Return ``|x|`` in a type numpy ranks fast (float32 for 16-bit floats); refuse NaN."""
    a = np.abs(x.astype(np.float32) if x.dtype.itemsize == 2 else x)
    if a.size and np.isnan(a.max()):
        raise ValueError(f"{codec_id} cannot rank NaN values; send the tensor raw or fix it")
    return a


def sample_threshold(a: np.ndarray, rank: int, sample: np.ndarray) -> Any:
    """Return the ``rank``-th largest of the magnitudes ``a`` at the indices ``sample``."""
    values = a[sample]
    return np.partition(values, values.size - rank)[values.size - rank]


def largest(a: np.ndarray, k: int) -> np.ndarray:
    """Return the ascending indices of the ``k`` largest magnitudes of ``a`` (no NaN).

    Of equal values at the cut, the lowest indices are taken.
    """
    n = a.size
    if k >= n:
        return np.arange(n)
    if n >= PREFILTER_MIN and k <= n // 8:
        m = PREFILTER_SAMPLE
        expected = k * m / n
        # About four standard deviations above the expected rank: rarely fewer than k pass.
        rank = min(m, math.ceil(1.1 * expected + 4 * math.sqrt(expected) + 8))
        sample = np.random.default_rng(n).integers(0, n, m)
        candidates = np.flatnonzero(a >= sample_threshold(a, rank, sample))
        if candidates.size >= k:  # then they hold every entry at or above the k-th largest
            return candidates[_ranked(a[candidates], k)]
    return _ranked(a, k)


def _ranked(a: np.ndarray, k: int) -> np.ndarray:
    """``largest`` by a partition of all of ``a``."""
    n = a.size
    if k == 0:
        return np.arange(0)
    cut = np.partition(a, n - k)[n - k]  # the k-th largest
    chosen = a > cut
    ties = np.flatnonzero(a == cut)[: k - np.count_nonzero(chosen)]
    chosen[ties] = True
    return np.flatnonzero(chosen)


class TopK(LossyCodec):
    """Sends the ``ceil(ratio × n)`` entries of largest magnitude and their indices."""

    codec_id = "topk"
    sparse = True

    def __init__(self, dtype: str, ratio: float = DEFAULT_RATIO) -> None:
        super().__init__(dtype)
        self.ratio = check_fraction("ratio", ratio)

    def _encode(self, x: np.ndarray) -> np.ndarray:
        indices = largest(magnitudes(x, self.codec_id), kept_count(self.ratio, x.size))
        return pack_sparse(x.size, indices, x[indices])

    def _parse(self, src: memoryview) -> tuple[int, Any]:
        return parse_sparse(src, self._dtype, self.codec_id)

    def _decode_into(self, parsed: Any, target: np.ndarray) -> None:
        scatter(parsed, target)
