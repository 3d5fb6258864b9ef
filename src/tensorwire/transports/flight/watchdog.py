"""One thread that cancels a channel's blocked gRPC write when its send's deadline passes."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class Watchdog:
    """Calls ``fire`` when an armed deadline passes: one thread for all of a channel's sends,
    started on the first, instead of a timer thread per send (a thread costs milliseconds).

    The thread sleeps until the deadline it last saw; arming a later one does not wake it (it
    looks again when it wakes), so back-to-back sends cost two lock round trips each.
    """

    def __init__(self, name: str) -> None:
        self._name = name
        self._cond = threading.Condition()
        self._deadline: float | None = None  # time.monotonic() seconds; None: disarmed
        self._fire: Callable[[], None] | None = None
        self._wake_at: float | None = None  # when the thread will look next; None: not soon
        self._fired = False
        self._thread: threading.Thread | None = None

    def arm(self, deadline: float, fire: Callable[[], None]) -> None:
        with self._cond:
            self._deadline, self._fire, self._fired = deadline, fire, False
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
            elif self._wake_at is None or deadline < self._wake_at:
                self._cond.notify()

    def disarm(self) -> None:
        with self._cond:
            self._deadline = self._fire = None

    def fired(self) -> bool:
        """Whether the deadline last armed passed (and ``fire`` was called)."""
        with self._cond:
            return self._fired

    def stop(self) -> None:
        with self._cond:
            thread, self._thread = self._thread, None
            self._deadline = self._fire = None
            self._cond.notify()
        if thread is not None:
            thread.join(timeout=5)

    def _run(self) -> None:
        me = threading.current_thread()
        while True:
            with self._cond:
                if self._thread is not me:
                    return
                now = time.monotonic()
                fire = self._fire if self._deadline is not None and self._deadline <= now else None
                if fire is None:
                    self._wake_at = self._deadline
                    self._cond.wait(None if self._deadline is None else self._deadline - now)
                    continue
                self._deadline = self._fire = None
                self._fired = True
            fire()  # outside the lock: it cancels a gRPC call
