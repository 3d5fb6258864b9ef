"""How much of a send's wall time was the link's: the rest, its thread ran on a CPU or
waited for one.

On a fast link over shared cores the CPU is the bottleneck. A send that took long because
its thread copied, hashed or waited for a core says nothing of the link, and must not make
``auto`` take the link for slow: compressing would then cost more CPU and slow the next
sends further (the measured rate drops, compression looks better still).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import NamedTuple

_SCHEDSTAT = "/proc/thread-self/schedstat"  # ns on a CPU, ns runnable waiting for one, slices


class _Schedstat:
    """The calling thread's schedstat file, opened once: its path names the thread that
    opens it, so each thread keeps its own (closed when the thread's locals go)."""

    def __init__(self) -> None:
        self.fd = os.open(_SCHEDSTAT, os.O_RDONLY)

    def waiting(self) -> float:
        """Seconds this thread has been runnable but waiting for a CPU."""
        return int(os.pread(self.fd, 128, 0).split()[1]) * 1e-9

    def __del__(self) -> None:
        os.close(self.fd)


_threads = threading.local()


def busy_seconds() -> float:
    """Seconds the calling thread has run on a CPU (:func:`time.thread_time`) plus, where the
    kernel tells (Linux's schedstat), those it was runnable but waiting for a CPU."""
    if not hasattr(_threads, "schedstat"):
        try:
            _threads.schedstat = _Schedstat()
        except OSError:
            _threads.schedstat = None  # this kernel does not tell: CPU time alone
    stat: _Schedstat | None = _threads.schedstat
    try:
        waiting = 0.0 if stat is None else stat.waiting()
    except (OSError, ValueError, IndexError):
        waiting = 0.0
    return time.thread_time() + waiting


class SendTime(NamedTuple):
    """One send's wall seconds and its link seconds (None: not measured)."""

    wall_s: float
    link_s: float | None


def timed_send(send: Callable[[], object], measure: bool) -> SendTime:
    """Run ``send``; return its wall seconds and, if ``measure``, the part of them its thread
    was blocked (neither on a CPU nor waiting for one): the link's, or the peer's, time."""
    if not measure:
        t = time.perf_counter()
        send()
        return SendTime(time.perf_counter() - t, None)
    busy = busy_seconds()
    t = time.perf_counter()
    send()
    wall = time.perf_counter() - t
    return SendTime(wall, max(wall - (busy_seconds() - busy), 0.0))
