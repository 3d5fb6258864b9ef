"""Bounding a flight:// hub's calls, and so its threads.

gRPC's synchronous server (pyarrow's Flight server) runs each call on a thread of its own
until the call ends, and pyarrow gives a server no way to end a call from another thread: a
handler blocked reading a client that says nothing, or writing to one that reads nothing,
holds its thread until that client cancels the call or its connection closes. So the hub
bounds what it takes in instead: a server middleware counts every call from its start (before
gRPC reads its first message) to its end, and refuses a new one at once, with gRPC's
``UNAVAILABLE`` and a text starting :data:`BUSY`, once the calls live reach the hub's limit.
A channel takes that as "the hub is busy" and retries with backoff (:class:`HubBusy`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import pyarrow.flight as flight

from tensorwire.errors import TransportError
from tensorwire.transports.base.logs import _log_limited

BUSY = "tensorwire hub busy"
"""How a hub's refusal of a call for want of room starts (the status is ``UNAVAILABLE``)."""


class HubBusy(TransportError):
    """The hub refused a call for want of room (too many calls live); worth retrying later,
    which :meth:`~tensorwire.transports.base.Channel.reconnect` does, with backoff."""


def busy(text: str) -> flight.FlightUnavailableError:
    """The error a handler raises to refuse its call as busy (gRPC ``UNAVAILABLE``)."""
    return flight.FlightUnavailableError(f"{BUSY}: {text}; retry later, with backoff")


class CallGauge:
    """The calls live on a hub's server, and the refusal of new ones past ``limit()`` (looked
    at for each call, so it may follow the hub's membership); thread-safe."""

    def __init__(self, limit: Callable[[], int], where: str) -> None:
        self._limit = limit
        self.where = where
        self._lock = threading.Lock()
        self.live = 0
        self.refused = 0  # calls refused as busy, in all

    def enter(self) -> None:
        """Count a starting call, or raise :func:`busy` (logged, rate-limited) past the limit."""
        limit = self._limit()
        with self._lock:
            if self.live < limit:
                self.live += 1
                return
            self.refused += 1
            live = self.live
        text = f"{live} calls live, limit {limit}"
        _log_limited(
            f"flight busy {self.where}",
            f"flight: the hub at {self.where} refused a call: {text} (the hub's max_calls, "
            "else 2 per member and the handshake room); clients retry with backoff",
        )
        raise busy(text)

    def leave(self) -> None:
        with self._lock:
            self.live -= 1


class _Counted(flight.ServerMiddleware):
    def __init__(self, gauge: CallGauge) -> None:
        self._gauge = gauge

    def call_completed(self, exception: BaseException | None) -> None:
        self._gauge.leave()


class CallCounter(flight.ServerMiddlewareFactory):
    """The server middleware that keeps a :class:`CallGauge`: every call of any method."""

    def __init__(self, gauge: CallGauge) -> None:
        self._gauge = gauge

    def start_call(self, info: flight.CallInfo, headers: dict) -> flight.ServerMiddleware:
        self._gauge.enter()
        return _Counted(self._gauge)
