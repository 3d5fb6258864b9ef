"""A secured stream over a connected, blocking TCP socket: a TLS 1.3 handshake, then sealed
records.

The TLS 1.3 handshake (``ssl``, through memory BIOs) authenticates the hub and, with mutual
TLS, the device; inside that TLS connection each side sends 32 random bytes, and from then on
the stream travels in tensorwire records sealed with AES-128-OCB3 under keys derived from both
(HKDF-SHA256, one key per direction), up to 1 MiB of plaintext per record. Why not TLS records
all the way: they hold at most 16 KiB, and Python's ``ssl`` decrypts them one call at a time
with the system's OpenSSL (here 1.6 GB/s); a 1 MiB OCB3 record decrypts in place at 7 GB/s,
which keeps a secured bulk transfer near the plain one. ``docs/transports/tcp.md`` specifies
the records.
"""

from __future__ import annotations

import contextlib
import functools
import os
import select
import socket
import ssl
import struct
import threading
from collections.abc import Iterable, Iterator
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESOCB3
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from tensorwire.errors import AuthenticationError, PeerGone, TransportError, TransportTimeout
from tensorwire.transports.sockets.sendmsg import sendmsg_all
from tensorwire.transports.sockets.waiting import wait_ready

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


def record_pieces(buffers: Iterable[Any], small_below: int = _READ_AHEAD) -> Iterator[Any]:
    """The plaintext of each record that carries ``buffers``, in order, none empty: pieces
    under ``small_below`` bytes share a record (up to RECORD_BYTES), larger ones are cut into
    RECORD_BYTES slices of the caller's memory (no copy)."""
    small: list[memoryview] = []
    small_bytes = 0
    for buf in buffers:
        view = memoryview(buf).cast("B")
        if not len(view):
            continue
        if len(view) < small_below and small_bytes + len(view) <= RECORD_BYTES:
            small.append(view)
            small_bytes += len(view)
            continue
        if small:
            yield small[0] if len(small) == 1 else b"".join(small)
            small, small_bytes = [], 0
        if len(view) < small_below:
            small, small_bytes = [view], len(view)
            continue
        for start in range(0, len(view), RECORD_BYTES):
            yield view[start : start + RECORD_BYTES]
    if small:
        yield small[0] if len(small) == 1 else b"".join(small)


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

    def getpeercert(self, binary_form: bool = False) -> Any:
        """The peer's certificate: as ``ssl`` gives it, or DER bytes (even one not verified)."""
        return self._obj.getpeercert(binary_form)

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
            for plain in record_pieces(buffers):
                self._send_record(plain, deadline)

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
