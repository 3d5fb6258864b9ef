"""Who a rank is: its credentials, and the link keys the rendezvous gives out with them.

A rank is enrolled like a device, as client id ``rank-N`` (``tensorwire certs --clients
rank-0,rank-1,...``): a certificate whose common name is ``rank-N`` (mutual TLS, to the
rendezvous hub and on every link), and/or a secret. The rendezvous hub knows every rank's
secret (its ``keys.json``); once all ranks have come, it makes a fresh random key for every
pair of ranks and sends each rank its keys sealed under its own secret (AES-256-GCM, key
HKDF-SHA256 of the secret, bound to the rank and the group's token), so only that rank can
open them, whatever the hub's transport. Two ranks then prove to each other on their link
that they hold their pair's key: a peer that does is the rank it claims to be.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from tensorwire.errors import AuthenticationError
from tensorwire.transports.base.options import Credentials
from tensorwire.transports.security import TLS, Keys, load_secret

LINK_KEY_BYTES = 32
_NONCE_BYTES = 12
_LABEL = b"tensorwire group link keys v1"


def rank_id(rank: int) -> str:
    """The client id rank ``rank`` is enrolled as."""
    return f"rank-{rank}"


@dataclass(frozen=True)
class GroupCredentials:
    """What a rank proves itself with (see the module doc).

    - ``tls``: this rank's certificate (common name ``rank-N``) and key, and the CA that
      signed every rank's: mutual TLS to the rendezvous hub and on every link.
    - ``secret``: this rank's enrolled secret: proven to the hub, and it opens the rank's
      link keys.
    - ``hub``: the rendezvous hub's own (its certificate, with the CA for mutual TLS, and the
      enrolment ``keys``), for the rank that serves it.

    :meth:`from_dir` reads the files ``tensorwire certs`` wrote; a directory given as a
    group's ``credentials=`` is read so, for the rank joining.
    """

    tls: TLS | None = None
    secret: bytes | None = field(default=None, repr=False)
    hub: Credentials | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.tls is None and self.secret is None:
            raise AuthenticationError(
                "a rank's credentials need a certificate (tls=), a secret, or both"
            )

    @classmethod
    def from_dir(cls, directory: str | os.PathLike[str], rank: int) -> GroupCredentials:
        """Rank ``rank``'s files in ``directory``: ``rank-N.pem`` / ``.key`` with ``ca.pem``,
        ``rank-N.secret``, and the hub's (``hub.pem``, ``hub.key``, ``keys.json``) if there."""
        d = Path(directory)
        name = rank_id(rank)
        cert, key, ca, secret = (
            d / f"{name}.pem",
            d / f"{name}.key",
            d / "ca.pem",
            d / f"{name}.secret",
        )
        certified = cert.is_file() and key.is_file() and ca.is_file()
        if certified:
            tls: TLS | None = TLS(cert=cert, key=key, ca=ca)
        elif ca.is_file():
            tls = TLS(ca=ca)  # to check the hub's certificate: links prove the secret instead
        else:
            tls = None
        if not certified and not secret.is_file():
            raise AuthenticationError(
                f"{d} has no credentials for {name}: make them with "
                f"`tensorwire certs --out {d} --clients {name},...`"
            )
        hub = _hub_from_dir(d) if (d / "hub.pem").is_file() else None
        return cls(tls=tls, secret=load_secret(secret) if secret.is_file() else None, hub=hub)

    def channel(self) -> Credentials:
        """This rank's credentials as a client of the rendezvous hub."""
        return Credentials(tls=self.tls, secret=self.secret)


def rank_credentials(credentials: Any, rank: int) -> GroupCredentials | None:
    """``credentials`` (a :class:`GroupCredentials`, a ``tensorwire certs`` directory, or
    None) for rank ``rank``."""
    if credentials is None or isinstance(credentials, GroupCredentials):
        return credentials
    if isinstance(credentials, str | os.PathLike):
        return GroupCredentials.from_dir(credentials, rank)
    raise TypeError(
        f"credentials= takes a GroupCredentials or a directory `tensorwire certs` wrote, "
        f"not {type(credentials).__name__}"
    )


