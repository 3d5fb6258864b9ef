"""The process's UCX workers, and waiting for a UCX request with a deadline.

One UCX context and worker per set of :class:`UcxSettings`, shared by every hub and channel of
the process that uses those settings, each progressed by its own ucxx thread (blocking mode:
it sleeps in ``epoll`` while nothing happens). Made on first use, stopped at exit.
"""

from __future__ import annotations

import atexit
import threading
import time
from typing import Any

from tensorwire.errors import MissingDependency, PeerGone, TransportTimeout
from tensorwire.transports.ucx.settings import UcxSettings

SPINS = 200
"""Looks at a request before the waiting thread starts to sleep between looks."""
NAP_S = (2e-5, 2e-4, 1e-3)
"""Sleeps between looks as a wait grows longer (after 1x, 10x and 50x SPINS looks): a fast
transfer is seen within tens of microseconds, an idle connection costs ~1,000 looks a second."""

_lock = threading.Lock()
_workers: dict[UcxSettings, Any] = {}
_contexts: list[Any] = []


def ucx_api() -> Any:
    """``ucxx._lib.libucxx``, or :class:`MissingDependency` naming the extra."""
    try:
        import ucxx._lib.libucxx as api
    except ImportError as exc:
        raise MissingDependency(
            f"ucx:// needs ucxx ({exc}): pip install 'tensorwire[ucx]'"
        ) from exc
    return api


def array(buf: Any) -> Any:
    """A buffer as ucxx takes it (no copy)."""
    from ucxx._lib.arr import Array

    return Array(buf)


def worker_for(settings: UcxSettings) -> Any:
    """The worker of ``settings``, made (with its progress thread) on first use."""
    with _lock:
        worker = _workers.get(settings)
        if worker is None:
            api = ucx_api()
            context = api.UCXContext(
                settings.config(),
                feature_flags=(api.Feature.STREAM, api.Feature.WAKEUP),
            )
            worker = api.UCXWorker(context)
            worker.start_progress_thread(polling_mode=False)
            if not _workers:
                atexit.register(_stop_all)
            _contexts.append(context)
            _workers[settings] = worker
        return worker


def _stop_all() -> None:
    with _lock:
        for worker in _workers.values():
            worker.stop_progress_thread()
        _workers.clear()


def wait(request: Any, deadline: float | None, what: str) -> None:
    """Wait until ``request`` completes (``TransportTimeout`` at ``deadline``, the request
    left pending); :class:`PeerGone` if it failed (the connection is lost or closed)."""
    looks = 0
    while not request.completed:
        looks += 1
        if looks < SPINS:
            continue
        if deadline is not None and time.monotonic() >= deadline:
            raise TransportTimeout(f"{what} timed out")
        time.sleep(NAP_S[0] if looks < 10 * SPINS else NAP_S[1] if looks < 50 * SPINS else NAP_S[2])
    try:
        request.check_error()
    except Exception as exc:  # ucxx raises its own UCXError kinds: all mean the connection
        raise PeerGone(f"UCX {what} failed: {type(exc).__name__}: {exc}") from None
