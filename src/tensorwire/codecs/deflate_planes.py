"""Entropy coding of byte planes, each as a raw DEFLATE stream (RFC 1951) or not at all.

DEFLATE with Huffman coding only (no string matches) codes each run of about 16 K symbols
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
KEEP_BITS = 7.9
"""A plane whose sample has more bits of entropy per byte than this is stored raw without
trying: Huffman codes (whole bits, a table per 16 K symbols) gain nothing above it, and
trying costs more than the rest of the block (mantissas: about 7.97 bits). The
sample's estimate is corrected for its size (Miller-Madow): the plug-in one is low by about
(symbols seen - 1) / (2 n ln 2), 0.045 bits for 4 KiB of random bytes."""
RUNS_ENTROPY = 1.0
ZEROS = 4 / 256
"""Planes under ``RUNS_ENTROPY`` bits per byte, or with more than this fraction of zero
bytes (four times chance: an XOR delta's unchanged bits), are coded with runs."""
_RAW_DEFLATE = -15  # wbits: a raw DEFLATE stream, 32 KiB window, no zlib header
# 16 K symbols per DEFLATE block: its table follows a plane's local statistics, and ISA-L
# inflates an exponent plane 10 % faster than with zlib's 8 K (it builds half the tables).
_MEM_LEVEL = 8


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
    return cobj.compress(data) + cobj.flush()


def _judge(planes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Order-0 entropy (bits per byte) of each plane's source, estimated from its first
    ``SAMPLE_BYTES`` (Miller-Madow), and its sample's fraction of zero bytes: one histogram
    for all of a block's planes."""
    sample = planes[:, :SAMPLE_BYTES]
    rows, size = sample.shape
    offsets = np.arange(0, 256 * rows, 256, dtype=np.intp)[:, None]
    counts = np.bincount((sample + offsets).ravel(), minlength=256 * rows).reshape(rows, 256)
    weighted = (counts * np.log2(np.maximum(counts, 1))).sum(axis=1)
    seen = np.count_nonzero(counts, axis=1)
    entropy = np.log2(size) - weighted / size + (seen - 1) / (2 * size * np.log(2))
    return entropy, counts[:, 0] / size


def plane_choices(planes: np.ndarray) -> list[str]:
    """How each row of ``planes`` (a ``(k, n)`` uint8 array) is best coded, judged by its
    sample: ``"raw"`` (too close to random to gain), ``"runs"`` (run-length DEFLATE: nearly
    constant, or many zero bytes) or ``"huffman"``."""
    if not planes.shape[1]:
        return ["raw"] * planes.shape[0]
    return [_choice(e, z) for e, z in zip(*_judge(planes), strict=True)]


def _choice(entropy: float, zeros: float) -> str:
    if entropy > KEEP_BITS:
        return "raw"
    return "runs" if entropy < RUNS_ENTROPY or zeros > ZEROS else "huffman"


def deflate_plane(plane: np.ndarray, runs: bool) -> bytes:
    """``plane`` as one raw DEFLATE stream: run-length matches (``runs``) or Huffman only."""
    lib = _compressor_module()
    return _deflate(plane, lib.Z_RLE if runs else lib.Z_HUFFMAN_ONLY)


def compress_planes(planes: np.ndarray) -> list[bytes | None]:
    """Return each row of ``planes`` (a ``(k, n)`` uint8 array) as a raw DEFLATE stream, or
    None to store it raw (its sample's entropy shows it barely compresses, or the stream
    is not smaller)."""
    streams: list[bytes | None] = []
    for plane, choice in zip(planes, plane_choices(planes), strict=True):
        stream = None if choice == "raw" else deflate_plane(plane, choice == "runs")
        streams.append(stream if stream is not None and len(stream) < plane.size else None)
    return streams


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