def hub_credentials(credentials: Any) -> Credentials | None:
    """The rendezvous hub's credentials from ``credentials`` (a transports
    :class:`~tensorwire.transports.base.options.Credentials`, a :class:`GroupCredentials`
    with ``hub``, or a ``tensorwire certs`` directory)."""
    if credentials is None or isinstance(credentials, Credentials):
        return credentials
    if isinstance(credentials, str | os.PathLike):
        return _hub_from_dir(Path(credentials))
    if isinstance(credentials, GroupCredentials):
        if credentials.hub is None:
            raise AuthenticationError(
                "the rank that serves the rendezvous needs the hub's credentials too "
                "(GroupCredentials(hub=...), or hub.pem, hub.key and keys.json beside its own)"
            )
        return credentials.hub
    raise TypeError(f"credentials= cannot be a {type(credentials).__name__}")


def _hub_from_dir(d: Path) -> Credentials:
    """The rendezvous hub's credentials in ``d``: its certificate (mutual TLS when the ranks
    have certificates there too), and ``keys.json`` when there."""
    certified = any(d.glob("rank-*.pem"))
    ca = d / "ca.pem"
    tls = TLS(cert=d / "hub.pem", key=d / "hub.key", ca=ca if certified and ca.is_file() else None)
    keys = Keys.load(d / "keys.json") if (d / "keys.json").is_file() else None
    if keys is None and tls.ca is None:
        raise AuthenticationError(f"{d} enrols no rank: neither keys.json nor rank certificates")
    return Credentials(tls=tls, keys=keys)


# --- link keys -----------------------------------------------------------------------------


def _sealing_key(secret: bytes, rank: int, token: str) -> AESGCM:
    info = _LABEL + b"|" + rank_id(rank).encode() + b"|" + token.encode()
    key = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=info).derive(secret)
    return AESGCM(key)


def make_link_keys(size: int) -> list[list[bytes]]:
    """A fresh random key for every pair of ranks: ``keys[i][j] == keys[j][i]`` (and
    ``keys[i][i]`` empty)."""
    keys = [[b""] * size for _ in range(size)]
    for i in range(size):
        for j in range(i + 1, size):
            keys[i][j] = keys[j][i] = os.urandom(LINK_KEY_BYTES)
    return keys


def seal_link_keys(secret: bytes, rank: int, token: str, mine: list[bytes]) -> bytes:
    """Rank ``rank``'s link keys (``mine[j]``: its key with rank ``j``) sealed under its
    secret, for the rendezvous's answer."""
    plain = b"".join(k or bytes(LINK_KEY_BYTES) for k in mine)
    nonce = os.urandom(_NONCE_BYTES)
    return nonce + _sealing_key(secret, rank, token).encrypt(nonce, plain, None)


def open_link_keys(
    secret: bytes, rank: int, token: str, sealed: Any, size: int
) -> dict[int, bytes]:
    """The link keys the rendezvous sealed for rank ``rank``: other rank -> key."""
    if not isinstance(sealed, bytes) or len(sealed) <= _NONCE_BYTES:
        raise AuthenticationError("the rendezvous sent no link keys for this rank")
    try:
        plain = _sealing_key(secret, rank, token).decrypt(
            sealed[:_NONCE_BYTES], sealed[_NONCE_BYTES:], None
        )
    except InvalidTag:
        raise AuthenticationError(
            f"the rendezvous's link keys for {rank_id(rank)} do not open with its secret "
            "(a rendezvous that does not know it)"
        ) from None
    if len(plain) != size * LINK_KEY_BYTES:
        raise AuthenticationError(
            f"the rendezvous sent {len(plain)} bytes of link keys for {size} ranks"
        )
    n = LINK_KEY_BYTES
    return {j: plain[j * n : (j + 1) * n] for j in range(size) if j != rank}
