"""What udp:// secures with, when ``tls=`` is given: TLS 1.3 on the control connection, driven
by the I/O loop through memory BIOs, and an AEAD seal on every datagram under a key agreed on
it.

The control sockets are read by a non-blocking I/O loop that must never wait on one peer, so
the TLS connection here has no socket of its own (unlike ``sockets.TlsStream``, which
waits in ``poll``): the loop hands it the ciphertext it read, takes the plaintext out, and
queues the records :meth:`TlsPipe.encrypt` makes on the control writer, which sends them as
the socket drains. The hub runs the handshake in the loop the same way, so a slow or silent
peer costs it nothing but the handshake timeout.

Datagrams (``docs/transports/udp.md`` section 13)::

    seq u64 | chunk header (40 bytes) | AES-256-GCM(chunk payload) | tag (16 bytes)

The chunk header travels in clear and is authenticated with ``seq`` as associated data; the
nonce is the sender's direction label and ``seq``, a counter per session and direction, so a
nonce is never used twice under one key, and a datagram reflected back to its sender does
not verify. A receiver accepts each ``seq`` once (``security.ReplayWindow``).
"""

from __future__ import annotations

import hashlib
import hmac
import ssl
import struct
import threading
from typing import Any, cast

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from tensorwire.errors import AuthenticationError, PeerGone, SessionRefused, TransportError
from tensorwire.transports.security import ReplayWindow
from tensorwire.transports.sockets import tls_error
from tensorwire.wire import CHUNK_HEADER_SIZE

DATAGRAM_KEY_BYTES = 32
TAG_BYTES = 16
_SEQ = struct.Struct("<Q")
SEAL_OVERHEAD = _SEQ.size + TAG_BYTES
"""Bytes a seal adds to a datagram: its sequence number and the AEAD tag."""
_CLEAR = _SEQ.size + CHUNK_HEADER_SIZE  # the bytes of a sealed datagram that are not encrypted
_KEY_LABEL = b"tensorwire udp datagram key v1"
_FROM_HUB, _FROM_CLIENT = b"hub>", b"cli>"  # nonce prefixes: one key, two directions


def datagram_key(welcome_key: bytes, session_key: bytes | None) -> bytes:
    """The AEAD key of a session's datagrams: HMAC-SHA256 keyed with the random key the hub's
    welcome sent over TLS, over a label and the session key (when the hub has enrolled keys,
    so the datagrams are bound to the device's secret too)."""
    return hmac.new(welcome_key, _KEY_LABEL + (session_key or b""), hashlib.sha256).digest()


def check_sealed_mtu(mtu: int) -> None:
    """``TransportError`` if datagrams of ``mtu`` bytes have no room for a sealed chunk."""
    if mtu <= CHUNK_HEADER_SIZE + SEAL_OVERHEAD:
        raise TransportError(
            f"mtu={mtu} leaves no room for a sealed chunk: with tls= a datagram holds "
            f"{CHUNK_HEADER_SIZE + SEAL_OVERHEAD} bytes of header and tag, so mtu must be more"
        )


class DatagramSeal:
    """Seals the datagrams one side sends to its peer and opens those it receives.

    ``hub``: whether this side is the hub (it picks the direction labels). :meth:`seal` may
    be called from many threads; :meth:`open` only from the I/O thread (it reuses a buffer).
    """

    def __init__(self, key: bytes, *, hub: bool) -> None:
        self._aead = AESGCM(key)
        self._out, self._in = (_FROM_HUB, _FROM_CLIENT) if hub else (_FROM_CLIENT, _FROM_HUB)
        self._seq = 0
        self._seq_lock = threading.Lock()
        self._window = ReplayWindow()
        self._buf = bytearray(1 << 16)  # one opened datagram: its chunk header and payload

    def seal(self, parts: list[Any]) -> list[Any]:
        """The datagram for a chunk given as buffers (its 40-byte header first)."""
        with self._seq_lock:
            seq = self._seq
            self._seq += 1
        clear = _SEQ.pack(seq) + bytes(parts[0])
        payload = parts[1] if len(parts) == 2 else b"".join(parts[1:])
        return [clear, self._aead.encrypt(self._out + clear[: _SEQ.size], payload, clear)]

    def open(self, datagram: memoryview) -> memoryview:
        """The chunk a sealed datagram holds (a view of a buffer the next call reuses);
        :class:`AuthenticationError` if it is not one this session's peer sealed, or was
        accepted before."""
        if len(datagram) < _CLEAR + TAG_BYTES:
            raise AuthenticationError(f"a {len(datagram)}-byte datagram is too short to be sealed")
        seq = _SEQ.unpack_from(datagram)[0]
        n = len(datagram) - _CLEAR - TAG_BYTES
        out = memoryview(self._buf)
        try:
            self._aead.decrypt_into(
                self._in + datagram[: _SEQ.size],
                datagram[_CLEAR:],
                datagram[:_CLEAR],
                out[CHUNK_HEADER_SIZE : CHUNK_HEADER_SIZE + n],
            )
        except InvalidTag:
            raise AuthenticationError(
                "a datagram that does not verify (forged or altered)"
            ) from None
        # only after it verified: a forged sequence number must not move the window
        if not self._window.check_and_add(seq):
            raise AuthenticationError(f"a replayed datagram (sequence number {seq})")
        out[:CHUNK_HEADER_SIZE] = datagram[_SEQ.size : _CLEAR]
        return out[: CHUNK_HEADER_SIZE + n]


