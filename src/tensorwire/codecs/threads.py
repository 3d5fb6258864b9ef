"""The thread pool that compresses and decompresses blocks in parallel.

One pool is shared by every codec in the process and created on first use. The codec
libraries release the GIL while they work, so the pool's threads run on separate cores.
"""

from __future__ import annotations

import itertools
import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import TypeVar

from tensorwire.errors import CodecConfigError

_THREAD_NAME_PREFIX = "tensorwire-codec"

T = TypeVar("T")

_lock = threading.Lock()
_executor: ThreadPoolExecutor | None = None


def _default_threads() -> int:
    # The CPUs this process may run on (cgroup/affinity aware), not the machine's count.
    try:
        return len(os.sched_getaffinity(0)) or 1
    except AttributeError:
        return os.cpu_count() or 1


_threads = _default_threads()


def get_threads() -> int:
    """Return how many threads codecs use for one buffer (default: the usable CPUs)."""
    return _threads


def set_threads(n: int) -> None:
    """Use ``n`` threads (>= 1) for codec work from now on; 1 runs everything inline."""
    global _threads, _executor
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise CodecConfigError(f"threads must be an int >= 1, got {n!r}")
    with _lock:
        old, _executor, _threads = _executor, None, n
    if old is not None:
        # Work already submitted finishes; its callers are waiting for it.
        old.shutdown(wait=False)


def _get_executor() -> ThreadPoolExecutor:
    global _executor
    with _lock:
        if _executor is None:
            _executor = ThreadPoolExecutor(_threads, thread_name_prefix=_THREAD_NAME_PREFIX)
        return _executor


def _in_pool_thread() -> bool:
    return threading.current_thread().name.startswith(_THREAD_NAME_PREFIX)


def split_runs(n: int) -> list[tuple[int, int]]:
    """Cut ``range(n)`` into contiguous ``(start, stop)`` runs, a few per thread.

    A few runs per thread balance uneven blocks without paying for one task per block.
    """
    nruns = min(n, 4 * _threads) if _threads > 1 and not _in_pool_thread() else min(n, 1)
    bounds = [n * i // nruns for i in range(nruns + 1)] if nruns else [0]
    return list(itertools.pairwise(bounds))


def run_all(fn: Callable[[int, int], T], runs: Sequence[tuple[int, int]]) -> list[T]:
    """Return ``[fn(start, stop) for start, stop in runs]``, computed in the pool.

    Every run has finished when this returns or raises, so no thread still writes into
    a caller's buffer afterwards; the first error, in run order, is raised. One run (or
    a call from one of the pool's own threads) is computed inline.
    """
    if len(runs) <= 1 or _in_pool_thread():
        return [fn(start, stop) for start, stop in runs]
    executor = _get_executor()
    futures: list[Future[T]] = [executor.submit(fn, start, stop) for start, stop in runs]
    wait(futures)
    return [future.result() for future in futures]
