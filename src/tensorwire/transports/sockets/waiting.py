"""Waiting in ``poll`` for sockets to be ready, with a deadline."""

from __future__ import annotations

import select
import socket
import time

from tensorwire.errors import PeerGone, TransportTimeout


def wait_ready(sock: socket.socket, events: int, deadline: float | None, what: str) -> None:
    """Wait in ``poll`` until ``sock`` is ready for ``events``; ``TransportTimeout`` at the
    deadline (``time.monotonic()`` seconds; None waits as long as it takes), ``PeerGone`` if
    another thread closed ``sock``. ``poll`` rounds the wait up to whole milliseconds."""
    poller = select.poll()
    try:
        poller.register(sock, events)
    except (ValueError, OSError):  # closed under us (a ValueError is no connection error)
        raise PeerGone(f"{what}: the connection is closed") from None
    while True:
        if deadline is None:
            left_ms = None
        else:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TransportTimeout(f"{what} timed out")
            left_ms = left * 1000
        if poller.poll(left_ms):
            return


def poller(*fds: int) -> select.poll:
    """A ``poll`` object on ``fds`` (readable): one system call per wait, where a
    ``zmq.Poller`` asks libzmq for every socket's events before and after it."""
    p = select.poll()
    for fd in fds:
        p.register(fd, select.POLLIN)
    return p
