"""The block container every lossless codec of tensorwire writes (lz4, zstd, zlib, lzma, blosc2).

The input is cut into blocks of ``block_size`` bytes (the last one may be shorter) which
are compressed independently, so that both ends can work on them in parallel threads and
decode each straight into its slice of the output buffer.

Byte layout (all integers little-endian, no padding)::

    offset        size          field
    0             4  (u32)      block_size   bytes per block, 2**16 <= block_size <= 2**30
    4             8  (u64)      raw_length   bytes of the decoded buffer
    12            4  (u32)      nblocks      = ceil(raw_length / block_size); 0 if raw_length is 0
    16            4 * nblocks   sizes        u32 per block: its stored (compressed) size in bytes
    16+4*nblocks  sum(sizes)    blocks       the stored blocks, back to back, in order

Block ``i`` decodes to ``raw_i = min(block_size, raw_length - i * block_size)`` bytes. If
``sizes[i] == raw_i`` the block is stored as is (an encoder stores a block raw whenever
compressing it does not make it smaller); if ``sizes[i] < raw_i`` it is the codec's
compressed form of the block (see each codec's module); ``sizes[i] > raw_i`` is invalid.
The payload is exactly ``16 + 4 * nblocks + sum(sizes)`` bytes long; anything else is
invalid. A decoder checks all of this, and ``raw_length`` against the space it has,
before it decompresses or allocates anything.
"""

from __future__ import annotations

import abc
import itertools
import struct
from typing import Any, ClassVar

import numpy as np

from tensorwire.codecs.abc import DEFAULT_MAX_DECODED_SIZE, Codec, check_int
from tensorwire.codecs.buffers import byte_view, output_for
from tensorwire.codecs.threads import run_all, split_runs
from tensorwire.errors import CodecConfigError, CodecDataError

HEADER = struct.Struct("<IQI")
"""block_size (u32), raw_length (u64), nblocks (u32): the container's fixed 16-byte start."""

MIN_BLOCK_SIZE = 1 << 16
MAX_BLOCK_SIZE = 1 << 30
DEFAULT_BLOCK_SIZE = 1 << 20
_MAX_BLOCKS = 0xFFFF_FFFF


