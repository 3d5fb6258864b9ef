"""Transports, chosen by URL scheme; each one is imported on first use.

Like fsspec's registry: :mod:`tensorwire.transports.registry` maps a scheme to the dotted
paths of its hub and channel classes, the extra to install when their import fails, and
what the benchmarks and the CLI need to know of it. ``KNOWN_TRANSPORTS`` is that registry
seen as the scheme -> ``{"hub", "channel", "extra"}`` dict of earlier versions.
"""

from __future__ import annotations

from typing import Any

from tensorwire.transports.base import (
    BroadcastResult,
    Channel,
    Hub,
    MembershipEvent,
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
from tensorwire.transports.security import credentials_from_dir, split_security_options


def _load(url: str, role: str) -> Any:
    scheme = url.split("://", 1)[0] if "://" in url else ""
    entry = by_scheme(scheme)
    if entry is None:
        raise unknown_scheme(url)
    return entry.load("hub" if role == "hub" else "channel")


FANOUTS = ("concurrent", "sequential")


def serve(url: str, **options: Any) -> Hub:
    """Open a hub at ``url`` (e.g. ``tcp://127.0.0.1:5555``); options go to the transport.

    ``tls=tensorwire.TLS(...)`` and ``auth=tensorwire.Keys.load(...)`` (or the URL options
    ``?cert=&certkey=&ca=&keys=``) admit only enrolled clients and encrypt the traffic.
    ``fanout="sequential"`` makes :meth:`Hub.broadcast` reach one client after another.
    """
    url, security = split_security_options(url, "hub")
    fanout = options.pop("fanout", "concurrent")
    if fanout not in FANOUTS:
        raise ValueError(f"fanout must be one of {FANOUTS}, not {fanout!r}")
    hub = _load(url, "hub")(url, **security, **options)
    hub.fanout = fanout
    return hub


def connect(url: str, **options: Any) -> Channel:
    """Open a channel to the hub at ``url``; ``client_id=`` names this client.

    ``tls=tensorwire.TLS(ca=...)`` and ``key=`` (its enrolled secret), or the URL options
    ``?ca=&cert=&certkey=&secret=``, prove who it is and encrypt the traffic.
    """
    url, security = split_security_options(url, "channel")
    return _load(url, "channel")(url, **security, **options)


__all__ = [
    "KNOWN_TRANSPORTS",
    "BroadcastResult",
    "BrokerKind",
    "Channel",
    "Hub",
    "MembershipEvent",
    "TransferRecord",
    "TransportEntry",
    "connect",
    "credentials_from_dir",
    "default_client_id",
    "get_transport",
    "local_hub_url",
    "register_transport",
    "serve",
    "transports",
    "unregister_transport",
]
