"""The client end of quic:// in one process: every channel to one hub address shares one UDP
socket and one I/O thread (an :class:`Engine`), as a QUIC client endpoint multiplexes its
connections by their connection ids.

A thread and a socket per channel cost a process simulating many devices its CPU: 2,000
channels in 20 processes were 4,000 threads queueing for 20 interpreter locks, and the
hub's own I/O thread got a 4,000th of the machine (none of 2,000 joined in 300 s).
"""

from __future__ import annotations

import os
import socket
import threading
import time
from typing import Any

from tensorwire.transports.quic.connection import APP_CLOSED, Connection
from tensorwire.transports.quic.engine import Engine

SCAN_EVERY = 0.1
"""Seconds between two looks at every connection of an endpoint for a keep-alive due."""

_lock = threading.Lock()
_endpoints: dict[tuple[int, Any], ClientEndpoint] = {}  # by (process id, hub address)


class ClientEndpoint:
    """One UDP socket connected to a hub's address (so the kernel drops datagrams from anyone
    else, and reports a port nobody listens on) and the I/O thread that runs the QUIC
    connections of this process's channels to that hub."""

    def __init__(self, family: int, addr: Any) -> None:
        sock = socket.socket(family, socket.SOCK_DGRAM)
        try:
            sock.connect(addr)
        except OSError:
            sock.close()
            raise
        self.addr = addr
        self.held: set[Connection] = set()  # the connections it serves, under _lock
        self._pings: dict[Connection, float] = {}  # the I/O thread's: ping interval, seconds
        self._next_scan = 0.0
        self.engine = Engine(sock, f"tensorwire-quic-client-{addr[0]}:{addr[1]}")
        self.engine.tick = self._tick
        self.engine.on_refused = self._refused

    def _start(self, connection: Connection, ping_every: float) -> None:
        def start() -> None:
            connection.conn.connect(self.addr, now=time.monotonic())
            self.engine.add(connection)
            self._pings[connection] = ping_every

        self.engine.call(start)

    def close(self, connection: Connection, code: int, reason: str, timeout: float) -> None:
        """Close ``connection`` and send its CONNECTION_CLOSE (waiting ``timeout`` seconds at
        most); the last connection to close stops the thread. Idempotent."""
        with _lock:
            if connection not in self.held:
                return
            self.held.discard(connection)
            last = not self.held
            if last and _endpoints.get(_key(self.addr)) is self:
                del _endpoints[_key(self.addr)]
        self.engine.close(lambda: [connection], code, reason, timeout)
        if last:
            self.engine.stop()

    # -- on the I/O thread -----------------------------------------------------------

    def _refused(self) -> None:
        """Nobody listens at the hub's port: the connections still in their handshake fail
        at once (an established one waits for its idle timeout: the hub may be back)."""
        for connection in list(self._pings):
            if not connection.handshake_done.is_set():
                connection.close(APP_CLOSED, "nobody listens there")

    def _tick(self, now: float) -> None:
        if now < self._next_scan:
            return
        self._next_scan = now + SCAN_EVERY
        for connection, every in list(self._pings.items()):
            if connection.closed.is_set():
                del self._pings[connection]
            elif connection.handshake_done.is_set():
                connection.ping_if_quiet(now, every)


def _key(addr: Any) -> tuple[int, Any]:
    return (os.getpid(), addr)  # a forked child makes its own: the thread is not there


def dial(family: int, addr: Any, connection: Connection, ping_every: float) -> ClientEndpoint:
    """Dial the hub at ``addr`` on ``connection`` (a client's, not yet connected) from this
    process's endpoint for it (made on first use), which keeps it alive with a ping after
    ``ping_every`` seconds of quiet once its handshake is done, until
    :meth:`ClientEndpoint.close`."""
    with _lock:
        endpoint = _endpoints.get(_key(addr))
        if endpoint is None:
            endpoint = _endpoints[_key(addr)] = ClientEndpoint(family, addr)
        endpoint.held.add(connection)
    endpoint._start(connection, ping_every)
    return endpoint
