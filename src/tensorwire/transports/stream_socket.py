"""Moving encoded messages over a connected stream socket: scatter-gather out, recv_into in."""

from __future__ import annotations

import os
import socket
import time

from tensorwire.errors import PeerGone, TransportTimeout
from tensorwire.wire import NEED_DATA, EncodedMessage, Message, MessageStream

IOV_MAX = os.sysconf("SC_IOV_MAX") if hasattr(os, "sysconf") else 1024
STAGING_BYTES = 64 << 10
"""Reads smaller than this go through a staging buffer; bigger ones land in place."""


def _set_timeout(sock: socket.socket, deadline: float | None) -> None:
    if deadline is None:
        sock.settimeout(None)
    else:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TransportTimeout("timed out")
        sock.settimeout(left)


def sendmsg_all(sock: socket.socket, buffers: list, deadline: float | None = None) -> None:
    """Send every byte of ``buffers`` with as few ``sendmsg`` calls as the kernel allows."""
    views = [memoryview(b) for b in buffers]
    i = 0
    while i < len(views):
        _set_timeout(sock, deadline)
        try:
            n = sock.sendmsg(views[i : i + IOV_MAX])
        except TimeoutError:
            raise TransportTimeout("send timed out") from None
        except (BrokenPipeError, ConnectionError) as exc:
            raise PeerGone(f"peer closed the connection: {exc}") from None
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
        while True:
            event = stream.next_event()
            if event is not NEED_DATA:
                return event  # type: ignore[return-value]
            _set_timeout(self.sock, deadline)
            dst = stream.next_buffer()
            try:
                if len(dst) >= STAGING_BYTES:
                    n = self.sock.recv_into(dst)
                    if n:
                        stream.advance(n)
                else:
                    n = self.sock.recv_into(self._staging_view)
                    if n:
                        stream.receive_data(self._staging_view[:n])
            except TimeoutError:
                raise TransportTimeout("receive timed out") from None
            except OSError as exc:  # reset, or the socket was shut down under us
                raise PeerGone(f"connection lost: {exc}") from None
            if not n:
                where = " in the middle of a message" if stream.in_message else ""
                raise PeerGone(f"peer closed the connection{where}")
