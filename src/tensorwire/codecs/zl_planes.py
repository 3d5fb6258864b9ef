"""Huffman coding of byte planes as OpenZL frames (Meta's OpenZL, ``pip install openzl``).

OpenZL's ``Huffman`` graph is zstd's Huff0: four interleaved streams and a table per 32 K
symbols (per plane under 100,000), several times faster than DEFLATE's Huffman codes both
ways (an exponent plane of trained float32 weights: about 2x ISA-L's inflate and 4x
zlib-ng's deflate on one core). A table holds a 4-bit weight for every byte value up to the
largest one used, so an exponent plane's, whose bytes lie in about 100..127, spends some 50
bytes on zeros; the plane's smallest byte is subtracted first (OpenZL's ``RangePack``), which
shrinks each table to the span of values used: 0.04 % of trained float32 weights, for about
5 microseconds per 128 KiB plane each way. Each coded plane is one OpenZL frame with one
serial output of exactly the plane's size. openzl is imported on first use.
"""

from __future__ import annotations

import functools
import importlib.util
import threading
from typing import Any

import numpy as np

from tensorwire.errors import CodecDataError, DecompressedSizeMismatch

_local = threading.local()  # each thread's OpenZL decompression context


@functools.cache
def zl_available() -> bool:
    """True if openzl can be imported here (without importing it)."""
    return importlib.util.find_spec("openzl") is not None


@functools.cache
def _zl() -> Any:
    try:
        import openzl.ext as zl
    except ImportError as e:
        raise CodecDataError(
            f"a floatplanes plane is an OpenZL frame, and openzl is not installed here: {e} "
            "(pip install 'tensorwire[floatplanes]')"
        ) from e
    return zl


@functools.cache
def _huffman() -> Any:
    """The compressor whose starting graph takes serial bytes as 8-bit numbers, subtracts
    their minimum and Huffman codes the rest (read-only once built: every thread's
    compression context refers to it)."""
    zl = _zl()
    compressor = zl.Compressor()
    huffman = zl.graphs.Huffman()(compressor)
    less_minimum = zl.nodes.RangePack()(compressor, huffman)
    compressor.select_starting_graph(zl.nodes.ConvertSerialToNum8()(compressor, less_minimum))
    return compressor


def huffman_frame(plane: np.ndarray) -> bytes:
    """``plane`` (a contiguous uint8 array) less its smallest byte, Huffman coded, as one
    OpenZL frame that decodes to ``plane``."""
    zl = _zl()
    cctx = zl.CCtx()  # a context codes one frame: a new one each time (microseconds)
    cctx.ref_compressor(_huffman())
    cctx.set_parameter(zl.CParam.FormatVersion, zl.MAX_FORMAT_VERSION)
    # No checksums (2: disabled): 9 bytes and ~3 % of the coding time per frame each way.
    # No other plane of the format has one (stored and DEFLATE planes); integrity is the
    # transport's concern.
    cctx.set_parameter(zl.CParam.ContentChecksum, 2)
    cctx.set_parameter(zl.CParam.CompressedChecksum, 2)
    return bytes(cctx.compress([zl.Input(zl.Type.Serial, plane)]))


def plane_from_frame(frame: memoryview, size: int) -> np.ndarray:
    """Decode the OpenZL ``frame``, which must hold one serial output of exactly ``size``
    bytes, into a new read-only uint8 array.

    The frame's header is checked before anything is decoded: another output count, type or
    size raises ``DecompressedSizeMismatch`` (size) or ``CodecDataError``, as does a frame
    OpenZL cannot read; nothing of more than ``size`` bytes is ever made.
    """
    zl = _zl()
    data = bytes(frame)
    try:
        info = zl.FrameInfo(data)
        outputs, kind = info.num_outputs, info.output_type(0) if info.num_outputs else None
        declared = info.output_content_size(0) if outputs == 1 else None
    except Exception as e:  # OpenZL raises its own error type for a bad header
        raise CodecDataError(f"a floatplanes plane is not an OpenZL frame: {e}") from e
    if outputs != 1 or kind != zl.Type.Serial:
        raise CodecDataError(
            f"a floatplanes plane's OpenZL frame has {outputs} output(s) of type {kind}, "
            "not one serial output"
        )
    if declared != size:
        raise DecompressedSizeMismatch(
            f"a floatplanes plane's OpenZL frame declares {declared} bytes instead of {size}"
        )
    dctx = getattr(_local, "dctx", None)
    if dctx is None:
        dctx = _local.dctx = zl.DCtx()
    try:
        (output,) = dctx.decompress(data)
        plane = output.content.as_nparray()
    except Exception as e:
        raise CodecDataError(f"corrupt OpenZL frame in a floatplanes block: {e}") from e
    if plane.dtype != np.uint8 or plane.size != size:
        raise DecompressedSizeMismatch(
            f"a floatplanes plane's OpenZL frame decoded to {plane.size} bytes instead of {size}"
        )
    return plane
