"""Moving encoded messages over a connected stream socket: scatter-gather out, recv_into in.

The socket stays in blocking mode, so one thread may read while another writes. A deadline
never changes the socket's flags (``settimeout`` would: it makes the shared file description
non-blocking, and the other thread's blocking call then fails with EAGAIN); a call with a
deadline tries once with ``MSG_DONTWAIT`` and waits in ``poll`` when the kernel is not ready.

A TLS connection is a :class:`TlsStream`: a TLS 1.3 handshake (``ssl``, through memory BIOs)
authenticates the hub and, with mutual TLS, the device; inside that TLS connection each side
sends 32 random bytes, and from then on the stream travels in tensorwire records sealed with
AES-128-OCB3 under keys derived from both (HKDF-SHA256, one key per direction), up to 1 MiB of
plaintext per record. Why not TLS records all the way: they hold at most 16 KiB, and Python's
``ssl`` decrypts them one call at a time with the system's OpenSSL (here 1.6 GB/s); a 1 MiB
OCB3 record decrypts in place at 7 GB/s, which keeps a secured bulk transfer near the plain
one. ``docs/transports/tcp.md`` specifies the records.
"""

from __future__ import annotations

import contextlib
import functools
import os
import select
import socket
import ssl
import struct
import sys
import threading
import time
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESOCB3
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from tensorwire.errors import AuthenticationError, PeerGone, TransportError, TransportTimeout
from tensorwire.wire import NEED_DATA, EncodedMessage, Message, MessageStream
from tensorwire.wire.encoder import SEGMENT_BYTES

IOV_MAX = os.sysconf("SC_IOV_MAX") if hasattr(os, "sysconf") else 1024
STAGING_BYTES = 64 << 10
"""Reads smaller than this go through a staging buffer; bigger ones land in place."""
WAKE_BYTES = 4096
"""Wake-up bytes a woken read takes in one ``recv``."""


_RCVTIMEO = sys.platform == "linux"  # where SO_RCVTIMEO takes a struct timeval of two longs
_TIMEVAL = struct.Struct("@ll")
RCVTIMEO_MIN_S = 0.05
"""Reads with less time left than this wait in ``poll`` (SO_RCVTIMEO counts in jiffies)."""


class ReadInterrupted(Exception):
    """:meth:`StreamReader.read_message` was woken through its ``wake`` socket."""


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


TLS_READ_BYTES = 64 << 10
"""Ciphertext read from the socket at once during the TLS handshake."""

RECORD_BYTES = 1 << 20
"""Most plaintext in one record; a record declaring more is refused before it is read."""
_RECORD_HEAD = struct.Struct(">I")
_TAG = 16
_NONCE = struct.Struct(">4xQ")  # 12 bytes: a per-direction record counter
_SHARE_BYTES = 32
_RECORDS_V1 = b"\x01"  # AES-128-OCB3 records, keys from HKDF-SHA256 over both shares
_LABELS = {
    True: b"tensorwire tcp records v1 hub>client",
    False: b"tensorwire tcp records v1 client>hub",
}
_READ_AHEAD = 64 << 10
"""How far past what it needs one ``recv`` may read: enough for a burst of small records,
little enough that a large record still lands in place."""


def tls_error(exc: ssl.SSLError, what: str) -> TransportError:
    """A TLS failure as the caller should see it: a refused certificate is an
    :class:`AuthenticationError` (final), anything else a lost connection."""
    text = str(exc).upper()
    if isinstance(exc, ssl.SSLCertVerificationError):
        return AuthenticationError(f"{what}: the peer's certificate does not verify: {exc}")
    if "CERTIFICATE" in text or "UNKNOWN_CA" in text:
        return AuthenticationError(f"{what}: the peer refused this side's certificate: {exc}")
    return PeerGone(f"{what}: TLS connection lost: {exc}")


