"""gRPC's TLS for ``flight://``: the arguments a hub's server and a channel's client take,
the name on a caller's certificate, and telling a failed certificate from an absent hub."""

from __future__ import annotations

from typing import Any

import grpc
import grpc.aio

from tensorwire.errors import AuthenticationError, TransportError
from tensorwire.transports.security import TLS


def certificate_name(context: grpc.aio.ServicerContext) -> str | None:
    """The name on the caller's verified TLS certificate (gRPC's peer identity: its first
    subject alternative name if it has any, else its common name), or None without one."""
    name = next(iter(context.peer_identities() or ()), b"")
    return name.decode("utf-8", "replace") or None


def _pem(path: Any) -> bytes:
    """The bytes of a PEM file a :class:`TLS` names (gRPC takes them, not paths)."""
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as exc:
        raise TransportError(f"cannot read the TLS file {path}: {exc}") from None


def server_tls(tls: TLS) -> grpc.ServerCredentials:
    """gRPC's credentials for a hub with ``tls``: its certificate, and the CA whose client
    certificates it requires (mutual TLS) when ``tls.ca`` is set."""
    tls.server_context()  # no cert= or key=, or files ssl cannot load: said here, clearly
    ca = None if tls.ca is None else _pem(tls.ca)
    return grpc.ssl_server_credentials(
        [(_pem(tls.key), _pem(tls.cert))],
        root_certificates=ca,
        require_client_auth=ca is not None,
    )


def client_tls(tls: TLS) -> dict[str, Any]:
    """``FlightClient`` arguments for a channel with ``tls``: the CA that signs the hub's
    certificate (None: the system's), the name it must carry, this client's own certificate."""
    # gRPC would report a bad file only when it connects, as an unreachable hub, which the
    # channel retries until its timeout: ssl loads them once here and says what is wrong.
    tls.client_context()
    options: dict[str, Any] = {"override_hostname": tls.server_name}
    if tls.ca is not None:
        options["tls_root_certs"] = _pem(tls.ca)
    if tls.cert is not None and tls.key is not None:
        options["cert_chain"] = _pem(tls.cert)
        options["private_key"] = _pem(tls.key)
    return options


def unreachable(url: str, exc: Exception) -> TransportError:
    """What a channel raises when gRPC found no hub at ``url``: :class:`AuthenticationError`
    (final) when TLS failed on a certificate (the hub's does not verify, or it refused ours),
    else a ``TransportError`` worth retrying."""
    text = str(exc)
    # gRPC reports TLS failures only as text: "Ssl handshake failed ...: certificate verify
    # failed" (or "... signature failure", "... bad certificate"), "Peer name X is not in
    # peer certificate"
    if "is not in peer certificate" in text or (
        "handshake failed" in text and "certificate" in text
    ):
        return AuthenticationError(f"TLS with the hub at {url} failed on a certificate: {text}")
    return TransportError(f"no hub answers at {url}: {text}")
