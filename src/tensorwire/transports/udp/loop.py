"""The I/O thread of a udp:// endpoint: waits on its sockets, runs their handlers and timers."""

from __future__ import annotations

import contextlib
import functools
import logging
import selectors
import socket
import threading
import time
from collections import deque
from collections.abc import Callable

from tensorwire.transports.base import _log_limited
from tensorwire.transports.sockets import drain, wake, waker

log = logging.getLogger("tensorwire.transports.udp")

Handler = Callable[[], None]
FAILURE_PAUSE = 0.05  # seconds the loop rests after its own machinery failed (never spins)


class IoLoop:
    """One thread: a selector over sockets, each with a handler called when it is readable
    (and, while one is set, another when it is writable), and ``tick(now)``
    (``time.perf_counter()`` seconds) for timers, which returns the seconds until it next
    needs to run (None: only when a socket wakes the loop).

    A handler or timer that raises is logged (at most once per 10 s per loop) and the loop
    goes on: one peer's bad input never stops the others' I/O.
    """

    def __init__(self, name: str, tick: Callable[[float], float | None]) -> None:
        self.name = name
        self._tick = tick
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = waker()
        on_wake = functools.partial(drain, self._wake_r)
        self._selector.register(self._wake_r, selectors.EVENT_READ, [on_wake, None])
        self._calls: deque[Handler] = deque()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    @property
    def in_loop(self) -> bool:
        return threading.current_thread() is self._thread

    def call(self, fn: Handler) -> None:
        """Run ``fn`` in the loop's thread, soon."""
        self._calls.append(fn)
        wake(self._wake_w)

    def _here(self, fn: Handler) -> None:
        """Run ``fn`` now if this is the loop's thread (or it has not started), else soon;
        once stopped, not at all (its selector is gone)."""
        if self.in_loop or not self._thread.is_alive():
            if not self._stopping:
                fn()
        else:
            self.call(fn)

    def add(self, sock: socket.socket, on_read: Handler) -> None:
        """Call ``on_read`` whenever ``sock`` is readable (until :meth:`remove`)."""

        def register() -> None:
            self._selector.register(sock, selectors.EVENT_READ, [on_read, None])

        self._here(register)

    def set_reader(self, sock: socket.socket, on_read: Handler) -> None:
        """Call ``on_read`` from now on when ``sock`` (already added) is readable, keeping
        what waits to be written; call from the loop's thread."""
        self._selector.get_key(sock).data[0] = on_read

    def remove(self, sock: socket.socket) -> None:
        """Stop watching ``sock``; call from the loop's thread (or before it starts)."""
        with contextlib.suppress(KeyError, ValueError):  # not registered, or closed already
            self._selector.unregister(sock)

    def want_write(self, sock: socket.socket, on_write: Handler | None) -> None:
        """Call ``on_write`` whenever ``sock`` (already added) is writable; None stops it."""
        self._here(lambda: self._set_write(sock, on_write))

    def _set_write(self, sock: socket.socket, on_write: Handler | None) -> None:
        try:
            key = self._selector.get_key(sock)
        except (KeyError, ValueError):
            return  # removed or closed meanwhile: nothing left to write to
        handlers = key.data
        handlers[1] = on_write
        events = selectors.EVENT_READ | (selectors.EVENT_WRITE if on_write else 0)
        if key.events != events:
            self._selector.modify(sock, events, handlers)

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the thread (after the handler running now); it frees the selector as it ends."""
        self._stopping = True
        self.call(lambda: None)
        if self._thread.is_alive() and not self.in_loop:
            self._thread.join(timeout)
            if self._thread.is_alive():
                log.warning("udp: %s did not stop within %s s", self.name, timeout)
        elif not self._thread.is_alive():
            self._release()

    def _release(self) -> None:
        self._selector.close()
        self._wake_r.close()
        self._wake_w.close()

    def _run(self) -> None:
        try:
            while not self._stopping:
                try:
                    self._turn()
                except Exception as exc:  # the selector or the timers: rest, then go on
                    self._failed("the loop", exc)
                    time.sleep(FAILURE_PAUSE)
        finally:
            self._release()

    def _turn(self) -> None:
        while self._calls:
            self._guarded(self._calls.popleft(), "a call")
        try:
            timeout = self._tick(time.perf_counter())
        except Exception as exc:
            self._failed("a timer", exc)
            timeout = FAILURE_PAUSE
        for key, events in self._selector.select(timeout):
            if self._stopping:
                return
            on_read, on_write = key.data
            if events & selectors.EVENT_WRITE and on_write is not None:
                self._guarded(on_write, "a write handler")
            if events & selectors.EVENT_READ:
                self._guarded(on_read, "a read handler")

    def _guarded(self, fn: Handler, what: str) -> None:
        try:
            fn()
        except Exception as exc:  # a bug in one handler must not stop every peer's I/O
            self._failed(what, exc)

    def _failed(self, what: str, exc: Exception) -> None:
        _log_limited(f"{self.name} {what}", f"udp: {self.name}: {what} failed: {exc!r}")
        log.debug("udp: %s: %s failed", self.name, what, exc_info=True)