def _record_key(shares: bytes, hub_to_client: bool) -> AESOCB3:
    key = HKDF(algorithm=hashes.SHA256(), length=16, salt=None, info=_LABELS[hub_to_client]).derive(
        shares
    )
    return AESOCB3(key)


class TlsStream:
    """A secured connection over a connected, blocking TCP socket (see the module doc): the
    TLS 1.3 handshake, then sealed records.

    Behaves as far as the transports need like a socket: :meth:`shutdown`, :meth:`close`,
    :meth:`getpeercert`; :func:`send_encoded` and :class:`StreamReader` take it. One thread
    may read while others send (sends are serialised).
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
        self._server_side = server_side
        self._in = ssl.MemoryBIO()
        self._out = ssl.MemoryBIO()
        self._obj = context.wrap_bio(
            self._in, self._out, server_side=server_side, server_hostname=server_hostname
        )
        self._hbuf = bytearray(TLS_READ_BYTES)
        # Records, once the keys are agreed: the sending side ...
        self._wire = threading.Lock()
        self._seal: AESOCB3 | None = None
        self._sent = 0
        self._sbuf = bytearray(_RECORD_HEAD.size + RECORD_BYTES + _TAG)
        # ... and the receiving side: ciphertext read ahead, plaintext not yet taken.
        self._open: AESOCB3 | None = None
        self._opened = 0
        self._cbuf = bytearray(_RECORD_HEAD.size + RECORD_BYTES + _TAG + _READ_AHEAD)
        self._cview = memoryview(self._cbuf)
        self._cs = self._ce = 0
        self._pbuf = bytearray(RECORD_BYTES)
        self._plain = memoryview(self._pbuf)[:0]

    # --- the TLS part: handshake and key agreement ---------------------------------------

    def handshake(self, deadline: float | None) -> None:
        """Run the TLS handshake and agree on the record keys by ``deadline``."""
        self._tls(self._obj.do_handshake, deadline, "TLS handshake")
        mine = _RECORDS_V1 + os.urandom(_SHARE_BYTES)
        self._tls(lambda: self._obj.write(mine), deadline, "TLS key agreement")
        theirs = b""
        while len(theirs) < len(mine):
            step = functools.partial(self._obj.read, len(mine) - len(theirs))
            got = self._tls(step, deadline, "TLS key agreement")
            if not got:
                raise PeerGone("the peer closed the connection during the TLS key agreement")
            theirs += got
        if theirs[:1] != _RECORDS_V1:
            raise TransportError(
                f"the peer speaks tcp record version {theirs[0]}, this side 1: "
                "upgrade the older one"
            )
        client, hub = (theirs, mine) if self._server_side else (mine, theirs)
        shares = client[1:] + hub[1:]
        self._seal = _record_key(shares, hub_to_client=self._server_side)
        self._open = _record_key(shares, hub_to_client=not self._server_side)
        # Ciphertext that came behind the peer's share (its first records) is ours to open.
        rest = self._in.read()
        self._cbuf[: len(rest)] = rest
        self._ce = len(rest)

    def _tls(self, step: Any, deadline: float | None, what: str) -> Any:
        """Run ``step`` on the SSL object, moving ciphertext both ways until it completes."""
        while True:
            try:
                result = step()
                self._flush(deadline)
                return result
            except ssl.SSLWantReadError:
                self._flush(deadline)
                n = self._recv(memoryview(self._hbuf), deadline, what)
                if not n:
                    raise PeerGone(f"the peer closed the connection during the {what}") from None
                self._in.write(memoryview(self._hbuf)[:n])
            except ssl.SSLZeroReturnError:
                raise PeerGone(f"the peer closed the connection during the {what}") from None
            except ssl.SSLError as exc:
                with contextlib.suppress(TransportError, OSError):
                    self._flush(deadline)  # the alert tells the peer why
                raise tls_error(exc, what) from None

    def getpeercert(self) -> Any:
        return self._obj.getpeercert()

    def _flush(self, deadline: float | None) -> None:
        data = self._out.read()
        if data:
            sendmsg_all(self.sock, [data], deadline)

    def _recv(self, dst: memoryview, deadline: float | None, what: str) -> int:
        """One ``recv_into`` (waiting for data until ``deadline``); 0 at the end of the stream."""
        flags = 0 if deadline is None else socket.MSG_DONTWAIT
        while True:
            try:
                return self.sock.recv_into(dst, 0, flags)
            except BlockingIOError:
                wait_ready(self.sock, select.POLLIN, deadline, what)
            except OSError as exc:
                raise PeerGone(f"connection lost: {exc}") from None

    # --- records -----------------------------------------------------------------------------

    def send_all(self, buffers: list, deadline: float | None) -> None:
        """Seal and send every byte of ``buffers``: small pieces share a record, large ones are
        sealed straight from the caller's memory, 1 MiB at a time."""
        with self._wire:
            small: list[memoryview] = []
            small_bytes = 0
            for buf in buffers:
                view = memoryview(buf).cast("B")
                if len(view) < _READ_AHEAD and small_bytes + len(view) <= RECORD_BYTES:
                    small.append(view)
                    small_bytes += len(view)
                    continue
                if small:
                    self._send_record(b"".join(small), deadline)
                    small, small_bytes = [], 0
                if len(view) < _READ_AHEAD:
                    small, small_bytes = [view], len(view)
                    continue
                for start in range(0, len(view), RECORD_BYTES):
                    self._send_record(view[start : start + RECORD_BYTES], deadline)
            if small:
                self._send_record(small[0] if len(small) == 1 else b"".join(small), deadline)

    def _send_record(self, plain: Any, deadline: float | None) -> None:
        assert self._seal is not None, "send before the TLS handshake"
        size = len(plain)
        if not size:
            return
        head = _RECORD_HEAD.pack(size)
        end = _RECORD_HEAD.size + size + _TAG
        out = memoryview(self._sbuf)
        out[: _RECORD_HEAD.size] = head
        self._seal.encrypt_into(_NONCE.pack(self._sent), plain, head, out[_RECORD_HEAD.size : end])
        self._sent += 1
        sendmsg_all(self.sock, [out[:end]], deadline)

    def read_into(self, dst: memoryview, deadline: float | None) -> int:
        """Open records into ``dst`` until it is full or nothing more has arrived (waiting
        for the first until ``deadline``); 0 at the end of the stream. A timeout keeps what
        was read: the next call resumes."""
        got = self._take_plain(dst)
        while got < len(dst):
            try:
                n = self._read_record(dst[got:], deadline, wait=not got)
            except TransportTimeout:
                if got:
                    return got  # the record in progress is kept for the next call
                raise
            if not n:
                break
            got += n
        return got

    def _take_plain(self, dst: memoryview) -> int:
        n = min(len(self._plain), len(dst))
        if n:
            dst[:n] = self._plain[:n]
            self._plain = self._plain[n:]
        return n

    def _read_record(self, dst: memoryview, deadline: float | None, *, wait: bool) -> int:
        """Open the next record into ``dst`` (the part that does not fit waits in
        ``_plain``); 0 at the end of the stream, or when ``wait`` is false and no whole header
        has arrived."""
        head = _RECORD_HEAD.size
        if self._ce - self._cs < head:
            if not wait:
                return 0
            if not self._fill(head, deadline):
                return 0
        size = _RECORD_HEAD.unpack_from(self._cbuf, self._cs)[0]
        if not 0 < size <= RECORD_BYTES:
            raise PeerGone(
                f"the peer sent a record of {size} bytes (1 to {RECORD_BYTES} allowed): "
                "not a tensorwire tcp peer, or the stream was tampered with"
            )
        need = size + _TAG
        have = self._ce - self._cs - head
        if len(dst) >= need and have < need:
            return self._read_record_in_place(dst, size, deadline)
        if have < need and not self._fill(head + need, deadline):
            raise PeerGone("peer closed the connection in the middle of a record")
        start = self._cs + head
        sealed = self._cview[start : start + need]
        aad = self._cview[self._cs : start]
        if len(dst) >= size:
            self._open_record(sealed, aad, dst[:size])
            self._cs = start + need
            return size
        self._open_record(sealed, aad, memoryview(self._pbuf)[:size])
        self._cs = start + need
        self._plain = memoryview(self._pbuf)[:size]
        return self._take_plain(dst)

    def _read_record_in_place(self, dst: memoryview, size: int, deadline: float | None) -> int:
        """Receive a record straight into ``dst`` and open it there (no staging copy)."""
        head, need = _RECORD_HEAD.size, size + _TAG
        aad = bytes(self._cview[self._cs : self._cs + head])
        have = self._ce - self._cs - head
        dst[:have] = self._cview[self._cs + head : self._ce]
        self._cs = self._ce = 0
        got = have
        try:
            while got < need:
                n = self._recv(dst[got:need], deadline, "receive")
                if not n:
                    raise PeerGone("peer closed the connection in the middle of a record")
                got += n
        except TransportTimeout:
            # Keep what came, so the next call resumes this record.
            self._cbuf[:head] = aad
            self._cbuf[head : head + got] = dst[:got]
            self._ce = head + got
            raise
        self._open_record(dst[:need], aad, dst[:size])
        return size

    def _open_record(self, sealed: memoryview, aad: Any, out: memoryview) -> None:
        assert self._open is not None, "receive before the TLS handshake"
        try:
            self._open.decrypt_into(_NONCE.pack(self._opened), sealed, aad, out)
        except InvalidTag:
            raise PeerGone("a record failed authentication: the stream was tampered with") from None
        self._opened += 1

    def _fill(self, want: int, deadline: float | None) -> bool:
        """Buffer at least ``want`` bytes of ciphertext; False at the end of the stream
        with nothing buffered."""
        if self._cs + want > len(self._cbuf):  # move the unread part to the front
            left = self._ce - self._cs
            self._cbuf[:left] = self._cview[self._cs : self._ce]
            self._cs, self._ce = 0, left
        while self._ce - self._cs < want:
            room = min(len(self._cbuf), self._cs + want + _READ_AHEAD)
            n = self._recv(self._cview[self._ce : room], deadline, "receive")
            if not n:
                if self._ce > self._cs:
                    raise PeerGone("peer closed the connection in the middle of a record")
                return False
            self._ce += n
        return True

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
    """Run the TLS handshake and key agreement on a connected socket by ``deadline``; return
    the connection."""
    tls = TlsStream(sock, context, server_side=server_side, server_hostname=server_hostname)
    try:
        tls.handshake(deadline)
    except BaseException:
        sock.close()
        raise
    return tls


def sendmsg_all(
    sock: socket.socket, buffers: list, deadline: float | None = None, total: int | None = None
) -> None:
    """Send every byte of ``buffers`` (``total`` bytes, when the caller knows) with as few
    ``sendmsg`` calls as the kernel allows."""
    if isinstance(sock, TlsStream):
        sock.send_all(buffers, deadline)
        return
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


def send_encoded(sock: socket.socket, enc: EncodedMessage, deadline: float | None = None) -> None:
    """Send a whole encoded message (hashing each piece just before it goes)."""
    if enc.nbytes <= SEGMENT_BYTES:  # one batch: no segmenting to do
        sendmsg_all(sock, enc.frames(), deadline, enc.nbytes)
        return
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
                with contextlib.suppress(BlockingIOError):
                    while wake.recv(WAKE_BYTES):
                        pass
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
                poller = self._pollers[wake.fileno()] = select.poll()
                poller.register(self.sock, select.POLLIN)
                poller.register(wake, select.POLLIN)
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
