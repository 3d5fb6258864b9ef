"""``floatplanes``: lossless compression that knows a float's bytes apart.

Each block of the block container (:mod:`tensorwire.codecs.blocked`) is cut into byte
planes (:mod:`tensorwire.codecs.planes`: sign rotated to the bottom, so one plane holds
exponent bits only) and each plane is entropy coded on its own as a raw DEFLATE stream
(:mod:`tensorwire.codecs.deflate_planes`: Huffman only, or runs for the zero-heavy planes
of a round-to-round XOR) or stored raw when it does not compress (mantissas). Blocks are
encoded and decoded in parallel threads, each decoded straight into its slice of the
output. The idea is ZipNN's (byte grouping, then Huffman per group).

Compressed block layout (all integers little-endian)::

    offset   size        field
    0        1  (u8)     typesize T in {1, 2, 4, 8}; the block's raw size is a multiple of T
    1        4 * T       sizes   u32 per plane: its stored size in bytes, bit 31 a flag
    1 + 4T   sum(sizes)  planes  plane 0 (least significant byte) first, back to back

With ``n = raw size / T`` and ``s`` a size without its bit 31: bit 31 set: an OpenZL frame
of ``s`` bytes that decodes to exactly ``n`` (:mod:`tensorwire.codecs.zl_planes`); else
``s == n``: the plane is stored as is; ``s < n``: a raw DEFLATE stream (RFC 1951) that
inflates to exactly ``n`` bytes; ``s > n``: invalid.

``floatplanes-zl`` is the same format whose encoder Huffman codes planes with OpenZL
(Huff0) instead of DEFLATE, a coder several times faster both ways; it exists where openzl
is installed, so a peer that announces it can decode it. Decoders of either id read both.
"""

from __future__ import annotations

import copy
import struct
from typing import Any

import numpy as np

from tensorwire.codecs.blocked import BlockedCodec
from tensorwire.codecs.deflate_planes import (
    compress_planes,
    deflate_plane,
    inflate_plane,
    plane_choices,
)
from tensorwire.codecs.planes import TYPESIZES, merge_planes, split_planes
from tensorwire.codecs.zl_planes import huffman_frame, plane_from_frame
from tensorwire.errors import CodecConfigError, CodecDataError

ZL_FLAG = 1 << 31
"""Bit 31 of a plane's size: the plane is an OpenZL frame."""
DEFAULT_BLOCK_SIZE = 1 << 19
"""512 KiB: a block, its planes and its output stay in a core's cache (1 MiB of L2 on the
machines measured), and the per-block work in Python is paid half as often as at 256 KiB."""


class FloatPlanes(BlockedCodec):
    """Byte planes of ``typesize``-byte elements, each entropy coded or stored raw.

    ``typesize`` is 2 (float16, bfloat16), 4 (float32) or 8 (float64) — any element of
    that size works, the XOR of two models' bits too — or 1 (plain bytes, one plane);
    None takes the itemsize of the numpy array being encoded (selectors fill it in with
    :meth:`for_itemsize`), and 1 for other buffers or itemsizes.
    """

    codec_id = "floatplanes"

    def __init__(self, typesize: int | None = None, block_size: int = DEFAULT_BLOCK_SIZE) -> None:
        if typesize is not None and typesize not in TYPESIZES:
            raise CodecConfigError(
                f"typesize must be one of {', '.join(map(str, TYPESIZES))} or None, "
                f"got {typesize!r}"
            )
        self.typesize = typesize
        super().__init__(block_size)
        if block_size % 8:
            raise CodecConfigError(f"block_size must be a multiple of 8, got {block_size}")

    def for_itemsize(self, itemsize: int) -> FloatPlanes:
        if self.typesize is not None or itemsize not in TYPESIZES:
            return self
        pinned = copy.copy(self)
        pinned.typesize = itemsize
        return pinned

    def _compress_block(self, src: memoryview, itemsize: int) -> Any:
        return b"".join(self._compress_block_pieces(src, itemsize))

    def _compress_block_pieces(self, src: memoryview, itemsize: int) -> list[Any]:
        typesize = self.typesize or (itemsize if itemsize in TYPESIZES else 1)
        if len(src) % typesize:
            typesize = 1  # a buffer that is not whole elements: its bytes as they are
        planes = split_planes(src, typesize)
        coded = self._code_planes(planes)
        stored = [planes[k].data if s is None else s for k, (s, _) in enumerate(coded)]
        flags = [ZL_FLAG if zl else 0 for _, zl in coded]
        sizes = [len(s) | f for s, f in zip(stored, flags, strict=True)]
        head = struct.pack(f"<B{typesize}I", typesize, *sizes)
        return [head, *stored]

    def _code_planes(self, planes: np.ndarray) -> list[tuple[bytes | None, bool]]:
        """Each plane coded (None: stored as is), and whether it is an OpenZL frame. Blocks
        are coded in parallel threads: nothing here is kept on the codec."""
        return [(stream, False) for stream in compress_planes(planes)]

    def _decompress_block(self, src: memoryview, dst: memoryview) -> None:
        if not len(src) or src[0] not in TYPESIZES:
            raise CodecDataError(
                f"a floatplanes block has typesize {src[0] if len(src) else 'nothing'}, "
                f"not one of {TYPESIZES}"
            )
        typesize = src[0]
        if len(dst) % typesize:
            raise CodecDataError(
                f"a floatplanes block of {len(dst)} bytes is not whole {typesize}-byte elements"
            )
        start = 1 + 4 * typesize
        if len(src) < start:
            raise CodecDataError("a floatplanes block is truncated in its plane table")
        flagged = struct.unpack_from(f"<{typesize}I", src, 1)
        sizes = [size & ~ZL_FLAG for size in flagged]
        n = len(dst) // typesize
        if any(size > n for size in sizes):
            raise CodecDataError("a floatplanes plane is larger than its raw size")
        if start + sum(sizes) != len(src):
            raise CodecDataError(
                f"a floatplanes block is {len(src)} bytes but its plane table accounts "
                f"for {start + sum(sizes)}"
            )
        planes = []
        for size, flags in zip(sizes, flagged, strict=True):
            stream = src[start : start + size]
            start += size
            if flags & ZL_FLAG:
                planes.append(plane_from_frame(stream, n))
            elif size == n:  # stored: read where it lies in the payload, no copy
                planes.append(np.frombuffer(stream, np.uint8))
            else:
                planes.append(inflate_plane(stream, n))
        merge_planes(planes, dst, typesize)


class FloatPlanesZl(FloatPlanes):
    """floatplanes whose Huffman-coded planes are OpenZL (Huff0) frames: the same ratio
    within about 0.1 %, coded and decoded several times faster than DEFLATE's codes. Planes
    of runs (XOR deltas) stay run-length DEFLATE. Needs openzl (extra ``floatplanes``)."""

    codec_id = "floatplanes-zl"

    def fallback(self) -> FloatPlanes:
        """The codec for a peer that cannot decode this one (no openzl): plain floatplanes."""
        return FloatPlanes(self.typesize, self.block_size)

    def _code_planes(self, planes: np.ndarray) -> list[tuple[bytes | None, bool]]:
        coded: list[tuple[bytes | None, bool]] = []
        for plane, choice in zip(planes, plane_choices(planes), strict=True):
            if choice == "raw":
                coded.append((None, False))
                continue
            runs = choice == "runs"
            stream = deflate_plane(plane, runs=True) if runs else huffman_frame(plane)
            coded.append((stream, not runs) if len(stream) < plane.size else (None, False))
        return coded