class BlockedCodec(Codec):
    """A codec that compresses fixed-size blocks independently, in the block container.

    Subclasses implement :meth:`_compress_block` and :meth:`_decompress_block`; this class
    does the container, the raw-block rule, the size checks and the parallelism.
    """

    parallel_blocks: ClassVar[bool] = True
    """Whether blocks go to the shared thread pool (False when the library threads itself)."""

    def __init__(self, block_size: int = DEFAULT_BLOCK_SIZE) -> None:
        self.block_size = check_int("block_size", block_size, MIN_BLOCK_SIZE, MAX_BLOCK_SIZE)

    @abc.abstractmethod
    def _compress_block(self, src: memoryview, itemsize: int) -> Any:
        """Return the compressed form of one block (any bytes-like object).

        ``itemsize`` is the element size in bytes of the array being encoded (1 for plain
        bytes), for codecs that shuffle bytes by element.
        """

    def _compress_block_pieces(self, src: memoryview, itemsize: int) -> list[Any]:
        """The compressed form of one block as pieces to write back to back (a codec whose
        block is made of parts gives them unjoined: the container copies each once)."""
        return [self._compress_block(src, itemsize)]

    @abc.abstractmethod
    def _decompress_block(self, src: memoryview, dst: memoryview) -> None:
        """Decompress one block into ``dst``, filling it exactly.

        Raise ``CodecDataError`` if ``src`` is corrupt and ``DecompressedSizeMismatch`` if it
        decodes to another size than ``len(dst)``; never write outside ``dst`` and never
        allocate much more than ``len(dst)``.
        """

    def _runs(self, nblocks: int) -> list[tuple[int, int]]:
        return split_runs(nblocks) if self.parallel_blocks else [(0, nblocks)][:nblocks]

    def encode(self, buf: Any) -> memoryview:
        """Return the container (a memoryview of a new uint8 array) holding ``buf``."""
        src = byte_view(buf)
        itemsize = buf.itemsize if isinstance(buf, np.ndarray) else 1
        raw_length, block_size = src.nbytes, self.block_size
        nblocks = -(-raw_length // block_size)
        if nblocks > _MAX_BLOCKS:
            raise CodecConfigError(
                f"{raw_length} bytes need more than 2**32-1 blocks; use a larger block_size"
            )
        data_start = HEADER.size + 4 * nblocks
        # Stored blocks are never larger than raw ones, so this bounds the output; pages
        # past what gets written are never touched, so they cost no memory.
        out = np.empty(data_start + raw_length, dtype=np.uint8).data

        def encode_run(first: int, stop: int) -> list[int]:
            # Each run writes its blocks back to back from its own raw offset on; the
            # runs are moved together afterwards.
            sizes = []
            pos = data_start + first * block_size
            for i in range(first, stop):
                block = src[i * block_size : (i + 1) * block_size]
                pieces = [
                    memoryview(p).cast("B") for p in self._compress_block_pieces(block, itemsize)
                ]
                size = sum(p.nbytes for p in pieces)
                if size >= len(block):
                    pieces, size = [block], len(block)
                for piece in pieces:
                    out[pos : pos + piece.nbytes] = piece
                    pos += piece.nbytes
                sizes.append(size)
            return sizes

        runs = self._runs(nblocks)
        sizes: list[int] = []
        end = data_start
        for (first, _), run_sizes in zip(runs, run_all(encode_run, runs), strict=True):
            start, used = data_start + first * block_size, sum(run_sizes)
            if start != end:
                out[end : end + used] = out[start : start + used]
            end += used
            sizes += run_sizes
        HEADER.pack_into(out, 0, block_size, raw_length, nblocks)
        struct.pack_into(f"<{nblocks}I", out, HEADER.size, *sizes)
        return out[:end]

    def decode(self, buf: Any, out: Any = None, *, max_size: int = DEFAULT_MAX_DECODED_SIZE) -> Any:
        src = byte_view(buf)
        if src.nbytes < HEADER.size:
            raise CodecDataError(
                f"{self.codec_id} payload of {src.nbytes} bytes is shorter than its "
                f"{HEADER.size}-byte header"
            )
        block_size, raw_length, nblocks = HEADER.unpack_from(src)
        if not MIN_BLOCK_SIZE <= block_size <= MAX_BLOCK_SIZE:
            raise CodecDataError(f"{self.codec_id} payload has invalid block_size {block_size}")
        if nblocks != -(-raw_length // block_size):
            raise CodecDataError(
                f"{self.codec_id} payload declares {nblocks} blocks for {raw_length} bytes "
                f"of {block_size}-byte blocks"
            )
        data_start = HEADER.size + 4 * nblocks
        if src.nbytes < data_start:
            raise CodecDataError(f"{self.codec_id} payload is truncated in its block table")
        sizes = struct.unpack_from(f"<{nblocks}I", src, HEADER.size)
        starts = list(itertools.accumulate(sizes, initial=data_start))
        if starts[-1] != src.nbytes:
            raise CodecDataError(
                f"{self.codec_id} payload is {src.nbytes} bytes but its block table "
                f"accounts for {starts[-1]}"
            )
        last_raw_size = raw_length - (nblocks - 1) * block_size
        if any(size > block_size for size in sizes) or (nblocks and sizes[-1] > last_raw_size):
            raise CodecDataError(f"{self.codec_id} payload has a block larger than its raw size")
        # Only now, with the payload consistent and its size checked, is anything allocated.
        result, dst = output_for(out, raw_length, max_size)

        def decode_run(first: int, stop: int) -> None:
            for i in range(first, stop):
                block = src[starts[i] : starts[i + 1]]
                target = dst[i * block_size : (i + 1) * block_size]
                if len(block) == len(target):
                    target[:] = block
                else:
                    self._decompress_block(block, target)

        run_all(decode_run, self._runs(nblocks))
        return result
