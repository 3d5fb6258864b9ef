"""The I/O thread of a udp:// endpoint: waits on its sockets, runs their handlers and timers."""

from __future__ import annotations

import contextlib
import logging
import selectors
import socket
import threading
import time
from collections import deque
from collections.abc import Callable

log = logging.getLogger("tensorwire.transports.udp")

Handler = Callable[[], None]


class IoLoop:
    """One thread: a selector over sockets, each with a handler called when it is readable,
    and ``tick(now)`` (``time.perf_counter()`` seconds) for timers, which returns the
    seconds until it next needs to run (None: only when a socket wakes the loop)."""

    def __init__(self, name: str, tick: Callable[[float], float | None]) -> None:
        self._tick = tick
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._selector.register(self._wake_r, selectors.EVENT_READ, self._on_wake)
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
        with contextlib.suppress(BlockingIOError, OSError):  # a wake-up is already pending
            self._wake_w.send(b"\0")

    def add(self, sock: socket.socket, handler: Handler) -> None:
        """Call ``handler`` whenever ``sock`` is readable (until :meth:`remove`)."""
        if self.in_loop or not self._thread.is_alive():
            self._selector.register(sock, selectors.EVENT_READ, handler)
        else:
            self.call(lambda: self._selector.register(sock, selectors.EVENT_READ, handler))

    def remove(self, sock: socket.socket) -> None:
        """Stop watching ``sock``; call from the loop's thread (or before it starts)."""
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(sock)

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the thread (after the handler running now) and free the selector."""
        self._stopping = True
        self.call(lambda: None)
        if self._thread.is_alive() and not self.in_loop:
            self._thread.join(timeout)
        self._selector.close()
        self._wake_r.close()
        self._wake_w.close()

    def _on_wake(self) -> None:
        with contextlib.suppress(BlockingIOError):
            self._wake_r.recv(4096)

    def _run(self) -> None:
        while not self._stopping:
            while self._calls:
                self._guarded(self._calls.popleft())
            try:
                timeout = self._tick(time.perf_counter())
            except Exception:
                log.exception("udp: timer failed")
                timeout = 0.1
            for key, _ in self._selector.select(timeout):
                if self._stopping:
                    return
                self._guarded(key.data)

    @staticmethod
    def _guarded(fn: Handler) -> None:
        try:
            fn()
        except Exception:  # a bug in one handler must not stop every peer's I/O
            log.exception("udp: I/O handler failed")
