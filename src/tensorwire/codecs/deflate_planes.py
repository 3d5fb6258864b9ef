"""Entropy coding of one byte plane as a raw DEFLATE stream (RFC 1951), or not at all.

DEFLATE with Huffman coding only (no string matches) codes each run of about 8 K symbols
with its own Huffman table, close to the plane's local order-0 entropy; run-length
matches (``Z_RLE``) take over where a plane has runs of zeros (the XOR of two rounds'
weights) or is nearly constant. Any inflater reads both. Faster builds of the same
format are used when installed: zlib-ng to compress, ISA-L (``isal``) to decompress; else
the standard library's zlib. They are imported on first use.
"""

from __future__ import annotations

import functools
import zlib
from types import ModuleType
from typing import Any

import numpy as np

from tensorwire.errors import CodecDataError, DecompressedSizeMismatch

SAMPLE_BYTES = 4096
"""Bytes at the start of a plane whose histogram judges the plane."""
KEEP_BITS = 7.93
"""A plane whose sample has more bits of entropy per byte than this is stored raw (4 KiB
of random bytes measure about 7.955: the plug-in estimate is low by ~255 / (2 n ln 2))."""
RUNS_ENTROPY = 1.0
ZEROS = 4 / 256
"""Planes under ``RUNS_ENTROPY`` bits per byte, or with more than this fraction of zero
bytes (four times chance: an XOR delta's unchanged bits), are coded with runs."""
_RAW_DEFLATE = -15  # wbits: a raw DEFLATE stream, 32 KiB window, no zlib header
_MEM_LEVEL = 7  # 8 K symbols per DEFLATE block: tables follow a plane's local statistics


@functools.cache
def _compressor_module() -> ModuleType:
    try:
        from zlib_ng import zlib_ng
    except ImportError:
        return zlib
    return zlib_ng


@functools.cache
def _decompressor_module() -> ModuleType:
    try:
        from isal import isal_zlib
    except ImportError:
        return zlib
    return isal_zlib


def _deflate(data: Any, strategy: int) -> bytes:
    lib = _compressor_module()
    cobj = lib.compressobj(1, lib.DEFLATED, _RAW_DEFLATE, _MEM_LEVEL, strategy)
    return bytes(cobj.compress(data) + cobj.flush())


def _entropy_bits(sample: np.ndarray) -> float:
    """Order-0 entropy of ``sample``'s bytes, bits per byte: what Huffman coding nears."""
    counts = np.bincount(sample, minlength=256)
    p = counts[counts > 0] / sample.size
    return float(-(p * np.log2(p)).sum())


def compress_plane(plane: np.ndarray) -> bytes | None:
    """Return ``plane`` (contiguous uint8) as a raw DEFLATE stream, or None to store it raw
    (its sample's entropy shows it barely compresses, or the stream is not smaller)."""
    sample = plane[:SAMPLE_BYTES]
    if not sample.size:
        return None
    entropy = _entropy_bits(sample)
    if entropy > KEEP_BITS:
        return None
    lib = _compressor_module()
    runs = entropy < RUNS_ENTROPY or np.count_nonzero(sample == 0) > ZEROS * sample.size
    strategy = lib.Z_RLE if runs else lib.Z_HUFFMAN_ONLY
    stream = _deflate(plane, strategy)
    return stream if len(stream) < plane.size else None


def inflate_plane(stream: memoryview, size: int) -> np.ndarray:
    """Inflate the raw DEFLATE ``stream``, which must decode to exactly ``size`` bytes, into
    a new read-only uint8 array.

    Never produces more than ``size`` bytes whatever the stream declares: a stream that
    would decode to more, or less, raises ``DecompressedSizeMismatch``; a corrupt one,
    or one followed by other bytes, ``CodecDataError``.
    """
    lib = _decompressor_module()
    dobj = lib.decompressobj(_RAW_DEFLATE)
    try:
        data = dobj.decompress(stream, size)
    except lib.error as e:
        raise CodecDataError(f"corrupt DEFLATE stream in a floatplanes block: {e}") from e
    if len(data) != size or not dobj.eof:
        raise DecompressedSizeMismatch(
            f"a floatplanes plane inflates to {'more than ' if dobj.unconsumed_tail else ''}"
            f"{len(data)} bytes {'(stream unfinished) ' if not dobj.eof else ''}"
            f"instead of {size}"
        )
    if dobj.unused_data:
        raise CodecDataError("bytes follow the DEFLATE stream of a floatplanes plane")
    return np.frombuffer(data, dtype=np.uint8)
