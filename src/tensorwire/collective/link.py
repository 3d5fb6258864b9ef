"""Securing a group's links: the same TLS 1.3 handshake and sealed records as ``tcp://``
hubs, and each rank proving which rank it is.

Without credentials a link is a plain TCP socket (the group's token keeps strangers out; the
traffic is in the clear). With them (:class:`~tensorwire.collective.GroupCredentials`) every
link is a :class:`~tensorwire.transports.sockets.TlsStream`: a TLS 1.3 handshake, then
AES-128-OCB3 records, so that nothing after the TCP handshake travels in clear. On it:

- with certificates, TLS is mutual: each side presents its ``rank-N`` certificate, checked
  against the CA, and its common name must be the rank the peer claims (dialler) or expects
  (listener);
- with link keys (a rendezvous gave them out, see :mod:`~tensorwire.collective.credentials`),
  the dialler's hello proves its pair's key the way a device proves its secret to a hub
  (:func:`~tensorwire.transports.security.hello_auth`: nonce, time, HMAC; a replayed nonce is
  refused) and the welcome proves it back. The proof's session is the group's token and the
  SHA-256 of the listener's certificate as the dialler saw it, so a proof relayed through a
  man in the middle (who must present a certificate of its own) does not verify. Without a
  certificate of its own, a rank listens with a throwaway self-signed one.

:class:`LinkSecurity` is what :class:`~tensorwire.collective.mesh.Mesh` calls at both ends;
the stream it returns stands in for the socket wherever the socket kit takes one
(``send_encoded``, ``StreamReader``, ``shutdown``).
"""

from __future__ import annotations

import hashlib
import socket
import ssl
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from tensorwire.collective import messages
from tensorwire.collective.credentials import GroupCredentials, rank_id
from tensorwire.errors import AuthenticationError
from tensorwire.transports.certs import _certificate, _key_pem
from tensorwire.transports.security import (
    KeyAuthenticator,
    Keys,
    check_welcome,
    hello_auth,
    peer_common_name,
)
from tensorwire.transports.session import PROTOCOL_VERSION, Hello
from tensorwire.transports.sockets import TlsStream, wrap_tls
from tensorwire.wire import EncodedMessage, Message

THROWAWAY_NAME = "tensorwire-rank"  # the subject of a listener's certificate made up at start


def _throwaway_context() -> tuple[ssl.SSLContext, bytes]:
    """A TLS 1.3 server context with a self-signed certificate made now, and its DER."""
    key = ec.generate_private_key(ec.SECP256R1())
    cert = _certificate(THROWAWAY_NAME, key, None, key)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    with tempfile.TemporaryDirectory() as d:  # ssl loads a key from a file only
        pem, pem_key = Path(d, "cert.pem"), Path(d, "key.pem")
        pem.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        pem_key.touch(0o600)
        pem_key.write_bytes(_key_pem(key))
        ctx.load_cert_chain(str(pem), str(pem_key))
    return ctx, cert.public_bytes(serialization.Encoding.DER)


def _unchecked_client_context() -> ssl.SSLContext:
    """TLS 1.3 to a listener whose certificate the link keys' proof checks, not a CA."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


def _binding(token: str, listener_der: bytes) -> str:
    """The session a link-key proof covers: the group and the listener's certificate."""
    return f"{token}|{hashlib.sha256(listener_der).hexdigest()}"


