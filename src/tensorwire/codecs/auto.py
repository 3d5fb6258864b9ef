"""Choosing each tensor's codec by what sending it would cost, from a small sample.

Like Dask's ``maybe_compress``, :class:`AutoCodec` compresses a few evenly spread pieces of
the tensor instead of the whole of it. Unlike Dask, it tries several codecs and weighs
what each would cost in seconds — compressing, sending the smaller payload over a link of
the given bandwidth, decompressing — against sending the tensor raw, and keeps the fastest.
A codec's seconds are its sample's CPU seconds times how much slower that codec's encodes
that really happened ran than their samples promised (:mod:`tensorwire.codecs.slowdown`): on
shared cores, and with its per-call and threading overheads, a codec costs more than its
sample on a core of its own says.

The choice is made once per stream (name, dtype, shape, context: see
:mod:`tensorwire.codecs.streams`) and kept for the next messages of that stream; it is
re-weighed without sampling when the bandwidth or that slowdown changes, and sampled again
only now and then or when a codec stops achieving what its sample promised.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from tensorwire.codecs.abc import Codec
from tensorwire.codecs.blosc2 import Blosc2
from tensorwire.codecs.floatplanes import FloatPlanes, FloatPlanesZl
from tensorwire.codecs.lz4 import LZ4
from tensorwire.codecs.sampling import Trial, sample_bytes
from tensorwire.codecs.slowdown import CodecSlowdown
from tensorwire.codecs.streams import (
    MAX_STREAMS,
    RECHECK_BYTES,
    RECHECK_EVERY,
    ContextSelector,
    Recheck,
    StreamChoice,
    StreamChoices,
    StreamKey,
    stream_key,
)
from tensorwire.codecs.threads import get_threads
from tensorwire.codecs.zl_planes import zl_available
from tensorwire.codecs.zstd import Zstd
from tensorwire.errors import CodecConfigError

REWEIGH = 0.05
"""A stream's choice is re-weighed once the bandwidth or the codecs' slowdown moved by more
than this fraction."""
ASSUMED_BANDWIDTH = 1e9
"""Bytes per second assumed of a link until a send measures it (a fast LAN: raw wins)."""
TIE_MARGIN = 0.5
"""An earlier option (raw, then the candidates cheapest first) is kept unless a later one
is faster by more than this fraction of the two's codec seconds: timing noise on a busy
machine moves those by tens of percent, and must not flip the choice."""
FLOATPLANES_MAX_BANDWIDTH = 2e8
"""floatplanes is tried only on links slower than this (bytes/s): it codes a few hundred MB/s
per thread, so on faster links raw or the blosc2 codecs win and sampling it would be waste."""
_PARALLEL_BLOCK = 1 << 20  # bytes of work a codec gives each thread at least
_WARM_UP = np.zeros(4096, dtype=np.uint8).data  # compressible by every codec
_TIMED_RUNS = 3  # runs of a codec that can win, on a sample: the fastest one counts


@dataclass(frozen=True)
class CodecEstimate:
    """What sending one tensor with ``codec`` (None: raw) is expected to cost, in seconds.

    ``encode_seconds`` and ``decode_seconds`` are wall seconds: the sample's CPU seconds
    times the selector's :meth:`AutoCodec.codec_slowdown` for the codec (decoding is assumed
    to run as slowly at the peer as encoding does here). ``decode_seconds`` is None when it was not
    measured because the codec had already lost on compression and wire time alone.
    ``ratio`` is encoded / raw bytes.
    """

    codec: Codec | None
    ratio: float
    encode_seconds: float
    wire_seconds: float
    decode_seconds: float | None
    eligible: bool
    """False when the codec saves less than ``min_saving`` of the bytes."""

    @property
    def codec_seconds(self) -> float:
        """Encode + decode seconds: the measured part of the total (infinite if unmeasured)."""
        if self.decode_seconds is None:
            return math.inf
        return self.encode_seconds + self.decode_seconds

    @property
    def total_seconds(self) -> float:
        """Encode + wire + decode seconds; infinite if not eligible or not fully measured."""
        if not self.eligible or self.decode_seconds is None:
            return math.inf
        return self.encode_seconds + self.wire_seconds + self.decode_seconds


_WARMUP = threading.Lock()
_warmed: list[threading.Thread] = []  # the one warm-up thread of this process, once started


def _import_codec_libraries() -> None:
    from tensorwire.codecs.blosc2 import _blosc2

    _blosc2()


def warm_up_codec_libraries() -> threading.Thread:
    """Import the candidates' libraries (blosc2 takes about 0.3 s) in a background thread,
    once per process, so that the first message an ``auto`` endpoint sends does not pay for
    them (``import tensorwire`` stays light). Returns that thread."""
    with _WARMUP:
        if not _warmed:
            thread = threading.Thread(
                target=_import_codec_libraries, name="tensorwire-codec-warm-up", daemon=True
            )
            thread.start()
            _warmed.append(thread)
        return _warmed[0]


class AutoCodec:
    """A codec selector that sends each tensor raw or with the codec that is fastest overall.

    ``bandwidth`` is the link's throughput in bytes per second; tensors under ``min_size``
    bytes go raw, and so does any tensor no candidate shrinks by at least ``min_saving``
    (a fraction). ``candidates`` (default: lz4, blosc2 lz4 with byte and bit shuffle,
    floatplanes for 2-, 4- and 8-byte elements on links under 200 MB/s, zstd level 1) are
    tried cheapest first, each set up for the tensor's itemsize (:meth:`Codec.for_itemsize`).
    Use it wherever a ``CodecSelector`` is expected: ``auto(name, array)``.

    Each stream (name, dtype, shape and an optional ``context`` such as the peer) is
    sampled on its first message and keeps its choice: re-weighed on the same sample when
    the bandwidth moves by more than 5 %, sampled again after ``recheck_every`` messages
    once the stream has carried ``recheck_bytes`` since, or when :meth:`observe` hears
    that the chosen codec drifted from its sampled ratio. What :meth:`observe` hears of the
    encodes' wall seconds sets :meth:`codec_slowdown`, by which each codec's sampled
    seconds are multiplied; choices are re-weighed when one moves by more than 5 %. An earlier
    option (raw, then the candidates in order) wins unless a later one is faster by more
    than ``tie_margin`` of the two's measured codec seconds, so the same input and bandwidth
    give the same choice run to run. ``max_streams`` bounds the streams remembered.
    """

    def __init__(
        self,
        bandwidth: float | None = None,
        candidates: Sequence[Codec] | None = None,
        min_size: int = 64 << 10,
        min_saving: float = 0.10,
        *,
        recheck_every: int = RECHECK_EVERY,
        recheck_bytes: int = RECHECK_BYTES,
        max_streams: int = MAX_STREAMS,
        tie_margin: float = TIE_MARGIN,
    ) -> None:
        warm_up_codec_libraries()
        self.bandwidth = ASSUMED_BANDWIDTH if bandwidth is None else bandwidth
        # None: a guess until the first measurement, which then replaces it (not blended)
        self._guessed = bandwidth is None
        if isinstance(min_size, bool) or not isinstance(min_size, int) or min_size < 0:
            raise CodecConfigError(f"min_size must be an int >= 0 (bytes), got {min_size!r}")
        if not 0.0 <= min_saving < 1.0:
            raise CodecConfigError(f"min_saving must be in [0, 1), got {min_saving!r}")
        if not 0.0 <= tie_margin < 1.0:
            raise CodecConfigError(f"tie_margin must be in [0, 1), got {tie_margin!r}")
        if candidates is not None and not all(isinstance(c, Codec) for c in candidates):
            raise CodecConfigError("candidates must be tensorwire.codecs.Codec instances")
        self.min_size = min_size
        self.min_saving = min_saving
        self.tie_margin = tie_margin
        self.recheck = Recheck(recheck_every, recheck_bytes)
        self._candidates = None if candidates is None else list(candidates)
        self._by_itemsize: dict[int, list[Codec]] = {}
        self._lock = threading.Lock()
        self._streams = StreamChoices(max_streams)
        self._slowdown = CodecSlowdown()
        self.samples = 0
        """How many times a tensor was sampled (every stream's first message and rechecks)."""

    @property
    def bandwidth(self) -> float:
        """The link's throughput in bytes per second that choices are made for."""
        return self._bandwidth

    @bandwidth.setter
    def bandwidth(self, bytes_per_second: float) -> None:
        self._bandwidth = _check_bandwidth(bytes_per_second)
        self._guessed = False

    @property
    def bandwidth_measured(self) -> bool:
        """Whether ``bandwidth`` was given or measured, not the guess made without either."""
        return not self._guessed

    def codec_slowdown(self, codec_id: str | None = None) -> float:
        """How many times their samples' CPU seconds the encodes with ``codec_id`` (None: any
        codec) heard by :meth:`observe` took in wall seconds: what contention for the cores
        and the codec's overheads add. A codec not heard yet gets the factor of all heard;
        before any, the CPU contention the load average tells
        (:func:`tensorwire.codecs.slowdown.cpu_contention`)."""
        return self._slowdown.factor(codec_id)

    def update_bandwidth(self, bytes_per_second: float, weight: float = 0.5) -> None:
        """Blend a measured throughput (bytes/s) into ``bandwidth`` with ``weight`` in (0, 1];
        the first measurement replaces the guess made when no ``bandwidth`` was given."""
        measured = _check_bandwidth(bytes_per_second)
        if not 0.0 < weight <= 1.0:
            raise CodecConfigError(f"weight must be in (0, 1], got {weight!r}")
        if self._guessed:
            weight, self._guessed = 1.0, False
        self._bandwidth = (1.0 - weight) * self._bandwidth + weight * measured

    def candidates_for(self, itemsize: int) -> list[Codec]:
        """Return the candidates tried for tensors of ``itemsize``-byte elements, in order."""
        with self._lock:
            found = self._by_itemsize.get(itemsize)
            if found is None:
                base = self._candidates
                if base is None:
                    base = _default_candidates(itemsize)
                found = [c.for_itemsize(itemsize) for c in base]
                scratch = np.empty(_WARM_UP.nbytes, dtype=np.uint8).data
                for codec in found:  # a codec's first run sets up its contexts: not timed
                    Trial(codec, _WARM_UP, itemsize).decode_seconds(scratch)
                self._by_itemsize[itemsize] = found
            return list(found)

    def select(self, name: str, array: np.ndarray, context: Hashable = None) -> list[Codec]:
        """Return the codec chain for ``array``: ``[]`` (raw) or ``[fastest codec]``.

        ``context`` (any hashable, e.g. a peer id) keeps separate choices for the same
        tensor sent to different places.
        """
        nbytes = array.nbytes
        if nbytes < self.min_size:
            return []
        key = stream_key(name, array, context)
        choice = self._streams.get(key)
        if choice is None or choice.due(self.recheck) or not self._current(choice):
            choice = self._sample(key, array)
        choice.count(nbytes)
        return list(choice.chain)

    __call__ = select

    def observe(
        self,
        name: str,
        array: np.ndarray,
        chain: Sequence[Codec],
        encoded_nbytes: int,
        context: Hashable = None,
        *,
        seconds: float | None = None,
    ) -> None:
        """Hear what the chain chosen for ``array`` achieved (the wire encoder calls this):
        a ratio that drifted from the sample's makes the stream sampled again next time;
        ``seconds``, the encode's wall time, against what the sample promised, sets
        :meth:`codec_slowdown`."""
        choice = self._streams.get(stream_key(name, array, context))
        if choice is None or not choice.chain or not chain or chain[0] is not choice.chain[0]:
            return
        choice.achieved(encoded_nbytes / max(array.nbytes, 1), self.recheck)
        sampled: _Sampled = choice.state
        if seconds is not None and len(chain) == 1 and sampled.nbytes == array.nbytes:
            for e, factor in zip(sampled.estimates, sampled.factors, strict=True):
                if e.codec is chain[0]:
                    cpu_seconds = e.encode_seconds / factor
                    self._slowdown.heard(chain[0].codec_id, seconds, cpu_seconds)
                    break

    def for_context(self, context: Hashable) -> ContextSelector:
        """This selector with ``context`` bound: ``(name, array)`` in, as the wire wants."""
        return ContextSelector(self, context)

    def forget(self) -> None:
        """Drop every stream's choice: the next message of each is sampled again."""
        self._streams.clear()

    def _sample(self, key: StreamKey, array: np.ndarray) -> StreamChoice:
        self.samples += 1
        bandwidth = self._bandwidth
        sampled = _Sampled(*self._estimate(array, bandwidth), array.nbytes, bandwidth)
        best = self._pick(sampled.estimates)
        choice = StreamChoice([] if best.codec is None else [best.codec], best.ratio, sampled)
        self._streams.put(key, choice)
        return choice

    def _current(self, choice: StreamChoice) -> bool:
        """Whether ``choice`` is for the current bandwidth and codec slowdown, once re-weighed
        on its sample if either changed; False if a candidate whose decoding was not timed
        could now win (then the stream is sampled again)."""
        sampled: _Sampled = choice.state
        bandwidth = self._bandwidth
        factors = tuple(self._factor(e.codec) for e in sampled.estimates)
        if _near(bandwidth, sampled.bandwidth) and all(
            _near(f, g) for f, g in zip(factors, sampled.factors, strict=True)
        ):
            return True
        estimates = [
            _reweighed(e, bandwidth / sampled.bandwidth, f / g)
            for e, f, g in zip(sampled.estimates, factors, sampled.factors, strict=True)
        ]
        best = min(e.total_seconds for e in estimates)
        if any(
            e.eligible and e.decode_seconds is None and e.encode_seconds + e.wire_seconds < best
            for e in estimates
        ):
            return False
        pick = self._pick(estimates)
        choice.chain = [] if pick.codec is None else [pick.codec]
        choice.ratio = pick.ratio
        choice.state = _Sampled(estimates, factors, sampled.nbytes, bandwidth)
        return True

    def _pick(self, estimates: list[CodecEstimate]) -> CodecEstimate:
        """The first estimate (raw first) no slower than the fastest by more than
        ``tie_margin`` of the two's codec seconds (the part timing noise moves)."""
        best = min(estimates, key=lambda e: e.total_seconds)
        return next(
            e
            for e in estimates
            if e.total_seconds < math.inf
            and e.total_seconds
            <= best.total_seconds + self.tie_margin * (e.codec_seconds + best.codec_seconds)
        )

    def estimate(self, array: np.ndarray) -> list[CodecEstimate]:
        """Estimate raw (first) and every candidate for ``array`` from one sample of it."""
        return self._estimate(array, self._bandwidth)[0]

    def _factor(self, codec: Codec | None) -> float:
        """The slowdown ``codec``'s sampled seconds are multiplied by now (raw: 1.0)."""
        return 1.0 if codec is None else self._slowdown.factor(codec.codec_id)

    def _estimate(
        self, array: np.ndarray, bandwidth: float
    ) -> tuple[list[CodecEstimate], tuple[float, ...]]:
        """The estimates, and the slowdown each one's seconds were multiplied by."""
        nbytes = array.nbytes
        raw = CodecEstimate(None, 1.0, 0.0, nbytes / bandwidth, 0.0, eligible=True)
        estimates, factors = [raw], [1.0]
        if nbytes == 0:
            return estimates, tuple(factors)
        sample = sample_bytes(array).data
        scratch = np.empty(sample.nbytes, dtype=np.uint8).data
        # Seconds on the sample scale to the tensor, spread over the threads it will use.
        # The sample is big enough (64 KiB) for a codec's fixed cost per call to be a
        # small part of its time: scaling that part too errs a little towards raw; what the
        # real encodes take (contention for the cores, overheads) makes up for it.
        threads = max(1, min(get_threads(), nbytes // _PARALLEL_BLOCK))
        best = wire = raw.total_seconds
        for codec in self.candidates_for(array.itemsize):
            factor = self._factor(codec)
            factors.append(factor)
            if isinstance(codec, FloatPlanes) and bandwidth > FLOATPLANES_MAX_BANDWIDTH:
                estimates.append(CodecEstimate(codec, 1.0, math.inf, wire, None, eligible=False))
                continue
            scale = nbytes / sample.nbytes / threads * factor
            trial = Trial(codec, sample, array.itemsize)
            ratio = trial.encoded_nbytes / sample.nbytes
            eligible = 1.0 - ratio >= self.min_saving
            wire_seconds = ratio * nbytes / bandwidth
            # Its seconds count unless its first run already loses on encode and wire time
            # alone (a slow codec on a fast link): time it again then, keep the fastest.
            if eligible and trial.encode_seconds * scale + wire_seconds < best:
                trial.time_more(_TIMED_RUNS - 1)
            encode_seconds = trial.encode_seconds * scale
            decode_seconds = None
            if eligible and encode_seconds + wire_seconds < best:
                decode_seconds = trial.decode_seconds(scratch, _TIMED_RUNS) * scale
            estimate = CodecEstimate(
                codec, ratio, encode_seconds, wire_seconds, decode_seconds, eligible
            )
            best = min(best, estimate.total_seconds)
            estimates.append(estimate)
        return estimates, tuple(factors)

    def __repr__(self) -> str:
        return (
            f"AutoCodec(bandwidth={self._bandwidth:.4g}, min_size={self.min_size}, "
            f"min_saving={self.min_saving}, candidates={self._candidates!r})"
        )


@dataclass(frozen=True)
class _Sampled:
    """A stream's sample, as estimates at ``bandwidth`` for a tensor of ``nbytes``, each
    estimate's codec seconds multiplied by its codec's slowdown in ``factors``."""

    estimates: list[CodecEstimate]
    factors: tuple[float, ...]
    nbytes: int
    bandwidth: float


def _reweighed(e: CodecEstimate, faster_link: float, slower_codec: float) -> CodecEstimate:
    """``e`` on a link ``faster_link`` times as fast, its codec ``slower_codec`` times as
    slow."""
    return replace(
        e,
        encode_seconds=e.encode_seconds * slower_codec,
        wire_seconds=e.wire_seconds / faster_link,
        decode_seconds=None if e.decode_seconds is None else e.decode_seconds * slower_codec,
    )


def _near(now: float, then: float) -> bool:
    """Whether ``now`` is within :data:`REWEIGH` of ``then`` (no need to re-weigh)."""
    return now == then or abs(now - then) <= REWEIGH * then


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
    # Floats' (and their XOR deltas') exponent planes, entropy coded: the best ratio on weights.
    # floatplanes-zl where openzl is here: faster (a peer without it gets floatplanes).
    planes: list[Codec] = []
    if itemsize in (2, 4, 8):
        planes = [FloatPlanesZl() if zl_available() else FloatPlanes()]
    return [LZ4(), *shuffled, Blosc2(cname="lz4", filter="bitshuffle"), *planes, Zstd(level=1)]
