"""Blosc2 in the block container: byte or bit shuffle, then a fast compressor, multithreaded.

Shuffling groups the i-th byte of every element together, which makes numeric arrays
(floats especially) far more compressible than plain LZ4 or zstd see them.

Blosc2 cannot take buffers of 2 GiB or more, so the input is cut into chunks of
``block_size`` bytes (1 GiB by default, at most 2**30) in the block container of
:mod:`tensorwire.codecs.blocked`; each compressed block is one Blosc2 chunk (c-blosc2's
contiguous chunk format with its 32-byte extended header, whose ``nbytes`` must equal the
block's raw size and ``cbytes`` the block's stored size; "uninitialised" special chunks
are refused). Chunks are processed one after another, each by Blosc2's own threads.
The blosc2 library is imported on first use (it takes a sizeable part of a second).
"""

from __future__ import annotations

import copy
import functools
from types import ModuleType
from typing import Any

from tensorwire.codecs.abc import check_choice, check_int
from tensorwire.codecs.blocked import MAX_BLOCK_SIZE, BlockedCodec
from tensorwire.codecs.threads import get_threads
from tensorwire.errors import CodecDataError, DecompressedSizeMismatch

CNAMES = {"blosclz": "BLOSCLZ", "lz4": "LZ4", "lz4hc": "LZ4HC", "zstd": "ZSTD", "zlib": "ZLIB"}
"""Compressor names of the configuration -> the members of ``blosc2.Codec``."""
FILTERS = {"none": "NOFILTER", "shuffle": "SHUFFLE", "bitshuffle": "BITSHUFFLE"}
"""Filter names of the configuration -> the members of ``blosc2.Filter``."""
_MAX_TYPESIZE = 255
_CHUNK_HEADER = 32  # BLOSC_EXTENDED_HEADER_LENGTH
_BLOSC2_FLAGS = 31  # BLOSC2_CHUNK_BLOSC2_FLAGS: bits 4-6 say whether the chunk is "special"
_SPECIAL_UNINIT = 4  # BLOSC2_SPECIAL_UNINIT; zero (1), NaN (2) and value (3) chunks are fine
_THREADED_MIN = 1 << 20  # below this, starting Blosc2's threads costs more than they save


@functools.cache
def _blosc2() -> ModuleType:
    import blosc2

    return blosc2


class Blosc2(BlockedCodec):
    """Blosc2 compression of chunks of up to ``block_size`` bytes.

    ``cname`` is the compressor, ``clevel`` its level 0..9, ``filter`` the shuffle applied
    first, ``typesize`` the element size the shuffle assumes (None: the itemsize of a numpy
    array being encoded, else 1; selectors fill it in with :meth:`for_itemsize`).
    ``nthreads`` (default: :func:`get_threads`) is a local setting, not part of the
    configuration sent to the peer.
    """

    codec_id = "blosc2"
    parallel_blocks = False

    def __init__(
        self,
        cname: str = "lz4",
        clevel: int = 5,
        filter: str = "shuffle",
        typesize: int | None = None,
        block_size: int = MAX_BLOCK_SIZE,
        *,
        nthreads: int | None = None,
    ) -> None:
        self.cname = check_choice("cname", cname, tuple(CNAMES))
        self.clevel = check_int("clevel", clevel, 0, 9)
        self.filter = check_choice("filter", filter, tuple(FILTERS))
        self.typesize = None if typesize is None else check_int("typesize", typesize, 1, 255)
        super().__init__(block_size)
        self._nthreads = None if nthreads is None else check_int("nthreads", nthreads, 1, 1024)

    def for_itemsize(self, itemsize: int) -> Blosc2:
        if self.typesize is not None or not 1 <= itemsize <= _MAX_TYPESIZE:
            return self
        pinned = copy.copy(self)
        pinned.typesize = itemsize
        return pinned

    def _threads_for(self, nbytes: int) -> int:
        return 1 if nbytes < _THREADED_MIN else (self._nthreads or get_threads())

    def _compress_block(self, src: memoryview, itemsize: int) -> Any:
        typesize = self.typesize or (itemsize if itemsize <= _MAX_TYPESIZE else 1)
        blosc2 = _blosc2()
        return blosc2.compress2(
            src,
            codec=getattr(blosc2.Codec, CNAMES[self.cname]),
            clevel=self.clevel,
            filters=[getattr(blosc2.Filter, FILTERS[self.filter])],
            typesize=typesize,
            nthreads=self._threads_for(len(src)),
        )

    def _decompress_block(self, src: memoryview, dst: memoryview) -> None:
        if len(src) < _CHUNK_HEADER:
            raise CodecDataError(f"a blosc2 chunk of {len(src)} bytes is shorter than its header")
        # An "uninitialised" chunk would leave dst as it was: it must be written in full.
        if (src[_BLOSC2_FLAGS] >> 4) & 7 >= _SPECIAL_UNINIT:
            raise CodecDataError("a blosc2 chunk declares uninitialised or unknown contents")
        # python-blosc2 trusts the chunk header for the output size, so check it first.
        blosc2 = _blosc2()
        nbytes, cbytes, _ = blosc2.get_cbuffer_sizes(src)
        if cbytes != len(src):
            raise CodecDataError(f"a blosc2 chunk declares {cbytes} bytes but has {len(src)}")
        if nbytes != len(dst):
            raise DecompressedSizeMismatch(
                f"a blosc2 chunk declares {nbytes} bytes for a block of {len(dst)}"
            )
        try:
            blosc2.decompress2(src, dst=dst, nthreads=self._threads_for(len(dst)))
        except (RuntimeError, ValueError) as e:
            raise CodecDataError(f"corrupt blosc2 chunk: {e}") from e
