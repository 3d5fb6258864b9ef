"""Scatter-gather sends on a connected, blocking stream socket: every byte of a list of
buffers with as few ``sendmsg`` calls as the kernel allows.

A deadline never changes the socket's flags (``settimeout`` would: it makes the shared file
description non-blocking, and another thread's blocking call then fails with EAGAIN); a send
with a deadline tries with ``MSG_DONTWAIT`` and waits in ``poll`` when the kernel is full.
"""

from __future__ import annotations

import os
import select
import socket

from tensorwire.errors import PeerGone
from tensorwire.transports.sockets.waiting import wait_ready

IOV_MAX = os.sysconf("SC_IOV_MAX") if hasattr(os, "sysconf") else 1024


def sendmsg_all(
    sock: socket.socket, buffers: list, deadline: float | None = None, total: int | None = None
) -> None:
    """Send every byte of ``buffers`` (``total`` bytes, when the caller knows) on a plain
    socket; ``PeerGone`` if the connection is lost, ``TransportTimeout`` at the deadline."""
    flags = 0 if deadline is None else socket.MSG_DONTWAIT
    if len(buffers) <= IOV_MAX:  # the common case: one sendmsg takes it all
        try:
            n = sock.sendmsg(buffers, (), flags)
        except BlockingIOError:
            n = 0
        except (BrokenPipeError, ConnectionError) as exc:
            raise PeerGone(f"peer closed the connection: {exc}") from None
        except OSError as exc:  # EBADF and kin: the socket was closed under us
            raise PeerGone(f"connection lost: {exc}") from None
        if n == (sum(map(len, buffers)) if total is None else total):
            return
        _send_rest(sock, buffers, n, flags, deadline)
        return
    _send_rest(sock, buffers, 0, flags, deadline)


def _send_rest(
    sock: socket.socket, buffers: list, sent: int, flags: int, deadline: float | None
) -> None:
    """:func:`sendmsg_all` once ``sent`` bytes of ``buffers`` went out."""
    views = [memoryview(b).cast("B") for b in buffers]
    i = 0
    n = sent
    while i < len(views):
        while n:  # drop what went out
            if n >= len(views[i]):
                n -= len(views[i])
                i += 1
            else:
                views[i] = views[i][n:]
                n = 0
        while i < len(views) and not len(views[i]):
            i += 1
        if i == len(views):
            return
        try:
            n = sock.sendmsg(views[i : i + IOV_MAX], (), flags)
        except BlockingIOError:
            wait_ready(sock, select.POLLOUT, deadline, "send")
            continue
        except (BrokenPipeError, ConnectionError) as exc:
            raise PeerGone(f"peer closed the connection: {exc}") from None
        except OSError as exc:  # EBADF and kin: the socket was closed under us
            raise PeerGone(f"connection lost: {exc}") from None
