"""Lossless byte codecs, the registry that rebuilds them from headers, and codec choice.

Every codec follows numcodecs' shape: ``encode(buf)``, ``decode(buf, out=None)`` into a
preallocated buffer, ``get_config()`` / ``from_config()`` with an ``"id"``. lz4, zstd,
zlib, lzma, blosc2 and floatplanes (byte planes of floats, each entropy coded; floatplanes-zl
where openzl is installed) share one
block container (:mod:`tensorwire.codecs.blocked`) whose
blocks are (de)compressed in parallel threads (:func:`set_threads`). Lossy tensor
compressors and error feedback are in :mod:`tensorwire.codecs.lossy` (:func:`lossy_selector`).
"""

from __future__ import annotations

from tensorwire.codecs.abc import DEFAULT_MAX_DECODED_SIZE, Codec
from tensorwire.codecs.auto import AutoCodec, CodecEstimate
from tensorwire.codecs.blocked import BlockedCodec
from tensorwire.codecs.blosc2 import Blosc2
from tensorwire.codecs.fixed_chain import FixedChainSelector
from tensorwire.codecs.floatplanes import FloatPlanes, FloatPlanesZl
from tensorwire.codecs.lossy import (
    BF16,
    DGC,
    FP16,
    LOSSY_CODECS,
    QSGD,
    ErrorFeedback,
    Int8,
    LossyCodec,
    LossySelector,
    RandomK,
    SignSGD,
    TopK,
    lossy_selector,
)
from tensorwire.codecs.lz4 import LZ4
from tensorwire.codecs.registry import available_codecs, get_codec, register_codec
from tensorwire.codecs.resolve import NAMED_CODEC_MIN_SIZE, resolve_codecs
from tensorwire.codecs.threads import get_threads, set_threads
from tensorwire.codecs.zl_planes import zl_available
from tensorwire.codecs.zlib import Zlib
from tensorwire.codecs.zstd import Zstd

_BUILT_IN: tuple[type[Codec], ...] = (LZ4, Zstd, Zlib, Blosc2, FloatPlanes, *LOSSY_CODECS.values())
for _codec in _BUILT_IN:
    register_codec(_codec)

try:  # CPython can be built without liblzma
    from tensorwire.codecs.lzma import LZMA
except ImportError:  # pragma: no cover - depends on the interpreter build
    LZMA = None  # type: ignore[assignment,misc]
else:
    register_codec(LZMA)

if zl_available():  # announced to peers only where it can be decoded
    register_codec(FloatPlanesZl)

__all__ = [
    "BF16",
    "DEFAULT_MAX_DECODED_SIZE",
    "DGC",
    "FP16",
    "LZ4",
    "LZMA",
    "NAMED_CODEC_MIN_SIZE",
    "QSGD",
    "AutoCodec",
    "BlockedCodec",
    "Blosc2",
    "Codec",
    "CodecEstimate",
    "ErrorFeedback",
    "FixedChainSelector",
    "FloatPlanes",
    "FloatPlanesZl",
    "Int8",
    "LossyCodec",
    "LossySelector",
    "RandomK",
    "SignSGD",
    "TopK",
    "Zlib",
    "Zstd",
    "available_codecs",
    "get_codec",
    "get_threads",
    "lossy_selector",
    "register_codec",
    "resolve_codecs",
    "set_threads",
]
