"""The thread that sends the ``release`` packets a dying view could not send at once."""

from __future__ import annotations

import contextlib
import queue
import threading
from typing import Any

from tensorwire.errors import TransportError
from tensorwire.transports.base import deadline_after
from tensorwire.transports.shm.connection import control_packet
from tensorwire.transports.shm.options import RELEASE_TIMEOUT


class Releaser:
    """Sends, from a thread of its own, the ``release`` packets that found no room in the socket
    when their views died."""

    def __init__(self, name: str) -> None:
        self.queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while (item := self.queue.get()) is not None:
            conn, seg = item
            if conn.alive:
                with contextlib.suppress(TransportError):
                    conn.send(
                        [control_packet("release", {"seg": seg})], deadline_after(RELEASE_TIMEOUT)
                    )

    def stop(self) -> None:
        self.queue.put(None)
        self._thread.join(timeout=5)
