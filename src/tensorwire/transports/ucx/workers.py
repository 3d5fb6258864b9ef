"""UCX workers, and waiting for a UCX request with a deadline.

One UCX context per set of :class:`UcxSettings` in a process, made on first use; a worker per
hub and per channel, progressed by its own ucxx thread (blocking mode: it sleeps in
``epoll`` while nothing happens); workers still running at exit are stopped then.
"""

from __future__ import annotations

import atexit
import threading
import time
from importlib.util import find_spec
from typing import Any

from tensorwire.errors import MissingDependency, PeerGone, TransportTimeout
from tensorwire.transports.ucx.settings import UcxSettings

if find_spec("ucxx") is None:  # told when the scheme loads; ucxx itself is imported on first use
    raise ModuleNotFoundError("No module named 'ucxx'", name="ucxx")

SPINS = 200
"""Looks at a request before the waiting thread starts to sleep between looks."""
NAP_S = (2e-5, 2e-4, 1e-3)
"""Sleeps between looks as a wait grows longer (after 1x, 10x and 50x SPINS looks): a fast
transfer is seen within tens of microseconds, an idle connection costs ~1,000 looks a second."""

_lock = threading.Lock()
_contexts: dict[UcxSettings, Any] = {}
_running: set[Any] = set()  # workers whose progress thread runs


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


def start_worker(settings: UcxSettings) -> Any:
    """A new UCX worker with its progress thread, on the process's context for ``settings``
    (made on first use: the costly part). A hub or channel has its own (on one worker, one
    side's close never reached the other); :func:`stop_worker` ends it."""
    with _lock:
        api = ucx_api()
        context = _contexts.get(settings)
        if context is None:
            context = api.UCXContext(
                settings.config(), feature_flags=(api.Feature.STREAM, api.Feature.WAKEUP)
            )
            if not _contexts:
                atexit.register(_stop_all)
            _contexts[settings] = context
        worker = api.UCXWorker(context)
        worker.start_progress_thread(polling_mode=False)
        _running.add(worker)
        return worker


def stop_worker(worker: Any) -> None:
    """Stop ``worker``'s progress thread (once its endpoints are closed)."""
    with _lock:
        if worker not in _running:
            return
        _running.discard(worker)
    worker.stop_progress_thread()


def _stop_all() -> None:
    for worker in list(_running):
        stop_worker(worker)


def wait(request: Any, deadline: float | None, what: str, endpoint: Any = None) -> None:
    """Wait until ``request`` completes (``TransportTimeout`` at ``deadline``, the request
    left pending); :class:`PeerGone` if it failed (the connection is lost or closed), or if
    ``endpoint`` is found failed while it waits (a peer's close does not always fail the
    requests pending on it)."""
    looks = 0
    while not request.completed:
        looks += 1
        if looks < SPINS:
            continue
        if deadline is not None and time.monotonic() >= deadline:
            raise TransportTimeout(f"{what} timed out")
        if endpoint is not None and looks % SPINS == 0 and not endpoint.alive:
            raise PeerGone(f"UCX {what}: the connection was closed")
        time.sleep(NAP_S[0] if looks < 10 * SPINS else NAP_S[1] if looks < 50 * SPINS else NAP_S[2])
    try:
        request.check_error()
    except Exception as exc:  # ucxx raises its own UCXError kinds: all mean the connection
        raise PeerGone(f"UCX {what} failed: {type(exc).__name__}: {exc}") from None
