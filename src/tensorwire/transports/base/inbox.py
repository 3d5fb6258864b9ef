"""The hand-off of received messages from a transport's thread to ``recv``."""

from __future__ import annotations

import threading
from collections import deque
from typing import Any

from tensorwire.errors import TransportTimeout
from tensorwire.transports.base.dialling import remaining


class Inbox:
    """What a channel's transport thread received, for ``recv`` on the caller's thread.

    ``put`` a message; ``fail(exc)`` makes every later ``get`` raise ``exc`` once the queued
    messages are taken (the connection ended); ``get(deadline)`` raises
    :class:`TransportTimeout` when the deadline passes first. With ``max_items``, a ``put``
    into a full inbox waits for room until its deadline (a reader that stops reading holds up
    its writer, not memory), and raises the failure once there is one.
    """

    def __init__(self, max_items: int | None = None) -> None:
        self._items: deque[Any] = deque()
        self._cond = threading.Condition()
        self._error: Exception | None = None
        self._max = max_items

    def put(self, item: Any, deadline: float | None = None) -> None:
        with self._cond:
            if self._max is not None:
                while len(self._items) >= self._max and self._error is None:
                    left = remaining(deadline)
                    if left == 0.0:
                        raise TransportTimeout("the reader did not take its messages in time")
                    self._cond.wait(left)
                if self._error is not None:
                    raise self._error.with_traceback(None)
            self._items.append(item)
            self._cond.notify_all()

    def fail(self, exc: Exception) -> None:
        with self._cond:
            if self._error is None:
                self._error = exc
            self._cond.notify_all()

    @property
    def failed(self) -> Exception | None:
        return self._error

    def get(self, deadline: float | None) -> Any:
        with self._cond:
            while not self._items:
                if self._error is not None:
                    raise self._error.with_traceback(None)  # no tracebacks piling up
                left = remaining(deadline)
                if left == 0.0:
                    raise TransportTimeout("no message from the hub in time")
                self._cond.wait(left)
            if self._max is not None:
                self._cond.notify_all()  # a writer may wait for room
            return self._items.popleft()

    def __len__(self) -> int:
        return len(self._items)
