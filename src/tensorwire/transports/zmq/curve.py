"""CURVE keys for ``zmq+tcp://``: the files ``tensorwire certs`` writes, and which one each
end reads (``curve=``, the URL's ``?curve=``, or beside the TLS files)."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import zmq
from zmq.utils import z85

from tensorwire.errors import TransportError
from tensorwire.transports.base import _log_limited
from tensorwire.transports.security import TLS, KeyAuthenticator
from tensorwire.transports.session import Authenticate
from tensorwire.transports.url import query_options

log = logging.getLogger("tensorwire.transports.zmq")

URL_OPTIONS = ("curve",)  # beside the security options serve/connect take out of every URL
CURVE_KEY_CHARS = 40  # a CURVE key (32 bytes) in Z85
KEY_FILE_BYTES = 1024  # read of a key file: two keys and their line ends fit many times
CURVE_HINT = (
    "connect with curve=FILE (the hub's public key: hub.curve.pub from tensorwire certs) or "
    "tls=TLS(ca=...) with hub.curve.pub beside the CA"
)


def _key_lines(path: Path, what: str) -> list[str]:
    """The non-empty lines of a key file. Errors name the file, never its contents."""
    try:
        with path.open("rb") as f:
            data = f.read(KEY_FILE_BYTES)
    except OSError as exc:
        raise TransportError(f"cannot read {what} from {path}: {exc.strerror}") from None
    try:
        text = data.decode("ascii")
    except UnicodeDecodeError:
        raise TransportError(f"{path} is not a CURVE key file (Z85 keys, one per line)") from None
    return [line.strip() for line in text.splitlines() if line.strip()]


def _z85_key(text: str, where: str) -> bytes:
    """``text`` as a Z85 CURVE key; ``TransportError`` naming ``where`` if it is not one."""
    key = text.encode()
    try:
        valid = len(key) == CURVE_KEY_CHARS and len(z85.decode(key)) == 32
    except (KeyError, ValueError):  # a character outside Z85's alphabet, a wrong length
        valid = False
    if not valid:
        raise TransportError(f"{where} is not a CURVE key ({CURVE_KEY_CHARS} Z85 characters)")
    return key


def one_curve_option(
    url: str, curve: str | os.PathLike[str] | None
) -> str | os.PathLike[str] | None:
    """The CURVE key file ``curve=`` names, as an argument or as the URL's ``?curve=`` (both
    only if they agree); ``TransportError`` for any other URL option."""
    option = query_options(url, URL_OPTIONS).get("curve")
    if option == "":
        raise TransportError(f"{url!r}: curve= names no file")
    if option is not None and curve is not None and Path(option) != Path(curve):
        raise TransportError(f"{url!r}: curve= in the URL and as an argument differ")
    return curve if curve is not None else option


def check_curve_available() -> None:
    if not zmq.has("curve"):
        raise TransportError(
            "this libzmq was built without CURVE, so zmq+tcp:// cannot encrypt: install a "
            "pyzmq wheel (it bundles libzmq with libsodium)"
        )


def hub_curve_keys(path: str | os.PathLike[str]) -> tuple[bytes, bytes]:
    """The hub's CURVE ``(public, secret)`` key pair (Z85) from a file as ``tensorwire certs``
    writes ``hub.curve``: the public key, then the secret key, one per line."""
    p = Path(path)
    lines = _key_lines(p, "the hub's CURVE key pair")
    if len(lines) < 2:
        raise TransportError(
            f"{p} holds no CURVE key pair: expected the public key, then the secret key, one "
            "per line (tensorwire certs writes hub.curve)"
        )
    public = _z85_key(lines[0], f"line 1 of {p}")
    secret = _z85_key(lines[1], f"line 2 of {p}")
    if zmq.curve_public(secret) != public:
        raise TransportError(f"{p}: the public key on line 1 is not that of the secret key")
    return public, secret


def hub_public_key(path: str | os.PathLike[str]) -> bytes:
    """The hub's CURVE public key (Z85): the first line of ``path`` (``hub.curve.pub``, or
    ``hub.curve``)."""
    p = Path(path)
    lines = _key_lines(p, "the hub's CURVE public key")
    if not lines:
        raise TransportError(f"{p} is empty: expected the hub's CURVE public key")
    return _z85_key(lines[0], f"line 1 of {p}")


def hub_curve_file(curve: str | os.PathLike[str] | None, tls: TLS | None) -> Path:
    """The file of the hub's CURVE key pair: ``curve``, else ``hub.curve`` beside the TLS
    certificate."""
    if curve is not None:
        return Path(curve)
    if tls is None or tls.cert is None:
        raise TransportError(
            "a zmq+tcp:// hub encrypts with CURVE: name its key pair with curve=FILE "
            "(tensorwire certs writes hub.curve), or give tls=TLS(cert=...) with hub.curve "
            "beside the certificate"
        )
    return Path(tls.cert).parent / "hub.curve"


def client_curve_file(curve: str | os.PathLike[str] | None, tls: TLS | None) -> Path:
    """The file whose first line is the hub's CURVE public key: ``curve``, else
    ``hub.curve.pub`` beside the TLS CA, else ``hub.curve`` there."""
    if curve is not None:
        return Path(curve)
    if tls is None or tls.ca is None:
        raise TransportError(
            "a zmq+tcp:// channel encrypts with CURVE and needs the hub's public key: "
            "curve=FILE (tensorwire certs writes hub.curve.pub), or tls=TLS(ca=...) with "
            "hub.curve.pub beside the CA"
        )
    directory = Path(tls.ca).parent
    public, pair = directory / "hub.curve.pub", directory / "hub.curve"
    if public.is_file() or not pair.is_file():
        return public
    # It works, but a device that holds hub.curve holds the hub's secret key too.
    _log_limited(
        f"zmq curve {pair}",
        f"zmq: reading the hub's public key from {pair}, which also holds the hub's SECRET "
        "key: give devices hub.curve.pub only (tensorwire certs writes it)",
    )
    return pair


def hub_keys(
    curve: str | os.PathLike[str] | None, tls: TLS | None, authenticate: Authenticate | None
) -> tuple[bytes, bytes]:
    """The hub's CURVE key pair, after checking that the credentials asked for can be checked."""
    check_curve_available()
    if tls is not None and tls.ca is not None:
        if authenticate is None or (
            isinstance(authenticate, KeyAuthenticator) and authenticate.keys is None
        ):
            raise TransportError(
                "zmq+tcp:// cannot check client certificates (CURVE has no X.509), so a "
                "hub with ca= and no enrolled keys would admit anyone: identify devices by "
                "their secrets with auth=keys.json (tensorwire certs writes it), or drop ca="
            )
        log.info(
            "zmq: client certificates are not checked over CURVE (ca= is unused): devices "
            "are identified by their enrolled secrets"
        )
    return hub_curve_keys(hub_curve_file(curve, tls))
