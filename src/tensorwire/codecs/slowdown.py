"""How much slower codecs really run in this process than their samples' CPU time says.

A sample is timed in CPU seconds, the fastest of a few runs on one block: what the codec
costs on a core of its own, without its per-call and per-thread overheads. On shared cores
(devices and a server on two CPUs, other jobs beside them) an encode waits for a core, and a
multithreaded codec's threads do not all get one: its wall time, the time a transfer really
pays, is several times that. :class:`CodecSlowdown` learns the factor, per codec, from the
wall time of the encodes that really happen, against what their samples promised; before
any, it takes the machine's load (:func:`cpu_contention`).
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Callable

DECAY = 0.9
"""Weight each earlier encode keeps when the next one is heard: about the last ten count."""
MIN_FACTOR = 0.25
MAX_FACTOR = 100.0
"""Bounds of a factor: a few odd encodes (a page fault storm, a long preemption) must not
rule out every codec or make them free."""
LOAD_TTL = 1.0
"""Seconds a read of the load average is reused."""


def cpu_contention() -> float:
    """How many runnable threads share each CPU this process may use (the 1-minute load
    average over those CPUs), at least 1: a CPU-bound thread runs about that many times
    slower than on a core of its own. 1.0 where the system does not tell."""
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):
        return 1.0
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:
        cpus = os.cpu_count() or 1
    return min(max(load / max(cpus, 1), 1.0), MAX_FACTOR)


class _Tally:
    """Decayed sums of wall and promised seconds."""

    __slots__ = ("promised", "wall")

    def __init__(self) -> None:
        self.wall = 0.0
        self.promised = 0.0

    def add(self, wall: float, promised: float, decay: float) -> None:
        self.wall = decay * self.wall + wall
        self.promised = decay * self.promised + promised


class CodecSlowdown:
    """Wall seconds of real encodes over the CPU seconds their samples promised, per codec
    id, decayed so that it follows the machine's load. A codec not heard yet gets the factor
    of every codec heard so far, and before any is heard, ``prior()`` (default: the CPU
    contention the load average tells, read at most once a second)."""

    def __init__(self, decay: float = DECAY, prior: Callable[[], float] | None = None) -> None:
        self.decay = decay
        self.prior = cpu_contention if prior is None else prior
        self._all = _Tally()
        self._by_codec: dict[str, _Tally] = {}
        self._lock = threading.Lock()
        self._prior = (-math.inf, 1.0)  # (monotonic time read, value)

    def heard(self, codec_id: str, wall_seconds: float, promised_seconds: float) -> None:
        """Note an encode with ``codec_id`` that took ``wall_seconds`` where its sample
        promised ``promised_seconds`` (both for the whole tensor)."""
        if not (0.0 <= wall_seconds < math.inf and 0.0 < promised_seconds < math.inf):
            return  # NaN too
        with self._lock:
            self._all.add(wall_seconds, promised_seconds, self.decay)
            tally = self._by_codec.get(codec_id)
            if tally is None:
                tally = self._by_codec[codec_id] = _Tally()
            tally.add(wall_seconds, promised_seconds, self.decay)

    def factor(self, codec_id: str | None = None) -> float:
        """Wall seconds ``codec_id`` (None: any codec) takes here per CPU second its sample
        took, within bounds."""
        tally = self._by_codec.get(codec_id, self._all) if codec_id is not None else self._all
        if tally.promised <= 0.0:
            return self._prior_now()
        return min(max(tally.wall / tally.promised, MIN_FACTOR), MAX_FACTOR)

    def _prior_now(self) -> float:
        read_at, value = self._prior
        now = time.monotonic()
        if now - read_at >= LOAD_TTL:
            value = min(max(self.prior(), MIN_FACTOR), MAX_FACTOR)
            self._prior = (now, value)
        return value
