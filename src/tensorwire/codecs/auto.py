"""Choosing each tensor's codec by what sending it would cost, from a small sample.

Like Dask's ``maybe_compress``, :class:`AutoCodec` compresses a few evenly spread pieces of
the tensor instead of the whole of it. Unlike Dask, it tries several codecs and weighs
what each would cost in seconds — compressing, sending the smaller payload over a link of
the given bandwidth, decompressing — against sending the tensor raw, and keeps the fastest.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tensorwire.codecs.abc import Codec
from tensorwire.codecs.blocked import BlockedCodec
from tensorwire.codecs.blosc2 import Blosc2
from tensorwire.codecs.lz4 import LZ4
from tensorwire.codecs.threads import get_threads
from tensorwire.codecs.zstd import Zstd
from tensorwire.errors import CodecConfigError

NSAMPLES = 8
"""Pieces sampled per tensor, spread evenly from its first byte to its last."""
MIN_SAMPLE_BYTES = 16 << 10
MAX_SAMPLE_BYTES = 64 << 10
"""Sample size bounds in bytes; in between, a sample is 1/1024 of the tensor."""
_PARALLEL_BLOCK = 1 << 20  # bytes of work a codec gives each thread at least
_WARM_UP = memoryview(np.zeros(4096, dtype=np.uint8))  # compressible by every codec
_CALIBRATION_RUNS = 3


@dataclass(frozen=True)
class CodecEstimate:
    """What sending one tensor with ``codec`` (None: raw) is expected to cost, in seconds.

    ``decode_seconds`` is None when it was not measured because the codec had already
    lost on compression and wire time alone. ``ratio`` is encoded / raw bytes.
    """

    codec: Codec | None
    ratio: float
    encode_seconds: float
    wire_seconds: float
    decode_seconds: float | None
    eligible: bool
    """False when the codec saves less than ``min_saving`` of the bytes."""

    @property
    def total_seconds(self) -> float:
        """Encode + wire + decode seconds; infinite if not eligible or not fully measured."""
        if not self.eligible or self.decode_seconds is None:
            return math.inf
        return self.encode_seconds + self.wire_seconds + self.decode_seconds


class AutoCodec:
    """A codec selector that sends each tensor raw or with the codec that is fastest overall.

    ``bandwidth`` is the link's throughput in bytes per second; tensors under ``min_size``
    bytes go raw, and so does any tensor no candidate shrinks by at least ``min_saving``
    (a fraction). ``candidates`` (default: lz4, blosc2 lz4 with byte and bit shuffle, zstd
    level 1) are tried cheapest first, each set up for the tensor's itemsize
    (:meth:`Codec.for_itemsize`). Use it wherever a ``CodecSelector`` is expected:
    ``auto(name, array)``.
    """

    def __init__(
        self,
        bandwidth: float = 1e9,
        candidates: Sequence[Codec] | None = None,
        min_size: int = 64 << 10,
        min_saving: float = 0.10,
    ) -> None:
        self.bandwidth = bandwidth
        if isinstance(min_size, bool) or not isinstance(min_size, int) or min_size < 0:
            raise CodecConfigError(f"min_size must be an int >= 0 (bytes), got {min_size!r}")
        if not 0.0 <= min_saving < 1.0:
            raise CodecConfigError(f"min_saving must be in [0, 1), got {min_saving!r}")
        if candidates is not None and not all(isinstance(c, Codec) for c in candidates):
            raise CodecConfigError("candidates must be tensorwire.codecs.Codec instances")
        self.min_size = min_size
        self.min_saving = min_saving
        self._candidates = None if candidates is None else list(candidates)
        self._by_itemsize: dict[int, list[_Candidate]] = {}
        self._lock = threading.Lock()

    @property
    def bandwidth(self) -> float:
        """The link's throughput in bytes per second that choices are made for."""
        return self._bandwidth

    @bandwidth.setter
    def bandwidth(self, bytes_per_second: float) -> None:
        self._bandwidth = _check_bandwidth(bytes_per_second)

    def update_bandwidth(self, bytes_per_second: float, weight: float = 0.5) -> None:
        """Blend a measured throughput (bytes/s) into ``bandwidth`` with ``weight`` in (0, 1]."""
        measured = _check_bandwidth(bytes_per_second)
        if not 0.0 < weight <= 1.0:
            raise CodecConfigError(f"weight must be in (0, 1], got {weight!r}")
        self._bandwidth = (1.0 - weight) * self._bandwidth + weight * measured

    def candidates_for(self, itemsize: int) -> list[Codec]:
        """Return the candidates tried for tensors of ``itemsize``-byte elements, in order."""
        return [candidate.codec for candidate in self._calibrated(itemsize)]

    def _calibrated(self, itemsize: int) -> list[_Candidate]:
        with self._lock:
            found = self._by_itemsize.get(itemsize)
            if found is None:
                base = self._candidates
                if base is None:
                    base = _default_candidates(itemsize)
                found = [_Candidate(c.for_itemsize(itemsize), itemsize) for c in base]
                self._by_itemsize[itemsize] = found
            return found

    def select(self, name: str, array: np.ndarray) -> list[Codec]:
        """Return the codec chain for ``array``: ``[]`` (raw) or ``[fastest codec]``."""
        if array.nbytes < self.min_size:
            return []
        best = min(self.estimate(array), key=lambda e: e.total_seconds)
        return [] if best.codec is None else [best.codec]

    __call__ = select

    def estimate(self, array: np.ndarray) -> list[CodecEstimate]:
        """Estimate raw (first) and every candidate for ``array`` from one sample of it."""
        nbytes, bandwidth = array.nbytes, self._bandwidth
        raw = CodecEstimate(None, 1.0, 0.0, nbytes / bandwidth, 0.0, eligible=True)
        estimates = [raw]
        if nbytes == 0:
            return estimates
        sample = memoryview(_sample(array))
        scratch = memoryview(np.empty(sample.nbytes, dtype=np.uint8))
        # Seconds on the sample scale to the tensor, spread over the threads it will use.
        scale = nbytes / sample.nbytes / max(1, min(get_threads(), nbytes // _PARALLEL_BLOCK))
        best = raw.total_seconds
        for candidate in self._calibrated(array.itemsize):
            trial = _Trial(candidate.codec, sample, array.itemsize)
            ratio = trial.encoded_nbytes / sample.nbytes
            encode_seconds = candidate.scaled_encode(trial.encode_seconds, scale)
            wire_seconds = ratio * nbytes / bandwidth
            eligible = 1.0 - ratio >= self.min_saving
            decode_seconds = None
            if eligible and encode_seconds + wire_seconds < best:
                decode_seconds = candidate.scaled_decode(trial.decode_seconds(scratch), scale)
            estimate = CodecEstimate(
                candidate.codec, ratio, encode_seconds, wire_seconds, decode_seconds, eligible
            )
            best = min(best, estimate.total_seconds)
            estimates.append(estimate)
        return estimates

    def __repr__(self) -> str:
        return (
            f"AutoCodec(bandwidth={self._bandwidth:.4g}, min_size={self.min_size}, "
            f"min_saving={self.min_saving}, candidates={self._candidates!r})"
        )


class _Trial:
    """One codec run on a sample: its size and seconds, decoding only when asked."""

    def __init__(self, codec: Codec, sample: memoryview, itemsize: int) -> None:
        self.codec = codec
        # A blocked codec is timed on one block, without the container: on a sample
        # smaller than a block, the container's fixed cost would be scaled up with it.
        self.block = isinstance(codec, BlockedCodec) and sample.nbytes <= codec.block_size
        start = time.perf_counter()
        if self.block:
            self.encoded = codec._compress_block(sample, itemsize)
        else:
            self.encoded = codec.encode(sample)
        self.encode_seconds = time.perf_counter() - start
        self.encoded_nbytes = memoryview(self.encoded).nbytes

    def decode_seconds(self, scratch: memoryview) -> float:
        start = time.perf_counter()
        if self.block:
            self.codec._decompress_block(memoryview(self.encoded), scratch)
        else:
            self.codec.decode(self.encoded, out=scratch)
        return time.perf_counter() - start


class _Candidate:
    """A candidate codec and its fixed cost per call, which does not grow with the data."""

    def __init__(self, codec: Codec, itemsize: int) -> None:
        self.codec = codec
        # The first run sets up contexts; the best of the next few is the fixed cost.
        scratch = memoryview(np.empty(_WARM_UP.nbytes, dtype=np.uint8))
        _Trial(codec, _WARM_UP, itemsize).decode_seconds(scratch)
        trials = [_Trial(codec, _WARM_UP, itemsize) for _ in range(_CALIBRATION_RUNS)]
        self.encode_overhead = min(t.encode_seconds for t in trials)
        self.decode_overhead = min(t.decode_seconds(scratch) for t in trials)

    def scaled_encode(self, seconds: float, scale: float) -> float:
        return max(seconds - self.encode_overhead, 0.0) * scale + self.encode_overhead

    def scaled_decode(self, seconds: float, scale: float) -> float:
        return max(seconds - self.decode_overhead, 0.0) * scale + self.decode_overhead


def _check_bandwidth(bytes_per_second: float) -> float:
    if (
        isinstance(bytes_per_second, bool)
        or not isinstance(bytes_per_second, int | float)
        or not math.isfinite(bytes_per_second)
        or bytes_per_second <= 0
    ):
        raise CodecConfigError(
            f"bandwidth must be a finite number > 0 (bytes/s), got {bytes_per_second!r}"
        )
    return float(bytes_per_second)


def _default_candidates(itemsize: int) -> list[Codec]:
    # Cheapest first, so that later, slower ones are often ruled out on encode time alone.
    shuffled: list[Codec] = [Blosc2(cname="lz4", filter="shuffle")] if itemsize > 1 else []
    return [LZ4(), *shuffled, Blosc2(cname="lz4", filter="bitshuffle"), Zstd(level=1)]


def _sample(array: np.ndarray) -> np.ndarray:
    """Return evenly spread pieces of ``array``'s bytes, element aligned, as one uint8 array."""
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
