"""A channel's turns: one thread at a time on its ZeroMQ sockets, without a hand-off when
only one thread uses them."""

from __future__ import annotations

import threading
from collections.abc import Callable


class Turns:
    """One thread at a time on a channel's sockets: ``with turns:``, or on the hot paths
    ``lock.acquire(False)`` and :meth:`wait_turn` when that fails, then ``lock.release()`` (a
    plain lock: no Python frames when uncontended). A thread that finds them taken calls
    ``wake`` (the holder may wait in ``poll``); the holder, woken, lets it go first
    (:meth:`step_aside`), so a channel used from one thread pays no hand-off."""

    def __init__(self, wake: Callable[[], None]) -> None:
        self.lock = threading.Lock()  # held by the thread using the sockets
        self._cv = threading.Condition(threading.Lock())  # guards _waiting
        self._waiting = 0  # threads that want the sockets
        self._wake = wake

    def __enter__(self) -> None:
        if not self.lock.acquire(False):
            self.wait_turn()

    def __exit__(self, *exc: object) -> None:
        self.lock.release()

    def wait_turn(self) -> None:
        """Take the sockets from the thread that holds them (``lock`` acquired on return)."""
        with self._cv:
            self._waiting += 1
        try:
            self._wake()
            self.lock.acquire()
        finally:
            with self._cv:
                self._waiting -= 1
                self._cv.notify_all()

    def step_aside(self) -> None:
        """Give the sockets to the threads waiting for them; take them back after."""
        self.lock.release()
        try:
            with self._cv:
                while self._waiting:  # each one counts itself out once it holds the lock
                    self._cv.wait()
        finally:
            self.lock.acquire()
