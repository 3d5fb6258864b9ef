"""LZ4 in the block container: fast, for links faster than the codec's throughput.

Each compressed block is one raw LZ4 block (the LZ4 block format, no frame, no size
prefix), as ``LZ4_compress_fast`` writes it.
"""

from __future__ import annotations

import lz4.block

from tensorwire.codecs.abc import check_int
from tensorwire.codecs.blocked import DEFAULT_BLOCK_SIZE, BlockedCodec
from tensorwire.errors import CodecDataError, DecompressedSizeMismatch

_MAX_ACCELERATION = 65537  # LZ4_ACCELERATION_MAX


class LZ4(BlockedCodec):
    """LZ4 block compression; ``acceleration`` > 1 trades ratio for speed (1 = default)."""

    codec_id = "lz4"

    def __init__(self, acceleration: int = 1, block_size: int = DEFAULT_BLOCK_SIZE) -> None:
        self.acceleration = check_int("acceleration", acceleration, 1, _MAX_ACCELERATION)
        super().__init__(block_size)

    def _compress_block(self, src: memoryview, itemsize: int) -> bytes:
        return lz4.block.compress(
            src, mode="fast", acceleration=self.acceleration, store_size=False
        )

    def _decompress_block(self, src: memoryview, dst: memoryview) -> None:
        # lz4.block cannot decompress into a buffer: one cache-hot copy per block.
        try:
            data = lz4.block.decompress(src, uncompressed_size=len(dst))
        except lz4.block.LZ4BlockError as e:
            raise CodecDataError(f"corrupt lz4 block: {e}") from e
        if len(data) != len(dst):
            raise DecompressedSizeMismatch(
                f"an lz4 block decoded to {len(data)} bytes instead of {len(dst)}"
            )
        dst[:] = data
