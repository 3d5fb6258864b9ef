"""The error for a hub that cannot listen where it was asked to, saying what to do for the
common causes (a port in use, a port that needs root, an address this machine lacks)."""

from __future__ import annotations

import errno
import socket

from tensorwire.errors import TransportError

_HINTS = (
    (
        errno.EADDRINUSE,
        "Address already in use",
        "the port is in use (another hub or program listens there): pick another port, or 0 "
        "for any free one",
    ),
    (
        errno.EACCES,
        "Permission denied",
        "not allowed here (ports below 1024 need root): pick a port above 1024, or 0",
    ),
    (
        errno.EADDRNOTAVAIL,
        "Cannot assign requested address",
        "this machine has no such address: use one of its own (127.0.0.1, or 0.0.0.0 for all)",
    ),
)


def cannot_serve(url: str, exc: BaseException) -> TransportError:
    """A one-line TransportError for serving ``url`` failing with ``exc``."""
    code, text = getattr(exc, "errno", None), str(exc)
    for number, words, hint in _HINTS:
        if code == number or words in text:
            return TransportError(f"cannot serve {url}: {hint}")
    return TransportError(f"cannot serve {url}: {text}")


def tcp_bind_problem(host: str, port: int) -> OSError | None:
    """Why a TCP socket cannot listen on ``host:port`` now, or None: for libraries (gRPC)
    whose own error does not say. The socket is closed at once (a diagnosis, not a hold)."""
    try:
        socket.create_server((host, port)).close()
    except OSError as exc:
        return exc
    return None
