"""QUIC's TLS 1.3 for tensorwire: what each end presents and checks.

Without credentials the hub presents a throwaway self-signed certificate the channel does not
check (traffic is encrypted; anyone may join). With ``tls=`` the channel checks the hub's
certificate; with a CA on the hub, every client must present a certificate that CA signed
whose common name is its client id (mutual TLS, as ``tcp`` ``tls=`` does).
"""

from __future__ import annotations

import ssl

from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.connection import QuicConnection
from aioquic.tls import verify_certificate
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from tensorwire.errors import AuthenticationError, TransportError
from tensorwire.transports.certs import _certificate
from tensorwire.transports.quic.compat import peer_certificate
from tensorwire.transports.quic.settings import QuicSettings
from tensorwire.transports.security import TLS

THROWAWAY_NAME = "tensorwire-hub"  # the subject of a hub's certificate made up at start


def hub_configuration(settings: QuicSettings, tls: TLS | None) -> QuicConfiguration:
    """A hub's configuration: its certificate from ``tls``, else a throwaway one."""
    config = settings.configuration(is_client=False)
    if tls is None:
        key = ec.generate_private_key(ec.SECP256R1())
        config.certificate = _certificate(THROWAWAY_NAME, key, None, key)
        config.private_key = key
        return config
    if tls.cert is None or tls.key is None:
        raise TransportError("a hub's TLS needs cert= and key= (tensorwire certs makes them)")
    config.load_cert_chain(str(tls.cert), str(tls.key))
    return config


def channel_configuration(settings: QuicSettings, tls: TLS | None, host: str) -> QuicConfiguration:
    """A channel's configuration for the hub at ``host``: checks the hub's certificate (and
    presents the channel's own) when ``tls`` is given, else trusts any."""
    config = settings.configuration(is_client=True)
    if tls is None:
        config.verify_mode = ssl.CERT_NONE  # the hub's throwaway certificate
        return config
    config.server_name = tls.server_name or host
    if tls.ca is not None:
        config.load_verify_locations(cafile=str(tls.ca))
    if tls.cert is not None:
        if tls.key is None:
            raise TransportError("a client certificate needs its key= too")
        config.load_cert_chain(str(tls.cert), str(tls.key))
    return config


def verify_client(conn: QuicConnection, ca: str) -> str:
    """The common name of the certificate the client of ``conn`` presented, checked against
    the CA in file ``ca``; AuthenticationError for none, or one that CA did not sign."""
    cert, chain = peer_certificate(conn)
    if cert is None:
        raise AuthenticationError("the client presented no certificate (mutual TLS)")
    try:
        verify_certificate(certificate=cert, chain=chain, cafile=ca)
    except Exception as exc:
        raise AuthenticationError(f"the client's certificate does not verify: {exc}") from None
    name = _common_name(cert)
    if name is None:
        raise AuthenticationError("the client's certificate carries no name")
    return name


def _common_name(cert: x509.Certificate) -> str | None:
    names = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    return str(names[0].value) if names else None
