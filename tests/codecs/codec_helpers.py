"""Codecs and payload builders shared by the codec tests."""

from __future__ import annotations

import struct

from tensorwire.codecs import LZ4, LZMA, Blosc2, Codec, FloatPlanes, FloatPlanesZl, Zlib, Zstd
from tensorwire.codecs.zl_planes import zl_available

SMALL_BLOCK = 1 << 16  # the smallest block size, so that a few hundred KiB span many blocks

CODECS: list[Codec] = [
    LZ4(block_size=SMALL_BLOCK),
    LZ4(acceleration=8),
    Zstd(block_size=SMALL_BLOCK),
    Zstd(level=-5),
    Zlib(block_size=SMALL_BLOCK),
    LZMA(preset=0, block_size=SMALL_BLOCK),
    Blosc2(block_size=SMALL_BLOCK),
    Blosc2(cname="zstd", clevel=3, filter="bitshuffle", typesize=4),
    Blosc2(cname="blosclz", filter="none", block_size=SMALL_BLOCK),
    Blosc2(cname="lz4hc", clevel=9),
    Blosc2(cname="zlib", clevel=1, typesize=2),
    FloatPlanes(block_size=SMALL_BLOCK),
    FloatPlanes(typesize=2),
    FloatPlanes(typesize=8, block_size=SMALL_BLOCK),
]
if zl_available():
    CODECS += [FloatPlanesZl(block_size=SMALL_BLOCK), FloatPlanesZl(typesize=2)]


def container(block_size: int, raw_length: int, blocks: list[bytes], nblocks: int = -1) -> bytes:
    """Build a block container by hand, as docs/wire-format.md describes it."""
    n = len(blocks) if nblocks < 0 else nblocks
    sizes = struct.pack(f"<{len(blocks)}I", *map(len, blocks))
    return struct.pack("<IQI", block_size, raw_length, n) + sizes + b"".join(blocks)
