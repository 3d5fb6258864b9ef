"""zlib (DEFLATE) in the block container: the most widely readable format.

Each compressed block is one complete zlib stream (RFC 1950: DEFLATE with the zlib header
and Adler-32 trailer) and nothing follows it in the block.
"""

from __future__ import annotations

import zlib

from tensorwire.codecs.abc import check_int
from tensorwire.codecs.blocked import DEFAULT_BLOCK_SIZE, BlockedCodec
from tensorwire.errors import CodecDataError, DecompressedSizeMismatch


class Zlib(BlockedCodec):
    """zlib block compression at ``level`` 0 (store) .. 9 (smallest); -1 is zlib's 6."""

    codec_id = "zlib"

    def __init__(self, level: int = 1, block_size: int = DEFAULT_BLOCK_SIZE) -> None:
        self.level = check_int("level", level, -1, 9)
        super().__init__(block_size)

    def _compress_block(self, src: memoryview, itemsize: int) -> bytes:
        return zlib.compress(src, self.level)

    def _decompress_block(self, src: memoryview, dst: memoryview) -> None:
        decompressor = zlib.decompressobj()
        try:
            # One byte more than the block holds tells "too long" from "exactly right".
            data = decompressor.decompress(src, len(dst) + 1)
        except zlib.error as e:
            raise CodecDataError(f"corrupt zlib block: {e}") from e
        if len(data) != len(dst):
            raise DecompressedSizeMismatch(
                f"a zlib block decoded to {len(data)}{'+' * (len(data) > len(dst))} bytes "
                f"instead of {len(dst)}"
            )
        if not decompressor.eof or decompressor.unused_data or decompressor.unconsumed_tail:
            raise CodecDataError("a zlib block is truncated or has trailing bytes")
        dst[:] = data
