"""Flat byte views of the buffers codecs read from and write into, without copying."""

from __future__ import annotations

from typing import Any

import numpy as np

from tensorwire.errors import DecompressedSizeMismatch


def byte_view(buf: Any) -> memoryview:
    """Return a 1-D unsigned-byte view of the contiguous buffer ``buf`` (no copy).

    Numpy arrays may be C- or Fortran-contiguous (their bytes are taken in memory order)
    and of any dtype, including ones the buffer protocol cannot describe (bfloat16).
    """
    if isinstance(buf, np.ndarray):
        if not (buf.flags.c_contiguous or buf.flags.f_contiguous):
            raise ValueError("codecs need a contiguous array; pass np.ascontiguousarray(a)")
        return buf.reshape(-1, order="A").view(np.uint8).data
    view = memoryview(buf)
    if not view.c_contiguous:
        raise ValueError("codecs need a contiguous buffer")
    return view.cast("B") if view.format != "B" or view.ndim != 1 else view


def writable_byte_view(out: Any) -> memoryview:
    """Return a writable 1-D unsigned-byte view of ``out`` (no copy)."""
    view = byte_view(out)
    if view.readonly:
        raise ValueError("out must be a writable buffer")
    return view


def output_for(out: Any, nbytes: int, max_size: int) -> tuple[Any, memoryview]:
    """Return ``(result, view)`` to decode ``nbytes`` bytes into, checked before allocating.

    With ``out`` given, its size must be exactly ``nbytes``; without, a new uint8 array is
    allocated, but only if ``nbytes <= max_size``.
    """
    if out is not None:
        view = writable_byte_view(out)
        if view.nbytes != nbytes:
            raise DecompressedSizeMismatch(
                f"the payload decodes to {nbytes} bytes but out holds {view.nbytes}"
            )
        return out, view
    if nbytes > max_size:
        raise DecompressedSizeMismatch(
            f"the payload declares {nbytes} decoded bytes, more than max_size={max_size}; "
            "pass out= or a larger max_size if that is expected"
        )
    array = np.empty(nbytes, dtype=np.uint8)
    return array, array.data
