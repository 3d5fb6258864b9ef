"""Transports, chosen by URL scheme; each one is imported on first use.

Like fsspec's registry: :mod:`tensorwire.transports.registry` maps a scheme to the dotted
paths of its hub and channel classes, the extra to install when their import fails, and
what the benchmarks and the CLI need to know of it. ``KNOWN_TRANSPORTS`` is that registry
seen as the scheme -> ``{"hub", "channel", "extra"}`` dict of earlier versions.
"""

from __future__ import annotations

from typing import Any

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


def _load(url: str, role: str) -> Any:
    scheme = url.split("://", 1)[0] if "://" in url else ""
    entry = by_scheme(scheme)
    if entry is None:
        raise unknown_scheme(url)
    return entry.load("hub" if role == "hub" else "channel")


def serve(url: str, **options: Any) -> Hub:
    """Open a hub at ``url`` (e.g. ``tcp://127.0.0.1:5555``); the keywords are the fields of
    the transport's :class:`HubOptions` (``options=`` one ready-made).

    ``tls=tensorwire.TLS(...)`` and ``auth=tensorwire.Keys.load(...)`` (or the URL options
    ``?cert=&certkey=&ca=&keys=``) admit only enrolled clients and encrypt the traffic.
    ``fanout="sequential"`` makes :meth:`Hub.broadcast` reach one client after another.
    """
    cls = _load(url, "hub")
    url, from_url = Credentials.from_url(url, "hub")
    return cls(url, cls.options_type.from_kwargs(options, from_url))


def connect(url: str, **options: Any) -> Channel:
    """Open a channel to the hub at ``url``; the keywords are the fields of the transport's
    :class:`ChannelOptions` (``client_id=`` names this client; ``options=`` one ready-made).

    ``tls=tensorwire.TLS(ca=...)`` and ``key=`` (its enrolled secret), or the URL options
    ``?ca=&cert=&certkey=&secret=``, prove who it is and encrypt the traffic.
    """
    cls = _load(url, "channel")
    url, from_url = Credentials.from_url(url, "channel")
    return cls(url, cls.options_type.from_kwargs(options, from_url))


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
