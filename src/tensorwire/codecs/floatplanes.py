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
    1        4 * T       sizes   u32 per plane: its stored size in bytes
    1 + 4T   sum(sizes)  planes  plane 0 (least significant byte) first, back to back

With ``n = raw size / T``: ``sizes[k] == n``: the plane is stored as is; ``< n``: a raw
DEFLATE stream (RFC 1951) that inflates to exactly ``n`` bytes; ``> n``: invalid.
"""

from __future__ import annotations

import copy
import struct
from typing import Any

import numpy as np

from tensorwire.codecs.blocked import BlockedCodec
from tensorwire.codecs.deflate_planes import compress_planes, inflate_plane
from tensorwire.codecs.planes import TYPESIZES, merge_planes, split_planes
from tensorwire.errors import CodecConfigError, CodecDataError

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
        typesize = self.typesize or (itemsize if itemsize in TYPESIZES else 1)
        if len(src) % typesize:
            typesize = 1  # a buffer that is not whole elements: its bytes as they are
        planes = split_planes(src, typesize)
        streams = compress_planes(planes)
        stored = [planes[k].data if s is None else s for k, s in enumerate(streams)]
        head = struct.pack(f"<B{typesize}I", typesize, *(len(s) for s in stored))
        return b"".join([head, *stored])

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
        sizes = struct.unpack_from(f"<{typesize}I", src, 1)
        n = len(dst) // typesize
        if any(size > n for size in sizes):
            raise CodecDataError("a floatplanes plane is larger than its raw size")
        if start + sum(sizes) != len(src):
            raise CodecDataError(
                f"a floatplanes block is {len(src)} bytes but its plane table accounts "
                f"for {start + sum(sizes)}"
            )
        planes = []
        for size in sizes:
            stream = src[start : start + size]
            start += size
            # A stored plane is read where it lies in the payload: no copy.
            stored = size == n
            planes.append(np.frombuffer(stream, np.uint8) if stored else inflate_plane(stream, n))
        merge_planes(planes, dst, typesize)
