"""Judging a tensor's compressibility from a few evenly spread pieces of it (as Dask does).

:func:`sample_bytes` takes the pieces; a :class:`Trial` runs one codec on them and times it.
"""

from __future__ import annotations

import math
import time

import numpy as np

from tensorwire.codecs.abc import Codec
from tensorwire.codecs.blocked import BlockedCodec

NSAMPLES = 8
"""Pieces sampled per tensor, spread evenly from its first byte to its last."""
MIN_SAMPLE_BYTES = 64 << 10
MAX_SAMPLE_BYTES = 64 << 10
"""Sample size bounds in bytes; in between, a sample is 1/1024 of the tensor."""


def sample_bytes(array: np.ndarray) -> np.ndarray:
    """Return evenly spread pieces of ``array``'s bytes, element aligned, as one uint8 array.

    The pieces are always the same for the same array: a choice made on them is too.
    """
    nbytes, itemsize = array.nbytes, array.itemsize
    total = min(max(nbytes // 1024, MIN_SAMPLE_BYTES), MAX_SAMPLE_BYTES)
    contiguous = array.flags.c_contiguous or array.flags.f_contiguous
    if nbytes <= total:
        whole = array if contiguous else np.ascontiguousarray(array)
        return whole.reshape(-1, order="A").view(np.uint8)
    count = max(1, total // NSAMPLES // itemsize)  # elements per piece
    starts = np.linspace(0, array.size - count, NSAMPLES).astype(np.int64).tolist()
    if contiguous:
        flat = array.reshape(-1, order="A")
        pieces = [flat[s : s + count] for s in starts]
    else:
        # .flat slices copy just the piece, in C order, without copying the whole array.
        pieces = [array.flat[s : s + count] for s in starts]
    return np.concatenate(pieces).view(np.uint8)


class Trial:
    """One codec run on a sample: its size and seconds, decoding only when asked.

    Seconds are this thread's CPU time (the sample is small enough for one thread), which
    leaves out what other processes took of the CPU meanwhile; :meth:`time_more` runs it
    again and keeps the fastest.
    """

    def __init__(self, codec: Codec, sample: memoryview, itemsize: int) -> None:
        self.codec = codec
        self.sample = sample
        self.itemsize = itemsize
        # A blocked codec is timed on one block, without the container: on a sample
        # smaller than a block, the container's fixed cost would be scaled up with it.
        fits = isinstance(codec, BlockedCodec) and sample.nbytes <= codec.block_size
        self._blocked = codec if fits and isinstance(codec, BlockedCodec) else None
        self.encode_seconds = math.inf
        self._encode()
        self.encoded_nbytes = memoryview(self.encoded).nbytes

    def _encode(self) -> None:
        start = time.thread_time()
        if self._blocked is not None:
            self.encoded = self._blocked._compress_block(self.sample, self.itemsize)
        else:
            self.encoded = self.codec.encode(self.sample)
        self.encode_seconds = min(self.encode_seconds, time.thread_time() - start)

    def time_more(self, runs: int) -> None:
        """Encode ``runs`` more times, keeping the fastest."""
        for _ in range(runs):
            self._encode()

    def decode_seconds(self, scratch: memoryview, runs: int = 1) -> float:
        """The fastest of ``runs`` decodes into ``scratch``, seconds."""
        best = math.inf
        for _ in range(runs):
            start = time.thread_time()
            if self._blocked is not None:
                self._blocked._decompress_block(memoryview(self.encoded), scratch)
            else:
                self.codec.decode(self.encoded, out=scratch)
            best = min(best, time.thread_time() - start)
        return best


def sample_ratio(codec: Codec, array: np.ndarray) -> float:
    """Encoded / raw bytes of ``codec`` (set up for the array's itemsize) on a sample."""
    sample = sample_bytes(array).data
    if not sample.nbytes:
        return 1.0
    return Trial(codec, sample, array.itemsize).encoded_nbytes / sample.nbytes