class TlsPipe:
    """A TLS 1.3 connection with no socket: ciphertext in (:meth:`receive`), plaintext out
    (:meth:`read_into`), plaintext in (:meth:`encrypt`) and the ciphertext to send
    (:meth:`encrypt`, :meth:`take_output`). Every call holds a lock, as OpenSSL allows one
    thread in a connection at a time (the I/O loop reads while senders write).

    Only the control writer takes ciphertext out, under its own lock, so records reach the
    wire in the order they were made.
    """

    def __init__(
        self, context: ssl.SSLContext, *, server_side: bool, server_hostname: str | None = None
    ) -> None:
        self._in = ssl.MemoryBIO()
        self._out = ssl.MemoryBIO()
        self._obj = context.wrap_bio(
            self._in, self._out, server_side=server_side, server_hostname=server_hostname
        )
        self._lock = threading.Lock()
        self.done = False  # the handshake completed
        self.opening = b""  # the first 4 bytes received: a peer not speaking TLS shows here

    def receive(self, data: Any) -> None:
        if len(self.opening) < 4:
            self.opening += bytes(data[: 4 - len(self.opening)])
        with self._lock:
            self._in.write(data)

    def handshake(self) -> bool:
        """Advance the handshake with what was received; True once it is complete. Its
        messages (and, on failure, the alert) wait in :meth:`take_output`. A refused
        certificate raises :class:`AuthenticationError`, any other failure
        :class:`SessionRefused` (the peer does not speak TLS, or not this version)."""
        try:
            with self._lock:
                self._obj.do_handshake()
        except ssl.SSLWantReadError:
            return False
        except ssl.SSLError as exc:
            err = tls_error(exc, "TLS handshake")
            if isinstance(err, AuthenticationError):
                raise err from None
            raise SessionRefused(f"TLS handshake failed: {exc}") from None
        self.done = True
        return True

    @property
    def buffered(self) -> int:
        """Bytes of ciphertext received that :meth:`read_into` has not decrypted yet."""
        with self._lock:
            return self._in.pending

    def read_into(self, buf: memoryview) -> int:
        """Decrypt into ``buf`` what has been received; 0 when there is nothing (more) yet.
        ``PeerGone`` when the peer closed TLS; a TLS failure raises as ``tls_error`` says."""
        try:
            with self._lock:
                return cast(int, self._obj.read(len(buf), buf))  # into a buffer: the count
        except ssl.SSLWantReadError:
            return 0
        except ssl.SSLZeroReturnError:
            raise PeerGone("the peer closed the TLS connection") from None
        except ssl.SSLError as exc:
            raise tls_error(exc, "receive") from None

    def encrypt(self, data: Any) -> bytes:
        """The records that carry ``data``, after anything else waiting to be sent."""
        try:
            with self._lock:
                self._obj.write(data)
                return self._out.read()
        except ssl.SSLError as exc:
            raise tls_error(exc, "send") from None

    def take_output(self) -> bytes:
        """Ciphertext waiting to be sent (handshake messages, an alert); b"" if none."""
        with self._lock:
            return self._out.read()

    def getpeercert(self) -> Any:
        """The peer's verified certificate (as ``ssl`` gives it), for ``peer_common_name``."""
        with self._lock:
            return self._obj.getpeercert()
