"""CPU time of a whole process (every thread, user + system), this one or another, to
nanoseconds: what a benchmark's side spent, whatever the wall clock says."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import time
from collections.abc import Callable


@functools.cache
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)


def cpu_clock(pid: int | None = None) -> Callable[[], float]:
    """A function giving the CPU seconds process ``pid`` (None: this one) has used so far.

    Another process's is read from its POSIX CPU-time clock (``clock_getcpuclockid``), which
    counts its exited threads too; the process must be alive when the function is called.
    """
    if pid is None or pid == os.getpid():
        return time.process_time
    clock = ctypes.c_int()  # clockid_t
    err = _libc().clock_getcpuclockid(pid, ctypes.byref(clock))
    if err:
        raise OSError(err, f"no CPU-time clock for process {pid}: {os.strerror(err)}")
    return functools.partial(time.clock_gettime, clock.value)
