"""Messages from the server to devices, sent by a pool of threads so that the round loop never
waits on a device; what sending a model did comes back on the loop's queue."""

from __future__ import annotations

import logging
import queue
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import tensorwire
from tensorwire.errors import TransportError
from tensorwire.transports import BroadcastResult

log = logging.getLogger("tensorwire.fl")

CONTROL_TIMEOUT = 10.0  # seconds for a small control message (setup, verdict, done)
SENDERS = 16  # threads sending models and control messages


class Outbox:
    """Sends through ``hub`` (set once it listens); a model's :class:`BroadcastResult` goes on
    ``events`` as ``("sent", round, result)``. Nothing is sent once ``closing`` is set."""

    def __init__(self, events: queue.Queue[tuple[Any, ...]], closing: threading.Event) -> None:
        self.hub: tensorwire.Hub | None = None
        self._events = events
        self._closing = closing
        self._senders = ThreadPoolExecutor(SENDERS, thread_name_prefix="tensorwire-fl-send")

    def model(
        self, r: int, cids: list[str], weights: Any, meta: dict[str, Any], timeout: float
    ) -> None:
        """Send round ``r``'s model (``weights``) to ``cids`` within ``timeout`` seconds."""
        self._senders.submit(self._send, cids, {"weights": weights}, meta, timeout, r)

    def tell(self, cid: str, meta: dict[str, Any]) -> None:
        """Send a small control message to one device, without waiting for it."""
        if not self._closing.is_set():
            self._senders.submit(self._send, [cid], None, meta, CONTROL_TIMEOUT, None)

    def say_done(self, cids: list[str], error: str | None = None) -> None:
        """Tell ``cids`` the run is over (with the ``error`` that ended it), waiting for it."""
        if self.hub is None or self._closing.is_set():
            return
        meta = {"fl": "done"} | ({"error": error} if error else {})
        try:
            self.hub.broadcast(None, meta=meta, clients=cids, timeout=CONTROL_TIMEOUT)
        except TransportError as exc:
            log.warning("fl: could not tell the devices the run ended: %s", exc)

    def stop(self) -> None:
        """Send nothing more: what is queued is dropped, what is under way ends with the hub."""
        self._closing.set()
        self._senders.shutdown(wait=False, cancel_futures=True)

    def join(self) -> None:
        """Wait for the senders (once the hub is closed, their sends end at once)."""
        self._closing.set()
        self._senders.shutdown(wait=True)

    def _send(
        self,
        cids: list[str],
        tensors: dict[str, Any] | None,
        meta: dict[str, Any],
        timeout: float,
        model_round: int | None,
    ) -> None:
        """(A sender thread.) Send to ``cids``; a model's result goes on the queue."""
        assert self.hub is not None
        try:
            result = self.hub.broadcast(tensors, meta=meta, clients=cids, timeout=timeout)
        except TransportError as exc:  # the hub closed
            result = BroadcastResult()
            result.failed.update(dict.fromkeys(cids, exc))
        except Exception as exc:  # never lose a sender's failure in a thread
            log.exception("fl: sending %s to %s failed", meta.get("fl"), cids)
            result = BroadcastResult()
            result.failed.update(dict.fromkeys(cids, exc))
        if model_round is not None:
            self._events.put(("sent", model_round, result))
