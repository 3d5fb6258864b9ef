"""LZMA (xz) in the block container: the best ratio, for slow links.

Each compressed block is one complete .xz stream (LZMA2 filter, CRC-64 check) whose
dictionary is no larger than the block needs: ``min(preset's size, max(4096, raw size))``.
A decoder refuses streams that need more memory than about twice the block's raw size.
"""

from __future__ import annotations

import lzma

from tensorwire.codecs.abc import check_int
from tensorwire.codecs.blocked import DEFAULT_BLOCK_SIZE, BlockedCodec
from tensorwire.errors import CodecDataError, DecompressedSizeMismatch

_MIN_DICT = 1 << 12  # LZMA_DICT_SIZE_MIN
_DECODER_OVERHEAD = 1 << 17  # liblzma's state next to the dictionary is about 64 KiB
_PRESET_DICT_SIZES = (256 << 10, *(mib << 20 for mib in (1, 2, 4, 4, 8, 8, 16, 32, 64)))
"""xz's dictionary size per preset 0..9 (liblzma's lzma_lzma_preset), in bytes."""


class LZMA(BlockedCodec):
    """LZMA2 (.xz) block compression at ``preset`` 0 (fastest) .. 9 (smallest)."""

    codec_id = "lzma"

    def __init__(self, preset: int = 6, block_size: int = DEFAULT_BLOCK_SIZE) -> None:
        self.preset = check_int("preset", preset, 0, 9)
        super().__init__(block_size)

    def _compress_block(self, src: memoryview, itemsize: int) -> bytes:
        # A dictionary larger than the block gains nothing and costs the decoder memory.
        dict_size = max(_MIN_DICT, min(len(src), _PRESET_DICT_SIZES[self.preset]))
        filters = [{"id": lzma.FILTER_LZMA2, "preset": self.preset, "dict_size": dict_size}]
        return lzma.compress(src, format=lzma.FORMAT_XZ, filters=filters)

    def _decompress_block(self, src: memoryview, dst: memoryview) -> None:
        # The dictionary is rounded up to 2**n or 3 * 2**(n-1): at most 1.5x the block.
        memlimit = 2 * max(len(dst), _MIN_DICT) + _DECODER_OVERHEAD
        decompressor = lzma.LZMADecompressor(format=lzma.FORMAT_XZ, memlimit=memlimit)
        try:
            # One byte more than the block holds tells "too long" from "exactly right".
            data = decompressor.decompress(src, len(dst) + 1)
        except lzma.LZMAError as e:
            raise CodecDataError(f"corrupt or oversized lzma block: {e}") from e
        if len(data) != len(dst):
            raise DecompressedSizeMismatch(
                f"an lzma block decoded to {len(data)}{'+' * (len(data) > len(dst))} bytes "
                f"instead of {len(dst)}"
            )
        if not decompressor.eof or decompressor.unused_data:
            raise CodecDataError("an lzma block is truncated or has trailing bytes")
        dst[:] = data