class LinkSecurity:
    """How rank ``rank``'s links are secured (see the module doc): plain when
    ``credentials`` is None; else TLS with certificates and/or ``link_keys`` (other rank ->
    the key the pair shares)."""

    def __init__(
        self,
        rank: int,
        token: str,
        credentials: GroupCredentials | None,
        link_keys: Mapping[int, bytes] | None = None,
    ) -> None:
        self.rank = rank
        self.sealed = credentials is not None
        self._token = token
        self._pairs = dict(link_keys or {})
        self._certified = False
        if credentials is None:
            return
        tls = credentials.tls
        cert = None if tls is None else tls.cert
        if cert is None and not self._pairs:
            raise AuthenticationError(
                f"{rank_id(rank)} has a secret but no certificate, and nothing gave this group "
                "link keys (only a rendezvous at a hub does; under MPI or torch's store give "
                "every rank its certificate)"
            )
        if tls is not None and cert is not None:
            if tls.ca is None:
                raise AuthenticationError(
                    "a rank's tls= needs the ca= that signed every rank's certificate too"
                )
            self._certified = True
            self._server = tls.server_context()  # mutual: it requires the dialler's certificate
            self._client = tls.client_context()
            self._client.check_hostname = False  # a rank's certificate names a rank, not a host
            own = x509.load_pem_x509_certificate(Path(cert).read_bytes())
            self._own_der = own.public_bytes(serialization.Encoding.DER)
        else:
            self._server, self._own_der = _throwaway_context()
            self._client = _unchecked_client_context()
        keys = Keys({rank_id(j): k for j, k in self._pairs.items()}) if self._pairs else None
        self._check = KeyAuthenticator(keys, require_tls_name=keys is None)

    def rekey(self, link_keys: Mapping[int, bytes]) -> None:
        """Take fresh link keys (other rank -> key) for the pairs they name: an elastic
        group's coordinator gives them out with a rank that rejoins."""
        if not self.sealed or not link_keys:
            return
        self._pairs.update(link_keys)
        self._check.keys = Keys({rank_id(j): k for j, k in self._pairs.items()})

    # -- the listener's side --------------------------------------------------------------

    def accept(self, conn: socket.socket, deadline: float) -> socket.socket:
        """``conn`` (accepted) secured by ``deadline``: the stream to read the hello from."""
        if not self.sealed:
            return conn
        stream = wrap_tls(conn, self._server, server_side=True, deadline=deadline)
        return cast(socket.socket, stream)  # the kit's functions take either

    def admit(self, hello: Message, peer: int, conn: socket.socket) -> dict[str, Any] | None:
        """Check that ``hello`` (on ``conn``, from :meth:`accept`) comes from rank ``peer``;
        return the welcome's proof. :class:`AuthenticationError` says why not."""
        if not self.sealed:
            return None
        who = Hello(
            client_id=rank_id(peer),
            decoders=frozenset(),
            version=PROTOCOL_VERSION,
            max_message_bytes=None,
            session=_binding(self._token, self._own_der),
            meta=hello.meta,
        )
        name = peer_common_name(conn) if self._certified else None
        auth, _ = self._check(who, name)
        return dict(auth) or None

    # -- the dialler's side ---------------------------------------------------------------

    def dialling(self, peer: int) -> Dialling:
        """One connection's handshake toward rank ``peer``."""
        return Dialling(self, peer)

    def _secure_dialled(self, sock: socket.socket, deadline: float) -> TlsStream:
        return wrap_tls(sock, self._client, server_side=False, deadline=deadline)


class Dialling:
    """The dialler's side of one link's handshake: :meth:`secure` the connection, send
    :meth:`hello`, :meth:`check` the welcome."""

    def __init__(self, security: LinkSecurity, peer: int) -> None:
        self._security = security
        self._peer = peer
        self._stream: TlsStream | None = None
        self._key = security._pairs.get(peer)
        self._nonce = b""
        self._session = ""

    def secure(self, sock: socket.socket, deadline: float) -> socket.socket:
        """``sock`` (connected) secured by ``deadline``."""
        if not self._security.sealed:
            return sock
        self._stream = self._security._secure_dialled(sock, deadline)
        return cast(socket.socket, self._stream)

    def hello(self) -> EncodedMessage:
        """The hello, with the proof of the link key when there is one."""
        rank, token = self._security.rank, self._security._token
        if self._stream is None or self._key is None:
            return messages.hello(rank, token)
        self._session = _binding(token, self._stream.getpeercert(binary_form=True))
        auth = hello_auth(self._key, rank_id(rank), self._session)
        self._nonce = auth["nonce"]
        return messages.hello(rank, token, auth)

    def check(self, welcome: Message) -> None:
        """:class:`AuthenticationError` unless the welcome comes from rank ``peer``."""
        if self._stream is None:
            return
        want = rank_id(self._peer)
        if self._security._certified:
            name = peer_common_name(self._stream)
            if name != want:
                raise AuthenticationError(f"its certificate is for {name!r}, not {want!r}")
        if self._key is not None:
            check_welcome(self._key, self._session, self._nonce, welcome.meta.get("auth"), want)
