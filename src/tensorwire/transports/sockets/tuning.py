"""The settings of a connected stream socket, and its quiet end."""

from __future__ import annotations

import contextlib
import socket


def tune(sock: socket.socket) -> None:
    """Blocking (deadlines are per call, never the socket's mode) and no Nagle delay."""
    sock.settimeout(None)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def shutdown(sock: socket.socket, how: int = socket.SHUT_RDWR) -> None:
    """Shut both directions down: a thread blocked reading it returns; or, ``how`` being
    ``SHUT_WR``, only the sending one (the peer reads to an end, and can still be read).
    Never raises."""
    with contextlib.suppress(OSError):  # already closed or never connected
        sock.shutdown(how)
