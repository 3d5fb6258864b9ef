"""Reductions, element-wise and in place: what an allreduce does with two ranks' pieces.

Sums are in the input dtype (integers wrap around as numpy's do); float16 and bfloat16 are
added in float32 and rounded once per step, so a sum of N ranks is rounded N - 1 times, not
once per bit of precision lost to a half-precision accumulator. ``mean`` is the sum divided
by the group's size at the end. Every step combines two operands the same way on both
sides (IEEE addition, min and max are commutative), so every rank ends bit-identical.
"""

from __future__ import annotations

from typing import Literal

import ml_dtypes
import numpy as np

ReduceOp = Literal["sum", "mean", "min", "max"]
REDUCE_OPS: tuple[str, ...] = ("sum", "mean", "min", "max")

_UFUNCS = {"sum": np.add, "mean": np.add, "min": np.minimum, "max": np.maximum}
_HALF = (np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16))


def is_float(dtype: np.dtype) -> bool:
    return dtype.kind == "f" or dtype in _HALF


def check_reduction(op: str, dtype: np.dtype) -> None:
    """``ValueError`` for an unknown ``op``, ``TypeError`` for a dtype it cannot reduce."""
    if op not in _UFUNCS:
        raise ValueError(f"op={op!r}: a reduction is one of {', '.join(REDUCE_OPS)}")
    if not (is_float(dtype) or dtype.kind in "iu"):
        raise TypeError(f"cannot {op}-reduce {dtype} tensors: use a float or integer dtype")
    if op == "mean" and not is_float(dtype):
        raise TypeError(f"op='mean' of {dtype} tensors: use 'sum' (or a float dtype)")


def combine(op: str, acc: np.ndarray, other: np.ndarray) -> None:
    """``acc = acc <op> other``, element-wise, in place (``other`` may be any shape of the
    same size)."""
    ufunc = _UFUNCS[op]
    other = other.reshape(acc.shape)
    if acc.dtype in _HALF:
        wide = acc.astype(np.float32)
        ufunc(wide, other.astype(np.float32), out=wide)
        acc[...] = wide.astype(acc.dtype)
        return
    ufunc(acc, other, out=acc)


def finish(op: str, acc: np.ndarray, size: int) -> None:
    """What is left to do once every rank's values are combined: divide, for ``mean``."""
    if op != "mean":
        return
    if acc.dtype in _HALF:
        acc[...] = (acc.astype(np.float32) / size).astype(acc.dtype)
    else:
        np.divide(acc, size, out=acc)
