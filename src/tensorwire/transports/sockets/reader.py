"""Reading messages from a connected stream socket into a :class:`MessageStream`: small reads
through a staging buffer, large ones in place (``recv_into``).

The socket stays in blocking mode, so one thread may read while another writes (see
:mod:`~tensorwire.transports.sockets.sendmsg`); a read with a deadline relies on SO_RCVTIMEO
or waits in ``poll``.
"""

from __future__ import annotations

import select
import socket
import struct
import sys
import time

from tensorwire.errors import PeerGone, TransportTimeout
from tensorwire.transports.sockets.tls_stream import TlsStream
from tensorwire.transports.sockets.waiting import wait_ready
from tensorwire.transports.sockets.waker import drain
from tensorwire.wire import NEED_DATA, Message, MessageStream

STAGING_BYTES = 64 << 10
"""Reads smaller than this go through a staging buffer; bigger ones land in place."""

_RCVTIMEO = sys.platform == "linux"  # where SO_RCVTIMEO takes a struct timeval of two longs
_TIMEVAL = struct.Struct("@ll")
RCVTIMEO_MIN_S = 0.05
"""Reads with less time left than this wait in ``poll`` (SO_RCVTIMEO counts in jiffies)."""


class ReadInterrupted(Exception):
    """:meth:`StreamReader.read_message` was woken through its ``wake`` socket."""


class StreamReader:
    """Reads messages from a socket into a :class:`MessageStream`, in place when large."""

    def __init__(self, sock: socket.socket, stream: MessageStream) -> None:
        self.sock = sock
        self.stream = stream
        self._staging = bytearray(STAGING_BYTES)
        self._staging_view = memoryview(self._staging)
        self._tls = sock if isinstance(sock, TlsStream) else None
        self._pollers: dict[int, select.poll] = {}  # by wake-up socket: it and this socket
        self._rcvtimeo = 0.0  # the socket's SO_RCVTIMEO, seconds (0: none)

    def _receive_timeout(self, deadline: float | None) -> int:
        """The ``recv`` flags for a read by ``deadline``, with SO_RCVTIMEO set so that a
        blocking ``recv`` returns by then: one system call per read where ``MSG_DONTWAIT``
        and ``poll`` take three when the data is not there yet. The timeout is only ever
        lowered to half what is left (rarely a system call); a short wait goes to ``poll``."""
        if deadline is None:
            if self._rcvtimeo:
                self._set_rcvtimeo(0.0)
            return 0
        left = deadline - time.monotonic()
        if not _RCVTIMEO or left < RCVTIMEO_MIN_S:
            return socket.MSG_DONTWAIT
        if not self._rcvtimeo or self._rcvtimeo > left:
            self._set_rcvtimeo(left / 2)
        return 0

    def _set_rcvtimeo(self, seconds: float) -> None:
        whole = int(seconds)
        self.sock.setsockopt(
            socket.SOL_SOCKET,
            socket.SO_RCVTIMEO,
            _TIMEVAL.pack(whole, int((seconds - whole) * 1e6)),
        )
        self._rcvtimeo = seconds

    def _wait(self, poller: select.poll, wake: socket.socket, deadline: float | None) -> None:
        """Wait until the socket or ``wake`` is readable (see :meth:`read_message`)."""
        while True:
            if deadline is None:
                left_ms = None
            else:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TransportTimeout("receive timed out")
                left_ms = left * 1000
            ready = poller.poll(left_ms)
            if not ready:
                continue
            if len(ready) == 2 or ready[0][0] == wake.fileno():
                drain(wake)
                raise ReadInterrupted("woken")
            return

    def read_message(
        self, deadline: float | None = None, wake: socket.socket | None = None
    ) -> Message:
        """Block until the next whole message; ``WireError`` for a bad one, ``PeerGone`` at EOF.

        A timeout leaves the partial message in the stream; the next call resumes it. With
        ``wake`` (a non-blocking socket another thread writes to; not for TLS connections),
        each wait for data is a ``poll`` on both, and a byte on ``wake`` ends the call with
        :class:`ReadInterrupted` (its bytes read, the partial message kept).
        """
        stream = self.stream
        if self._tls is not None:
            return self._read_tls(self._tls, deadline)
        poller = None
        if wake is None:
            flags = self._receive_timeout(deadline)
        else:
            flags = socket.MSG_DONTWAIT
            poller = self._pollers.get(wake.fileno())
            if poller is None:
                poller = select.poll()
                try:
                    poller.register(self.sock, select.POLLIN)
                    poller.register(wake, select.POLLIN)
                except ValueError as exc:  # fd -1: another thread closed the socket
                    raise PeerGone(f"the connection is closed ({exc})") from exc
                self._pollers[wake.fileno()] = poller
        while True:
            dst = stream.next_read(STAGING_BYTES)
            if dst is not None and type(dst) is not memoryview:
                return dst  # a message was complete
            if poller is not None:
                assert wake is not None
                self._wait(poller, wake, deadline)
            try:
                if dst is not None:
                    n = self.sock.recv_into(dst, 0, flags)
                    if n:
                        stream.advance(n)
                else:
                    n = self.sock.recv_into(self._staging_view, 0, flags)
                    if n:
                        msg = stream.receive_one(self._staging_view[:n])
                        if msg is not None:
                            return msg
            except BlockingIOError:
                if flags or wake is not None:
                    wait_ready(self.sock, select.POLLIN, deadline, "receive")
                else:  # SO_RCVTIMEO ran out: the deadline may have come
                    flags = self._receive_timeout(deadline)
                continue
            except OSError as exc:  # reset, or the socket was shut down under us
                raise PeerGone(f"connection lost: {exc}") from None
            if not n:
                where = " in the middle of a message" if stream.in_message else ""
                raise PeerGone(f"peer closed the connection{where}")

    def _read_tls(self, tls: TlsStream, deadline: float | None) -> Message:
        stream = self.stream
        while True:
            event = stream.next_event()
            if event is not NEED_DATA:
                return event
            dst = stream.next_buffer()
            big = len(dst) >= STAGING_BYTES
            n = tls.read_into(dst if big else self._staging_view, deadline)
            if not n:
                where = " in the middle of a message" if stream.in_message else ""
                raise PeerGone(f"peer closed the connection{where}")
            if big:
                stream.advance(n)
            else:
                stream.receive_data(self._staging_view[:n])
