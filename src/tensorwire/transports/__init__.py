"""Transports, chosen by URL scheme; each one is imported on first use.

Like fsspec's registry: :mod:`tensorwire.transports.registry` maps a scheme to the dotted
paths of its hub and channel classes, the extra to install when their import fails, and
what the benchmarks and the CLI need to know of it. ``KNOWN_TRANSPORTS`` is that registry
seen as the scheme -> ``{"hub", "channel", "extra"}`` dict of earlier versions.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from tensorwire.transports.base import (
    FANOUTS,
    BroadcastResult,
    Channel,
    ChannelOptions,
    Credentials,
    Hub,
    HubOptions,
    MembershipEvent,
    Timeouts,
    TransferRecord,
    default_client_id,
)
from tensorwire.transports.local import local_hub_url
from tensorwire.transports.registry import (
    KNOWN_TRANSPORTS,
    BrokerKind,
    TransportEntry,
    by_scheme,
    get_transport,
    register_transport,
    transports,
    unknown_scheme,
    unregister_transport,
)

if TYPE_CHECKING:
    from tensorwire.transports.security import TLS, Keys
    from tensorwire.wire import Limits


def _load(url: str, role: str) -> Any:
    scheme = url.split("://", 1)[0] if "://" in url else ""
    entry = by_scheme(scheme)
    if entry is None:
        raise unknown_scheme(url)
    return entry.load("hub" if role == "hub" else "channel")


def _given(options: dict[str, Any], **named: tuple[Any, Any]) -> dict[str, Any]:
    """``options`` with each named keyword whose value is not its default (``name=(value,
    default)``), so that ``options=`` a ready value still goes alone."""
    return options | {
        k: value
        for k, (value, default) in named.items()
        if not (value is default or (isinstance(value, str) and value == default))
    }


def serve(
    url: str,
    *,
    codec: Any = "auto",
    checksum: bool = True,
    limits: Limits | None = None,
    timeout: float | None = None,
    tls: TLS | None = None,
    auth: Keys | Mapping[str, Any] | str | os.PathLike[str] | None = None,
    on_join: Callable[[str], None] | None = None,
    on_leave: Callable[[str, str], None] | None = None,
    on_event: Callable[[MembershipEvent], None] | None = None,
    fanout: str = "concurrent",
    **options: Any,
) -> Hub:
    """Open a hub at ``url`` (e.g. ``tcp://127.0.0.1:5555``).

    :param codec: ``"auto"`` (weighs compression against the link), ``None`` (raw), a codec
        id such as ``"zstd"``, or a chain.
    :param checksum: per-tensor xxh3-64 digests on what the hub sends.
    :param limits: what the hub accepts (message and header sizes, tensors per message).
    :param timeout: seconds a broker hub keeps dialling its broker (``timeouts=`` a
        :class:`Timeouts` sets that and the default wait of calls).
    :param tls: certificates (``tensorwire.TLS(cert=, key=, ca=)``); with ``auth`` (the
        enrolled keys, ``tensorwire.Keys.load(...)``) only enrolled clients get in, and all
        traffic is encrypted. The URL options ``?cert=&certkey=&ca=&keys=`` do the same.
    :param on_join: called with a client's id when it joins (from a transport thread).
    :param on_leave: called with a client's id and why, when it leaves.
    :param on_event: called with every membership event.
    :param fanout: ``"concurrent"`` (every client at once) or ``"sequential"`` (one after
        another) for :meth:`Hub.broadcast`.
    :param options: the transport's own (its page under Transports lists them), or
        ``options=`` a ready-made :class:`HubOptions`; an unknown one is a ``TypeError``
        that lists what the transport takes.
    """
    cls = _load(url, "hub")
    url, from_url = Credentials.from_url(url, "hub")
    kwargs = _given(
        options,
        codec=(codec, "auto"),
        checksum=(checksum, True),
        limits=(limits, None),
        timeout=(timeout, None),
        tls=(tls, None),
        auth=(auth, None),
        on_join=(on_join, None),
        on_leave=(on_leave, None),
        on_event=(on_event, None),
        fanout=(fanout, "concurrent"),
    )
    return cls(url, cls.options_type.from_kwargs(kwargs, from_url))


def connect(
    url: str,
    *,
    client_id: str | None = None,
    codec: Any = "auto",
    checksum: bool = True,
    limits: Limits | None = None,
    timeout: float | None = None,
    tls: TLS | None = None,
    key: Any = None,
    **options: Any,
) -> Channel:
    """Open a channel to the hub at ``url``.

    :param client_id: this client's id (default: ``host-pid-random``); a hub with enrolled
        keys admits it only with its own ``key``.
    :param codec: as for :func:`serve`.
    :param checksum: per-tensor xxh3-64 digests on what the channel sends.
    :param limits: what the channel accepts.
    :param timeout: seconds to go on trying to reach the hub (it may not be up yet;
        ``timeouts=`` a :class:`Timeouts` sets that and the default wait of calls).
    :param tls: ``tensorwire.TLS(ca=...)`` (with ``cert``/``key`` for mutual TLS).
    :param key: the client's enrolled secret (bytes, hex, or a file of hex). The URL options
        ``?ca=&cert=&certkey=&secret=`` do the same.
    :param options: the transport's own, or ``options=`` a ready-made
        :class:`ChannelOptions`.
    """
    cls = _load(url, "channel")
    url, from_url = Credentials.from_url(url, "channel")
    kwargs = _given(
        options,
        client_id=(client_id, None),
        codec=(codec, "auto"),
        checksum=(checksum, True),
        limits=(limits, None),
        timeout=(timeout, None),
        tls=(tls, None),
        key=(key, None),
    )
    return cls(url, cls.options_type.from_kwargs(kwargs, from_url))


__all__ = [
    "FANOUTS",
    "KNOWN_TRANSPORTS",
    "BroadcastResult",
    "BrokerKind",
    "Channel",
    "ChannelOptions",
    "Credentials",
    "Hub",
    "HubOptions",
    "MembershipEvent",
    "Timeouts",
    "TransferRecord",
    "TransportEntry",
    "connect",
    "default_client_id",
    "get_transport",
    "local_hub_url",
    "register_transport",
    "serve",
    "transports",
    "unregister_transport",
]
