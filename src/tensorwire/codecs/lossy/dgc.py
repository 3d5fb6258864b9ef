"""``dgc``: Deep Gradient Compression's sparsification (Lin et al., 2018).

Like ``topk``, but with the paper's threshold estimated from a random sample instead of an
exact selection: ``m = max(ceil(sample_ratio × n), 1024)`` magnitudes (at most ``n``) are
drawn with replacement, the threshold is the ``ceil(k × m / n)``-th largest of them
(``k = ceil(ratio × n)``), and every entry at or above it is selected. As in the DGC
authors' code, while fewer than 80% of ``k`` are selected the threshold is lowered by 20%
(at most 10 times); if more than ``k`` are, the ``k`` largest of them are kept (ties to the
lowest index). So a payload carries between 80% of ``k`` and ``k`` entries (fewer only if
the tensor has fewer nonzeros). The payload is the sparse layout of
:mod:`tensorwire.codecs.lossy.sparse`.

DGC's momentum correction and momentum factor masking live in the sender's error-feedback
memory: ``ErrorFeedback(..., momentum=0.9)``. ``seed`` (None: from the OS) starts the
sampling's random stream, which advances with every encode; the decoder needs none.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from tensorwire.codecs.lossy.base import LossyCodec, check_fraction, check_seed, kept_count
from tensorwire.codecs.lossy.sparse import pack_sparse, parse_sparse, scatter
from tensorwire.codecs.lossy.topk import DEFAULT_RATIO, largest, magnitudes, sample_threshold

DEFAULT_SAMPLE_RATIO = 0.01
MIN_SAMPLE = 1024
"""Magnitudes sampled at least: fewer would make the threshold of small tensors erratic."""
LOWER_BOUND = 0.8
"""Fraction of ``k`` below which the threshold is lowered, by this factor (DGC's code)."""
MAX_ADAPTATIONS = 10


class DGC(LossyCodec):
    """Sends about the ``ceil(ratio × n)`` largest entries, found with a sampled threshold."""

    codec_id = "dgc"
    sparse = True

    def __init__(
        self,
        dtype: str,
        ratio: float = DEFAULT_RATIO,
        sample_ratio: float = DEFAULT_SAMPLE_RATIO,
        seed: int | None = None,
    ) -> None:
        super().__init__(dtype)
        self.ratio = check_fraction("ratio", ratio)
        self.sample_ratio = check_fraction("sample_ratio", sample_ratio)
        self.seed = check_seed(seed)
        self._rng = np.random.default_rng(self.seed)

    def _encode(self, x: np.ndarray) -> np.ndarray:
        n = x.size
        a = magnitudes(x, self.codec_id)
        if n == 0:
            return pack_sparse(0, np.arange(0), x)
        k = kept_count(self.ratio, n)
        m = min(n, max(math.ceil(self.sample_ratio * n), MIN_SAMPLE))
        rank = min(m, math.ceil(k * m / n))
        threshold = sample_threshold(a, rank, self._rng.integers(0, n, m))
        selected = np.flatnonzero(a >= threshold)
        for _ in range(MAX_ADAPTATIONS):  # over threshold adjustments, not elements
            if selected.size >= LOWER_BOUND * k:
                break
            threshold *= LOWER_BOUND
            selected = np.flatnonzero(a >= threshold)
        if selected.size > k:
            selected = selected[largest(a[selected], k)]
        return pack_sparse(n, selected, x[selected])

    def _parse(self, src: memoryview) -> tuple[int, Any]:
        return parse_sparse(src, self._dtype, self.codec_id)

    def _decode_into(self, parsed: Any, target: np.ndarray) -> None:
        scatter(parsed, target)
