"""Choosing a lossy compressor by name: ``lossy_selector("topk", ratio=0.01)``."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from tensorwire.codecs.abc import Codec, short_repr
from tensorwire.codecs.fixed_chain import FixedChainSelector
from tensorwire.codecs.lossy.base import LOSSY_MIN_SIZE, LossyCodec, float_dtype_name
from tensorwire.codecs.lossy.cast import BF16, FP16
from tensorwire.codecs.lossy.dgc import DGC
from tensorwire.codecs.lossy.feedback import CompressorFactory, ErrorFeedback
from tensorwire.codecs.lossy.int8 import Int8
from tensorwire.codecs.lossy.qsgd import QSGD
from tensorwire.codecs.lossy.randomk import RandomK
from tensorwire.codecs.lossy.signsgd import SignSGD
from tensorwire.codecs.lossy.topk import TopK
from tensorwire.codecs.registry import get_codec
from tensorwire.codecs.zstd import Zstd
from tensorwire.errors import CodecConfigError, TensorwireError
from tensorwire.wire.codec import CodecSelector

LOSSY_CODECS: dict[str, type[LossyCodec]] = {
    cls.codec_id: cls for cls in (FP16, BF16, Int8, QSGD, TopK, RandomK, DGC, SignSGD)
}
"""The lossy compressors by id."""

FEEDBACK_BY_DEFAULT = frozenset({"int8", "topk", "randomk", "dgc", "signsgd"})
"""Compressors ``lossy_selector`` pairs with error feedback unless told otherwise: the
biased ones. fp16/bf16 lose half an ulp (a residual would cost a float32 copy of the model
to recover almost nothing) and QSGD is unbiased by design, as in its paper."""

LOSSLESS_BY_DEFAULT = frozenset({"qsgd", "topk", "dgc"})
"""Compressors ``lossy_selector`` follows with zstd (level 1) unless told otherwise: on a
CNN's gradient it shrinks their payloads by a quarter (topk, dgc: the index gaps) to
40-80% (qsgd: mostly-zero levels), for about 0.3 ms (topk) to 3-6 ms (qsgd) per 1.3M
elements. After the others it saves under 15% (int8, fp16, randomk, signsgd) or costs
three times the cast itself (bf16: 21% smaller)."""

DEFAULT_LOSSLESS = "default"
"""``lossless=`` value meaning: zstd level 1 after :data:`LOSSLESS_BY_DEFAULT`, else none."""

_RAW_NAMES = ("none", "raw")


class LossySelector:
    """Sends every float tensor of at least ``min_size`` bytes through a compressor for its
    dtype, built by ``compressor_factory(dtype)`` (once per dtype), then ``lossless`` if
    given; other tensors go raw. No error feedback."""

    def __init__(
        self,
        compressor_factory: CompressorFactory,
        *,
        min_size: int = LOSSY_MIN_SIZE,
        lossless: Codec | None = None,
    ) -> None:
        if isinstance(min_size, bool) or not isinstance(min_size, int) or min_size < 0:
            raise CodecConfigError(f"min_size must be an int >= 0 (bytes), got {min_size!r}")
        if lossless is not None and not isinstance(lossless, Codec):
            raise CodecConfigError(f"lossless must be a Codec or None, got {short_repr(lossless)}")
        self.min_size = min_size
        self.lossless = lossless
        self._factory = compressor_factory
        self._by_dtype = {"float32": compressor_factory("float32")}

    def __call__(self, name: str, array: np.ndarray) -> list[Codec]:
        dtype = float_dtype_name(array, self.min_size)
        if dtype is None:
            return []
        compressor = self._by_dtype.get(dtype)
        if compressor is None:
            compressor = self._by_dtype.setdefault(dtype, self._factory(dtype))
        return [compressor] if self.lossless is None else [compressor, self.lossless]

    def __repr__(self) -> str:
        return (
            f"LossySelector({self._by_dtype['float32']!r}, min_size={self.min_size}, "
            f"lossless={self.lossless!r})"
        )


def lossy_selector(
    name: str,
    *,
    error_feedback: bool | None = None,
    momentum: float = 0.0,
    min_size: int = LOSSY_MIN_SIZE,
    lossless: Codec | str | None = DEFAULT_LOSSLESS,
    **params: Any,
) -> CodecSelector:
    """Return a codec selector that compresses float tensors with the compressor ``name``.

    ``name`` is ``"none"`` (everything raw) or a lossy codec id: ``fp16``, ``bf16``,
    ``int8``, ``qsgd``, ``topk``, ``randomk``, ``dgc``, ``signsgd``; ``params`` are its
    parameters other than ``dtype`` (e.g. ``ratio=0.01`` for topk, randomk and dgc;
    ``levels`` and ``block_size`` for qsgd; ``seed``). Tensors under ``min_size`` bytes and
    non-float tensors go raw. ``error_feedback`` (default: True for int8, topk, randomk,
    dgc and signsgd, see :data:`FEEDBACK_BY_DEFAULT`) returns an :class:`ErrorFeedback`
    selector, which assumes the receiver adds up what it gets (gradients, model deltas);
    ``momentum`` is DGC's momentum correction and needs it.

    ``lossless`` is applied to the compressor's payload: a Codec, a codec id (``"zstd"``),
    None / ``"none"``, or ``"default"``: zstd level 1 after qsgd, topk and dgc, where it
    measurably helps (:data:`LOSSLESS_BY_DEFAULT`), nothing after the others.
    """
    if not isinstance(name, str):
        raise CodecConfigError(f"name must be a string, got {short_repr(name)}")
    key = name.strip().lower()
    if key in _RAW_NAMES:
        return FixedChainSelector([])
    cls = LOSSY_CODECS.get(key)
    if cls is None:
        choices = ", ".join([*_RAW_NAMES, *LOSSY_CODECS])
        raise CodecConfigError(
            f"unknown lossy compressor {short_repr(name)}; choose one of: {choices}"
        )
    if "dtype" in params:
        raise CodecConfigError("dtype is set per tensor by the selector; do not pass it")
    factory: CompressorFactory = functools.partial(cls, **params)
    try:
        factory("float32")
    except TypeError as e:  # an unknown parameter: say which ones the compressor takes
        raise CodecConfigError(f"bad parameters for {key!r}: {e}") from e
    after = _lossless_codec(key, lossless)
    feedback = key in FEEDBACK_BY_DEFAULT if error_feedback is None else error_feedback
    if feedback:
        return ErrorFeedback(factory, min_size=min_size, momentum=momentum, lossless=after)
    if momentum:
        raise CodecConfigError("momentum lives in the error-feedback memory: error_feedback=True")
    return LossySelector(factory, min_size=min_size, lossless=after)


def _lossless_codec(key: str, lossless: Codec | str | None) -> Codec | None:
    if isinstance(lossless, Codec) and not isinstance(lossless, LossyCodec):
        return lossless
    if lossless is None or lossless == "none":
        return None
    if lossless == DEFAULT_LOSSLESS:
        return Zstd(level=1) if key in LOSSLESS_BY_DEFAULT else None
    if isinstance(lossless, str) and lossless not in LOSSY_CODECS:
        try:
            return get_codec({"id": lossless})
        except TensorwireError as e:  # unknown, or a codec that needs parameters
            raise CodecConfigError(f"lossless={lossless!r}: {e}") from e
    raise CodecConfigError(
        f"lossless must be a lossless Codec, a codec id, None or 'default'; "
        f"got {short_repr(lossless)}"
    )
