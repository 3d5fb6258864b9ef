"""A waker: a socketpair whose read end a thread waiting in ``poll`` watches, so that another
thread can wake it with one byte.

Every waiter polls level-triggered and looks at its state again after a wake-up, so
:func:`drain` takes the pending bytes in one ``recv``: a second one, to be sure the pair is
empty, would cost a system call and a raised ``BlockingIOError`` on every wake-up, and bytes
left behind (over ``WAKE_BYTES`` pending) only wake the next ``poll`` once more.
"""

from __future__ import annotations

import socket

WAKE_BYTES = 4096
"""Wake-up bytes a woken waiter takes in one ``recv``."""


def waker() -> tuple[socket.socket, socket.socket]:
    """A socketpair, both ends non-blocking: a byte on the second wakes a poll on the first."""
    r, w = socket.socketpair()
    r.setblocking(False)
    w.setblocking(False)
    return r, w


def wake(w: socket.socket) -> None:
    """Wake the thread polling the other end of ``w``."""
    try:  # noqa: SIM105 (per message: a try is free, contextlib.suppress is 3 calls)
        w.send(b"\0")
    except OSError:  # full (a wake-up is pending anyway) or closed
        pass


def drain(r: socket.socket) -> None:
    """Take the pending wake-ups (see the module doc)."""
    try:  # noqa: SIM105 (as in wake)
        r.recv(WAKE_BYTES)
    except OSError:  # none pending, or closed
        pass
