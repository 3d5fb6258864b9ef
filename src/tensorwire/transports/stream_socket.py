"""Moving encoded messages over a connected stream socket: scatter-gather out, recv_into in.

The socket stays in blocking mode, so one thread may read while another writes. A deadline
never changes the socket's flags (``settimeout`` would: it makes the shared file description
non-blocking, and the other thread's blocking call then fails with EAGAIN); a call with a
deadline tries once with ``MSG_DONTWAIT`` and waits in ``poll`` when the kernel is not ready.

A TLS socket (:func:`wrap_tls`) is non-blocking instead, and every call into its SSL object
holds the socket's lock (OpenSSL does not allow two threads in one connection at once); the
threads wait for readiness in ``poll``, outside the lock.
"""

from __future__ import annotations

import os
import select
import socket
import ssl
import threading
import time

from tensorwire.errors import AuthenticationError, PeerGone, TransportError, TransportTimeout
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


class TlsSocket(ssl.SSLSocket):
    """An :class:`ssl.SSLSocket` with the lock its SSL calls take (see the module doc)."""

    lock: threading.Lock


def _tls_error(exc: ssl.SSLError, what: str) -> TransportError:
    """A TLS failure as the caller should see it: a refused certificate is an
    :class:`AuthenticationError` (final), anything else a lost connection."""
    text = str(exc)
    if isinstance(exc, ssl.SSLCertVerificationError):
        return AuthenticationError(f"{what}: the peer's certificate does not verify: {exc}")
    if "CERTIFICATE" in text.upper() or "UNKNOWN_CA" in text.upper():
        return AuthenticationError(f"{what}: the peer refused this side's certificate: {exc}")
    return PeerGone(f"{what}: TLS connection lost: {exc}")


def wrap_tls(
    sock: socket.socket,
    context: ssl.SSLContext,
    *,
    server_side: bool,
    server_hostname: str | None = None,
    deadline: float | None = None,
) -> TlsSocket:
    """Run the TLS handshake on a connected socket by ``deadline``; return the TLS socket."""
    tls = context.wrap_socket(
        sock,
        server_side=server_side,
        server_hostname=server_hostname,
        do_handshake_on_connect=False,
    )
    tls.setblocking(False)
    while True:
        try:
            tls.do_handshake()
            break
        except ssl.SSLWantReadError:
            wait_ready(tls, select.POLLIN, deadline, "TLS handshake")
        except ssl.SSLWantWriteError:
            wait_ready(tls, select.POLLOUT, deadline, "TLS handshake")
        except ssl.SSLError as exc:
            tls.close()
            raise _tls_error(exc, "TLS handshake") from None
        except OSError as exc:
            tls.close()
            raise PeerGone(f"connection lost during the TLS handshake: {exc}") from None
    tls.__class__ = TlsSocket
    tls.lock = threading.Lock()  # type: ignore[attr-defined]
    return tls  # type: ignore[return-value]


def _tls_send_all(sock: TlsSocket, buffers: list, deadline: float | None) -> None:
    for buf in buffers:
        view = memoryview(buf).cast("B")
        while len(view):
            try:
                with sock.lock:
                    n = sock.send(view)
            except ssl.SSLWantWriteError:
                wait_ready(sock, select.POLLOUT, deadline, "send")
                continue
            except ssl.SSLWantReadError:
                wait_ready(sock, select.POLLIN, deadline, "send")
                continue
            except ssl.SSLError as exc:
                raise _tls_error(exc, "send") from None
            except OSError as exc:
                raise PeerGone(f"connection lost: {exc}") from None
            view = view[n:]


def sendmsg_all(sock: socket.socket, buffers: list, deadline: float | None = None) -> None:
    """Send every byte of ``buffers`` with as few ``sendmsg`` calls as the kernel allows."""
    if isinstance(sock, TlsSocket):
        _tls_send_all(sock, buffers, deadline)
        return
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
        self._tls = sock if isinstance(sock, TlsSocket) else None

    def read_message(self, deadline: float | None = None) -> Message:
        """Block until the next whole message; ``WireError`` for a bad one, ``PeerGone`` at EOF.

        A timeout leaves the partial message in the stream; the next call resumes it.
        """
        stream = self.stream
        if self._tls is not None:
            return self._read_tls(self._tls, deadline)
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

    def _read_tls(self, sock: TlsSocket, deadline: float | None) -> Message:
        stream = self.stream
        while True:
            event = stream.next_event()
            if event is not NEED_DATA:
                return event  # type: ignore[return-value]
            dst = stream.next_buffer()
            big = len(dst) >= STAGING_BYTES
            try:
                with sock.lock:
                    n = sock.recv_into(dst if big else self._staging_view)
            except ssl.SSLWantReadError:
                wait_ready(sock, select.POLLIN, deadline, "receive")
                continue
            except ssl.SSLWantWriteError:
                wait_ready(sock, select.POLLOUT, deadline, "receive")
                continue
            except ssl.SSLZeroReturnError:
                n = 0
            except ssl.SSLError as exc:
                raise _tls_error(exc, "receive") from None
            except OSError as exc:
                raise PeerGone(f"connection lost: {exc}") from None
            if not n:
                where = " in the middle of a message" if stream.in_message else ""
                raise PeerGone(f"peer closed the connection{where}")
            if big:
                stream.advance(n)
            else:
                stream.receive_data(self._staging_view[:n])
