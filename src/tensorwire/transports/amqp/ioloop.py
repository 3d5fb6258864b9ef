"""The one I/O thread of a process's AMQP devices: pika's select ioloop drives every device's
connection (issue #27: a thread per device was 100 threads per process handing the interpreter
lock around, two thirds of the clients' CPU in the kernel's futex waits). Each device keeps its
own connection (:mod:`.link`); only the thread and its poller are shared."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from typing import Any

from pika.adapters.select_connection import IOLoop

from tensorwire.errors import PeerGone, TransportTimeout
from tensorwire.transports.base import remaining

log = logging.getLogger("tensorwire.transports.amqp")

_RESTARTS = 1000  # a loop that keeps failing past this many errors ends (each is logged)


class Waiter:
    """What another thread waits for from the I/O thread: a value or an exception."""

    __slots__ = ("cancelled", "done", "error", "result", "started")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.result: Any = None
        self.error: BaseException | None = None
        self.started = False
        self.cancelled = False  # its caller gave up before it started: skipped

    def set(self, result: Any = None) -> None:
        if not self.done.is_set():
            self.result = result
            self.done.set()

    def fail(self, error: BaseException) -> None:
        if not self.done.is_set():
            self.error = error
            self.done.set()

    def wait(self, deadline: float | None, what: str) -> Any:
        """The value, or its exception; ``TransportTimeout`` if it has not started by
        ``deadline`` (once started it ends by itself: a confirm, or a lost connection)."""
        if not self.done.wait(remaining(deadline)):
            self.cancelled = True
            if not self.started:
                raise TransportTimeout(what)
            self.done.wait()
        if self.error is not None:
            raise self.error
        return self.result


class IoThread(threading.Thread):
    """Runs pika's ioloop for every AMQP device of this process (:func:`shared`)."""

    def __init__(self) -> None:
        super().__init__(name="tensorwire-amqp-io", daemon=True)
        self.ioloop = IOLoop()
        self.pid = os.getpid()

    def run(self) -> None:
        for _ in range(_RESTARTS):
            try:
                self.ioloop.start()
                return
            except Exception:  # a bug in one device's callback must not stop the others
                log.exception("amqp: the I/O thread's loop failed; going on")

    def call(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` on the I/O thread (soon, in the order given), from any thread."""
        if threading.current_thread() is self:
            fn()
        else:
            self.ioloop.add_callback_threadsafe(guarded(fn))

    def later(self, delay: float, fn: Callable[[], None]) -> Any:
        """Run ``fn`` on the I/O thread after ``delay`` seconds (call on the I/O thread)."""
        return self.ioloop.call_later(max(delay, 0.0), guarded(fn))

    def cancel(self, handle: Any) -> None:
        if handle is not None:
            self.ioloop.remove_timeout(handle)

    def run_sync(self, fn: Callable[[Waiter], None], deadline: float | None, what: str) -> Any:
        """``fn(waiter)`` started on the I/O thread; wait for what it sets on ``waiter``."""
        waiter = Waiter()

        def start() -> None:
            if waiter.cancelled:
                return
            waiter.started = True
            try:
                fn(waiter)
            except BaseException as exc:  # the caller's to see
                waiter.fail(exc)

        if not self.is_alive():
            raise PeerGone("the AMQP I/O thread has ended")
        self.call(start)
        return waiter.wait(deadline, what)


def guarded(fn: Callable[..., None]) -> Callable[..., None]:
    """``fn`` whose exceptions are logged, not raised into the loop shared by every device."""

    def run(*args: Any) -> None:
        try:
            fn(*args)
        except Exception:
            log.exception("amqp: a callback on the I/O thread failed")

    return run


_lock = threading.Lock()
_thread: IoThread | None = None


def shared() -> IoThread:
    """This process's I/O thread, started on first use (again in a forked child)."""
    global _thread
    with _lock:
        if _thread is None or _thread.pid != os.getpid() or not _thread.is_alive():
            _thread = IoThread()
            _thread.start()
        return _thread
