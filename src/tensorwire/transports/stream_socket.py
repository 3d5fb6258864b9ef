"""Moving encoded messages over a connected stream socket: scatter-gather out, recv_into in.

The socket stays in blocking mode, so one thread may read while another writes. A deadline
never changes the socket's flags (``settimeout`` would: it makes the shared file description
non-blocking, and the other thread's blocking call then fails with EAGAIN); a call with a
deadline tries once with ``MSG_DONTWAIT`` and waits in ``poll`` when the kernel is not ready.
"""

from __future__ import annotations

import os
import select
import socket
import time

from tensorwire.errors import PeerGone, TransportTimeout
from tensorwire.wire import NEED_DATA, EncodedMessage, Message, MessageStream

IOV_MAX = os.sysconf("SC_IOV_MAX") if hasattr(os, "sysconf") else 1024
STAGING_BYTES = 64 << 10
"""Reads smaller than this go through a staging buffer; bigger ones land in place."""


def wait_ready(sock: socket.socket, events: int, deadline: float | None, what: str) -> None:
    """Wait in ``poll`` until ``sock`` is ready for ``events``; ``TransportTimeout`` at the
    deadline (``time.monotonic()`` seconds; None waits as long as it takes)."""
    poller = select.poll()
    poller.register(sock, events)
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


def sendmsg_all(sock: socket.socket, buffers: list, deadline: float | None = None) -> None:
    """Send every byte of ``buffers`` with as few ``sendmsg`` calls as the kernel allows."""
    views = [memoryview(b) for b in buffers]
    flags = 0 if deadline is None else socket.MSG_DONTWAIT
    i = 0
    while i < len(views):
        try:
            n = sock.sendmsg(views[i : i + IOV_MAX], (), flags)
        except BlockingIOError:
            wait_ready(sock, select.POLLOUT, deadline, "send")
            continue
        except (BrokenPipeError, ConnectionError) as exc:
            raise PeerGone(f"peer closed the connection: {exc}") from None
        except OSError as exc:  # EBADF and kin: the socket was closed under us
            raise PeerGone(f"connection lost: {exc}") from None
        while n:
            if n >= len(views[i]):
                n -= len(views[i])
                i += 1
            else:
                views[i] = views[i][n:]
                n = 0
        while i < len(views) and not len(views[i]):
            i += 1


def send_encoded(sock: socket.socket, enc: EncodedMessage, deadline: float | None = None) -> None:
    """Send a whole encoded message (hashing each piece just before it goes)."""
    for batch in enc.segments():
        sendmsg_all(sock, batch, deadline)


class StreamReader:
    """Reads messages from a socket into a :class:`MessageStream`, in place when large."""

    def __init__(self, sock: socket.socket, stream: MessageStream) -> None:
        self.sock = sock
        self.stream = stream
        self._staging = bytearray(STAGING_BYTES)
        self._staging_view = memoryview(self._staging)

    def read_message(self, deadline: float | None = None) -> Message:
        """Block until the next whole message; ``WireError`` for a bad one, ``PeerGone`` at EOF.

        A timeout leaves the partial message in the stream; the next call resumes it.
        """
        stream = self.stream
        flags = 0 if deadline is None else socket.MSG_DONTWAIT
        while True:
            event = stream.next_event()
            if event is not NEED_DATA:
                return event  # type: ignore[return-value]
            dst = stream.next_buffer()
            try:
                if len(dst) >= STAGING_BYTES:
                    n = self.sock.recv_into(dst, 0, flags)
                    if n:
                        stream.advance(n)
                else:
                    n = self.sock.recv_into(self._staging_view, 0, flags)
                    if n:
                        stream.receive_data(self._staging_view[:n])
            except BlockingIOError:
                wait_ready(self.sock, select.POLLIN, deadline, "receive")
                continue
            except OSError as exc:  # reset, or the socket was shut down under us
                raise PeerGone(f"connection lost: {exc}") from None
            if not n:
                where = " in the middle of a message" if stream.in_message else ""
                raise PeerGone(f"peer closed the connection{where}")
