"""Compression inside the collective: what ``allreduce(compress=...)`` takes.

A :class:`Compression` names one of the lossy compressors of :mod:`tensorwire.codecs.lossy`
and builds it for the dtype an allreduce works in (float32, or float64 for float64
tensors). How each travels:

- ``fp16`` / ``bf16`` / ``int8`` (dense): along the ring (:mod:`.quantised_ring`), every
  piece on the wire compressed, every partial sum kept in float32 on the rank that adds.
- ``topk`` / ``randomk`` (sparse, with error feedback): each rank's compressed tensor goes
  to every other rank and every rank adds them up (:mod:`.sparse_sum`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

import numpy as np

from tensorwire.codecs.abc import check_int
from tensorwire.codecs.lossy import LOSSY_CODECS, Int8, LossyCodec
from tensorwire.codecs.lossy.base import check_fraction
from tensorwire.codecs.lossy.int8 import MAX_BLOCK_SIZE
from tensorwire.collective.reduce import is_float

CompressionMethod = Literal["fp16", "bf16", "int8", "topk", "randomk"]
COMPRESSION_METHODS: tuple[str, ...] = get_args(CompressionMethod)
SPARSE_METHODS = ("topk", "randomk")

DEFAULT_BLOCK_SIZE = 1024
"""Elements per int8 scale: a 4-byte float32 scale per 1024 bytes of int8 adds 0.4%."""
DEFAULT_RATIO = 0.01
"""Fraction of the elements top-k and random-k send."""
_NONE = "none"


@dataclass(frozen=True)
class Compression:
    """A compressor for allreduce: ``method`` and its setting (``ratio``: the fraction of
    elements ``topk``/``randomk`` send; ``block_size``: elements per ``int8`` scale)."""

    method: CompressionMethod
    ratio: float = DEFAULT_RATIO
    block_size: int = DEFAULT_BLOCK_SIZE

    def __post_init__(self) -> None:
        if self.method not in COMPRESSION_METHODS:
            raise ValueError(
                f"compress={self.method!r}: one of {', '.join(COMPRESSION_METHODS)} or 'none'"
            )
        check_fraction("ratio", self.ratio)
        check_int("block_size", self.block_size, 1, MAX_BLOCK_SIZE)

    @property
    def sparse(self) -> bool:
        """True for top-k and random-k: summed from every rank's piece, with error feedback."""
        return self.method in SPARSE_METHODS

    @property
    def label(self) -> str:
        """What an operation's signature says of it (ranks must all compress alike)."""
        if self.method == "int8":
            return f"int8/{self.block_size}"
        return f"{self.method}/{self.ratio}" if self.sparse else self.method

    def codec(self, dtype: str) -> LossyCodec:
        """The compressor for elements of ``dtype`` (a wire dtype name)."""
        if self.method == "int8":
            return Int8(dtype, block_size=self.block_size)
        if self.sparse:
            return LOSSY_CODECS[self.method](dtype, ratio=self.ratio)  # type: ignore[call-arg]
        return LOSSY_CODECS[self.method](dtype)


def compression_of(value: object) -> Compression | None:
    """``value`` (None, ``"none"``, a method name or a :class:`Compression`) as a
    Compression, or None for no compression."""
    if value is None or value == _NONE:
        return None
    if isinstance(value, Compression):
        return value
    if isinstance(value, str):
        return Compression(value)  # type: ignore[arg-type]
    raise TypeError(f"compress={value!r}: a method name, a Compression or None")


def compression_for(
    compress: object, default: object, op: str, dtype: np.dtype, algorithm: str | None
) -> Compression | None:
    """The compression an allreduce of ``op`` on ``dtype`` uses: ``compress`` if given
    (an error if it cannot apply), else the group's ``default`` where it applies."""
    compression = compression_of(default if compress is None else compress)
    if compression is None:
        return None
    problem: tuple[type[Exception], str] | None = None
    if op not in ("sum", "mean"):
        problem = ValueError, f"is for sum and mean, not {op}"
    elif not is_float(dtype):
        problem = TypeError, f"is for float tensors, not {dtype}"
    elif algorithm == "recursive_doubling":
        problem = ValueError, "goes round the ring: pass algorithm='ring' or None"
    if problem is None:
        return compression
    if compress is None:  # the group's default leaves what it cannot compress exact
        return None
    error, reason = problem
    raise error(f"compress={compression.label!r} {reason} (or pass compress='none')")


def work_dtype(dtype: np.dtype) -> np.dtype:
    """The dtype a compressed allreduce adds in: float64 for float64 tensors, else float32."""
    return np.dtype(np.float64 if dtype == np.float64 else np.float32)
