"""Sealed records for an authenticated ``ucx://`` session: UCX encrypts nothing, so with
credentials the bytes after the welcome travel in the tcp transport's AEAD records.

Each side derives one AES-128-OCB3 key per direction from the session key (HKDF-SHA256, the
labels of ``tcp://``'s records), so only the enrolled device and its hub can read or make
them; a record is ``length u32 | ciphertext | tag (16 bytes)``, at most 1 MiB of plaintext,
its nonce the direction's record counter, so a record replayed, reordered, reflected or
altered fails authentication and ends the connection (``docs/transports/ucx.md``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from cryptography.exceptions import InvalidTag

from tensorwire.errors import PeerGone
from tensorwire.transports.sockets.tls_stream import (
    _NONCE,
    _RECORD_HEAD,
    _TAG,
    RECORD_BYTES,
    _record_key,
    record_pieces,
)

HEAD_BYTES = _RECORD_HEAD.size


class Records:
    """Seals what one side sends and opens what it receives, under a session key."""

    def __init__(self, session_key: bytes, *, hub: bool) -> None:
        self._seal = _record_key(session_key, hub_to_client=hub)
        self._open = _record_key(session_key, hub_to_client=not hub)
        self._sent = 0
        self._opened = 0
        self.head = bytearray(HEAD_BYTES)  # the next record's length, as received
        self.sealed = bytearray(RECORD_BYTES + _TAG)
        self._plain = bytearray(RECORD_BYTES)

    def seal(self, buffers: Iterable[Any]) -> list[bytearray]:
        """The records that carry ``buffers`` (:func:`record_pieces`: small pieces share
        one, large ones are cut into 1 MiB records)."""
        return [self._record(plain) for plain in record_pieces(buffers)]

    def _record(self, plain: Any) -> bytearray:
        size = len(plain)
        out = bytearray(HEAD_BYTES + size + _TAG)
        head = _RECORD_HEAD.pack(size)
        out[:HEAD_BYTES] = head
        self._seal.encrypt_into(_NONCE.pack(self._sent), plain, head, memoryview(out)[HEAD_BYTES:])
        self._sent += 1
        return out

    def body_size(self) -> int:
        """The sealed size of the record whose :attr:`head` was received; :class:`PeerGone`
        if it declares more than a record may hold."""
        size = _RECORD_HEAD.unpack(self.head)[0]
        if not 0 < size <= RECORD_BYTES:
            raise PeerGone(
                f"the peer sent a record of {size} bytes (1 to {RECORD_BYTES} allowed): not a "
                "tensorwire ucx peer with this session's key, or the stream was tampered with"
            )
        return size + _TAG

    def open(self, sealed: memoryview) -> memoryview:
        """The plaintext of the record whose :attr:`head` and body (``sealed``) came;
        :class:`PeerGone` if it fails authentication. A view the next call reuses."""
        out = memoryview(self._plain)[: len(sealed) - _TAG]
        try:
            self._open.decrypt_into(_NONCE.pack(self._opened), sealed, bytes(self.head), out)
        except InvalidTag:
            raise PeerGone("a record failed authentication: forged, replayed or altered") from None
        self._opened += 1
        return out
