"""Typed options of hubs and channels: what ``serve`` / ``connect`` keywords become.

Each transport names its options type on its classes (``options_type``); one with options of
its own subclasses :class:`HubOptions` / :class:`ChannelOptions`. ``from_kwargs`` takes the
keywords of ``serve`` / ``connect`` (today's names: ``tls=``, ``auth=``, ``key=``,
``timeout=`` ...), parses them once, and names any keyword the transport does not take.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any, ClassVar, Self

from tensorwire.transports.base.membership import MembershipEvent
from tensorwire.transports.security import (
    TLS,
    Keys,
    credentials_from_dir,
    load_secret,
    split_security_options,
)
from tensorwire.transports.session import Authenticate
from tensorwire.wire import Limits

FANOUTS = ("concurrent", "sequential")


@dataclass(frozen=True, kw_only=True)
class Timeouts:
    """What a transport waits for, in seconds."""

    connect: float = 30.0
    """How long a channel keeps dialling its hub (and a broker hub its broker) before
    :class:`~tensorwire.TransportTimeout`."""
    call: float | None = None
    """The wait of a call given no ``timeout=`` (``recv``, ``send``, ``gather`` ...); None:
    until it happens."""


@dataclass(frozen=True, kw_only=True)
class Credentials:
    """Who an endpoint is and whom it admits, parsed once from arguments, URL options
    (:meth:`from_url`) or a directory ``tensorwire certs`` wrote (:meth:`from_dir`)."""

    tls: TLS | None = None
    secret: bytes | None = None
    """A channel's enrolled secret, proven in every hello."""
    keys: Keys | None = None
    """A hub's enrolled devices and their secrets."""
    authenticate: Authenticate | None = None
    """A hub's own credential check, instead of the one ``keys`` and ``tls`` make."""

    @classmethod
    def of(
        cls,
        *,
        tls: TLS | None = None,
        key: Any = None,
        auth: Keys | Mapping[str, Any] | str | os.PathLike[str] | None = None,
        authenticate: Authenticate | None = None,
    ) -> Credentials:
        """From ``serve`` / ``connect``'s keywords: ``key`` a secret (bytes, hex, or a file of
        hex), ``auth`` keys (a :class:`Keys`, a mapping, or a keys.json path)."""
        if auth is None or isinstance(auth, Keys):
            keys = auth
        else:
            keys = Keys(auth) if isinstance(auth, Mapping) else Keys.load(os.fspath(auth))
        secret = None if key is None else load_secret(key)
        return cls(tls=tls, secret=secret, keys=keys, authenticate=authenticate)

    @classmethod
    def from_url(cls, url: str, role: str) -> tuple[str, Credentials]:
        """The URL without its security options (``?ca=&cert=&certkey=&secret=&keys=``), and
        the credentials they name, for a ``hub`` or a ``channel``."""
        rest, kwargs = split_security_options(url, role)
        return rest, cls.of(**kwargs)

    @classmethod
    def from_dir(
        cls, directory: str | os.PathLike[str], role: str, client_id: str | None = None
    ) -> Credentials:
        """The files ``tensorwire certs`` wrote into ``directory``: mutual TLS with its CA,
        and the enrolled keys (``hub``) or the device's secret (``channel``, for
        ``client_id``)."""
        return cls.of(**credentials_from_dir(directory, role, client_id))


def _merged(credentials: Credentials, from_url: Credentials) -> Credentials:
    """``credentials`` with what the URL named beside them; ``TypeError`` if both name one."""
    merged: dict[str, Any] = {}
    for f in fields(Credentials):
        mine, url_one = getattr(credentials, f.name), getattr(from_url, f.name)
        if mine is not None and url_one is not None:
            raise TypeError(f"{f.name} is given both in the URL and as a keyword: give it once")
        merged[f.name] = url_one if mine is None else mine
    return Credentials(**merged)


def _typed_values(
    kwargs: Mapping[str, Any], url_credentials: Credentials, credential_names: tuple[str, ...]
) -> dict[str, Any]:
    """``kwargs`` with the credential keywords (``tls=``, ``auth=``, ``key=``, the URL's) made
    one :class:`Credentials`, and ``timeout=`` a :class:`Timeouts`."""
    kw = dict(kwargs)
    given = {name: kw.pop(name) for name in credential_names if name in kw}
    if given and "credentials" in kw:
        raise TypeError(f"give credentials= or {', '.join(given)}=, not both")
    credentials = kw.pop("credentials", None)
    if credentials is None:
        credentials = Credentials.of(**given)
    kw["credentials"] = _merged(credentials, url_credentials)
    if "timeout" in kw:
        if "timeouts" in kw:
            raise TypeError("give timeouts= or timeout=, not both")
        kw["timeouts"] = Timeouts(connect=kw.pop("timeout"))
    return kw


@dataclass(frozen=True, kw_only=True)
class EndpointOptions:
    """What every hub and channel takes."""

    codec: Any = "auto"
    """``None`` (raw), ``"auto"``, a codec id, or a codec chain: see ``serve``."""
    checksum: bool = True
    """Per-tensor xxh3-64 checksums on what this endpoint sends."""
    limits: Limits = Limits()
    """What this endpoint accepts: message and header sizes, tensors per message."""
    timeouts: Timeouts = Timeouts()
    credentials: Credentials = field(default_factory=Credentials)

    _credential_names: ClassVar[tuple[str, ...]] = ("tls",)

    @classmethod
    def from_kwargs(
        cls, kwargs: Mapping[str, Any], url_credentials: Credentials | None = None
    ) -> Self:
        """Options from ``serve`` / ``connect`` keywords (``options=`` a ready value), with
        the credentials the URL named; ``TypeError`` names a keyword this transport does not
        take and lists the ones it does."""
        if "options" in kwargs:
            options = kwargs["options"]
            if len(kwargs) > 1 or not isinstance(options, cls):
                raise TypeError(f"options= takes a {cls.__name__}, with no other keywords")
            from_url = url_credentials or Credentials()
            return replace(options, credentials=_merged(options.credentials, from_url))
        kw = _typed_values(kwargs, url_credentials or Credentials(), cls._credential_names)
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(kw) - known)
        if unknown:
            takes = sorted((known - {"credentials", "timeouts"}) | {*cls._credential_names})
            raise TypeError(
                f"unknown option(s) {', '.join(unknown)}; {cls.__name__} takes "
                f"{', '.join(takes)}, timeout or timeouts, credentials"
            )
        return cls(**kw)


@dataclass(frozen=True, kw_only=True)
class HubOptions(EndpointOptions):
    """What every hub takes (``serve``'s keywords)."""

    on_join: Callable[[str], None] | None = None
    """Called with a client's id when it joins (from a transport thread)."""
    on_leave: Callable[[str, str], None] | None = None
    """Called with a client's id and why when it leaves."""
    on_event: Callable[[MembershipEvent], None] | None = None
    """Called with every membership event."""
    fanout: str = "concurrent"
    """How ``broadcast`` reaches clients: ``concurrent`` or ``sequential``."""

    _credential_names: ClassVar[tuple[str, ...]] = ("tls", "auth", "authenticate")

    def __post_init__(self) -> None:
        if self.fanout not in FANOUTS:
            raise ValueError(f"fanout must be one of {FANOUTS}, not {self.fanout!r}")


@dataclass(frozen=True, kw_only=True)
class ChannelOptions(EndpointOptions):
    """What every channel takes (``connect``'s keywords)."""

    client_id: str | None = None
    """This client's id (default: ``host-pid-random``)."""

    _credential_names: ClassVar[tuple[str, ...]] = ("tls", "key")
