"""A listening stream socket that gives each connection a thread of its own, with a guard
against floods of connections that never say hello."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from tensorwire.errors import TransportError, WireError
from tensorwire.transports.sockets.tuning import shutdown

MAX_HANDSHAKES = 64  # connections at once that have not said hello; more are closed at once

Admitted = TypeVar("Admitted")


def _host_port(conn: socket.socket, address: Any) -> str:
    return f"{address[0]}:{address[1]}"


class Listener(Generic[Admitted]):
    """Accepts connections on ``sock`` (bound and listening) in a thread of its own.

    Each connection gets a thread that runs ``handshake(conn, address)``; what that returns
    is handed to ``serve`` on the same thread. A handshake that raises ``WireError`` or
    ``TransportError`` is reported to ``refused(who, error)`` and its connection closed. At
    most :data:`MAX_HANDSHAKES` connections are in their handshake at once: further ones are
    refused and closed at once, so a flood of silent connections does not cost a thread each.
    """

    def __init__(
        self,
        sock: socket.socket,
        *,
        name: str,
        handshake: Callable[[socket.socket, Any], Admitted],
        serve: Callable[[Admitted], None],
        refused: Callable[[str, Exception], None],
        who: Callable[[socket.socket, Any], str] = _host_port,
    ) -> None:
        self.sock = sock
        self._name = name
        self._handshake = handshake
        self._serve = serve
        self._refused = refused
        self._who = who
        self._lock = threading.Lock()  # guards the two below
        self._threads: set[threading.Thread] = set()  # one per connection, until it ends
        self._handshaking = 0
        self._accepting = threading.Thread(
            target=self._accept_loop, name=f"{name}-accept", daemon=True
        )
        self._accepting.start()

    def _accept_loop(self) -> None:
        while True:
            try:
                conn, address = self.sock.accept()
            except OSError:
                return  # listening socket shut down by close()
            with self._lock:
                crowded = self._handshaking >= MAX_HANDSHAKES
                if not crowded:
                    self._handshaking += 1
            if crowded:
                self._refused(self._who(conn, address), TransportError("too many handshakes"))
                conn.close()
                continue
            t = threading.Thread(
                target=self._connection,
                args=(conn, address),
                name=f"{self._name}-{address}",
                daemon=True,
            )
            with self._lock:
                self._threads.add(t)
            t.start()

    def _connection(self, conn: socket.socket, address: Any) -> None:
        try:
            try:
                admitted = self._handshake(conn, address)
            except (WireError, TransportError) as exc:
                self._refused(self._who(conn, address), exc)
                shutdown(conn)
                conn.close()
                return
            finally:
                with self._lock:
                    self._handshaking -= 1
            self._serve(admitted)
        finally:
            with self._lock:
                self._threads.discard(threading.current_thread())

    def close(self) -> None:
        """Stop accepting (the connections' threads run on: see :meth:`join`)."""
        shutdown(self.sock)
        self.sock.close()
        self._accepting.join(timeout=5)

    def join(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for each connection's thread to end."""
        with self._lock:
            threads = list(self._threads)
        for t in threads:
            t.join(timeout=timeout)
