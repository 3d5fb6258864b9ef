"""Moving encoded messages over a connected stream socket: scatter-gather out, recv_into in.

The socket stays in blocking mode, so one thread may read while another writes. A deadline
never changes the socket's flags (``settimeout`` would: it makes the shared file description
non-blocking, and the other thread's blocking call then fails with EAGAIN); a call with a
deadline tries once with ``MSG_DONTWAIT`` and waits in ``poll`` when the kernel is not ready.

A TLS connection is a :class:`TlsStream`: TLS 1.3 through memory BIOs over such a socket.
One ``recv`` brings in many TLS records at once and the SSL object only does the crypto
(Python's SSL socket reads one 16 KiB record per call, with two syscalls each, which caps it
near 1 GB/s); every call into the SSL object holds a lock, as OpenSSL allows one thread in a
connection at a time, and sends hold a second lock so records reach the wire in order.
"""

from __future__ import annotations

import contextlib
import os
import select
import socket
import ssl
import threading
import time
from typing import Any

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


TLS_READ_BYTES = 1 << 20
"""Ciphertext read from the socket at once (up to 64 records)."""


def tls_error(exc: ssl.SSLError, what: str) -> TransportError:
    """A TLS failure as the caller should see it: a refused certificate is an
    :class:`AuthenticationError` (final), anything else a lost connection."""
    text = str(exc).upper()
    if isinstance(exc, ssl.SSLCertVerificationError):
        return AuthenticationError(f"{what}: the peer's certificate does not verify: {exc}")
    if "CERTIFICATE" in text or "UNKNOWN_CA" in text:
        return AuthenticationError(f"{what}: the peer refused this side's certificate: {exc}")
    return PeerGone(f"{what}: TLS connection lost: {exc}")


class TlsStream:
    """A TLS 1.3 connection over a connected, blocking TCP socket (see the module doc).

    Behaves as far as the transports need like a socket: :meth:`shutdown`, :meth:`close`,
    :meth:`getpeercert`; :func:`send_encoded` and :class:`StreamReader` take it.
    """

    def __init__(
        self,
        sock: socket.socket,
        context: ssl.SSLContext,
        *,
        server_side: bool,
        server_hostname: str | None = None,
    ) -> None:
        self.sock = sock
        self._in = ssl.MemoryBIO()
        self._out = ssl.MemoryBIO()
        self._obj = context.wrap_bio(
            self._in, self._out, server_side=server_side, server_hostname=server_hostname
        )
        self._lock = threading.Lock()  # every call into the SSL object
        self._wire = threading.Lock()  # flushes of ciphertext to the socket, in order
        self._rbuf = bytearray(TLS_READ_BYTES)
        self._rview = memoryview(self._rbuf)
        self._eof = False

    def handshake(self, deadline: float | None) -> None:
        """Run the TLS handshake by ``deadline``."""
        while True:
            try:
                with self._lock:
                    self._obj.do_handshake()
                self._flush(deadline)
                return
            except ssl.SSLWantReadError:
                self._flush(deadline)
                if not self._pull(deadline, "TLS handshake"):
                    raise PeerGone(
                        "the peer closed the connection during the TLS handshake"
                    ) from None
            except ssl.SSLError as exc:
                with contextlib.suppress(TransportError, OSError):
                    self._flush(deadline)  # the alert tells the peer why
                raise tls_error(exc, "TLS handshake") from None

    def getpeercert(self) -> Any:
        return self._obj.getpeercert()

    def _flush(self, deadline: float | None) -> None:
        with self._wire:
            with self._lock:
                data = self._out.read()
            if data:
                sendmsg_all(self.sock, [data], deadline)

    def _pull(self, deadline: float | None, what: str) -> int:
        """Move what the socket holds (waiting for it until ``deadline``) into the SSL
        object; return the bytes moved, 0 at the end of the stream."""
        flags = 0 if deadline is None else socket.MSG_DONTWAIT
        while True:
            try:
                n = self.sock.recv_into(self._rview, 0, flags)
            except BlockingIOError:
                wait_ready(self.sock, select.POLLIN, deadline, what)
                continue
            except OSError as exc:
                raise PeerGone(f"connection lost: {exc}") from None
            if n:
                with self._lock:
                    self._in.write(self._rview[:n])
            return n

    def send_all(self, buffers: list, deadline: float | None) -> None:
        """Encrypt and send every byte of ``buffers``."""
        with self._wire:
            for buf in buffers:
                view = memoryview(buf).cast("B")
                try:
                    with self._lock:
                        self._obj.write(view)
                        data = self._out.read()
                except ssl.SSLError as exc:
                    raise tls_error(exc, "send") from None
                sendmsg_all(self.sock, [data], deadline)

    def read_into(self, dst: memoryview, deadline: float | None) -> int:
        """Decrypt into ``dst`` as much as has arrived (waiting for some until ``deadline``);
        0 at the end of the stream."""
        got, size = 0, len(dst)
        while got < size:
            try:
                with self._lock:
                    n = self._obj.read(size - got, dst[got:] if got else dst)
            except ssl.SSLWantReadError:
                if got:
                    return got
                if self._eof or not self._pull(deadline, "receive"):
                    self._eof = True
                    return 0
                continue
            except ssl.SSLZeroReturnError:
                return got
            except ssl.SSLError as exc:
                raise tls_error(exc, "receive") from None
            if not n:
                return got
            got += n
        return got

    def shutdown(self, how: int) -> None:
        self.sock.shutdown(how)

    def close(self) -> None:
        self.sock.close()


def wrap_tls(
    sock: socket.socket,
    context: ssl.SSLContext,
    *,
    server_side: bool,
    server_hostname: str | None = None,
    deadline: float | None = None,
) -> TlsStream:
    """Run the TLS handshake on a connected socket by ``deadline``; return the connection."""
    tls = TlsStream(sock, context, server_side=server_side, server_hostname=server_hostname)
    try:
        tls.handshake(deadline)
    except BaseException:
        sock.close()
        raise
    return tls


def sendmsg_all(sock: socket.socket, buffers: list, deadline: float | None = None) -> None:
    """Send every byte of ``buffers`` with as few ``sendmsg`` calls as the kernel allows."""
    if isinstance(sock, TlsStream):
        sock.send_all(buffers, deadline)
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
        self._tls = sock if isinstance(sock, TlsStream) else None

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

    def _read_tls(self, tls: TlsStream, deadline: float | None) -> Message:
        stream = self.stream
        while True:
            event = stream.next_event()
            if event is not NEED_DATA:
                return event  # type: ignore[return-value]
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
