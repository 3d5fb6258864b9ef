"""The settings of a connected stream socket, and its quiet end."""

from __future__ import annotations

import contextlib
import socket


def tune(sock: socket.socket) -> None:
    """Blocking (deadlines are per call, never the socket's mode) and no Nagle delay."""
    sock.settimeout(None)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def shutdown(sock: socket.socket) -> None:
    """Shut both directions down: a thread blocked reading it returns. Never raises."""
    with contextlib.suppress(OSError):  # already closed or never connected
        sock.shutdown(socket.SHUT_RDWR)
