"""Transports, chosen by URL scheme; each one is imported on first use.

Like fsspec's registry: a scheme maps to the dotted paths of its hub and channel classes,
and the extra to install when the import fails.
"""

from __future__ import annotations

import importlib
from typing import Any

from tensorwire.errors import MissingDependency, UnknownScheme
from tensorwire.transports.base import Channel, Hub, TransferRecord

KNOWN_TRANSPORTS: dict[str, dict[str, str | None]] = {
    "tcp": {
        "hub": "tensorwire.transports.tcp.TcpHub",
        "channel": "tensorwire.transports.tcp.TcpChannel",
        "extra": None,
    },
    "zmq+tcp": {
        "hub": "tensorwire.transports.zmq.ZmqHub",
        "channel": "tensorwire.transports.zmq.ZmqChannel",
        "extra": "zmq",
    },
    "udp": {
        "hub": "tensorwire.transports.udp.UdpHub",
        "channel": "tensorwire.transports.udp.UdpChannel",
        "extra": None,
    },
    "shm": {
        "hub": "tensorwire.transports.shm.ShmHub",
        "channel": "tensorwire.transports.shm.ShmChannel",
        "extra": None,
    },
    "amqp": {
        "hub": "tensorwire.transports.amqp.AmqpHub",
        "channel": "tensorwire.transports.amqp.AmqpChannel",
        "extra": "amqp",
    },
    "mqtt": {
        "hub": "tensorwire.transports.mqtt.MqttHub",
        "channel": "tensorwire.transports.mqtt.MqttChannel",
        "extra": "mqtt",
    },
    "flight": {
        "hub": "tensorwire.transports.flight.FlightHub",
        "channel": "tensorwire.transports.flight.FlightChannel",
        "extra": "flight",
    },
}


def register_transport(scheme: str, hub: str, channel: str, extra: str | None = None) -> None:
    """Make ``scheme://`` URLs use the hub and channel classes at these dotted paths."""
    KNOWN_TRANSPORTS[scheme] = {"hub": hub, "channel": channel, "extra": extra}


def _load(url: str, role: str) -> Any:
    scheme = url.split("://", 1)[0] if "://" in url else ""
    entry = KNOWN_TRANSPORTS.get(scheme)
    if entry is None:
        known = ", ".join(f"{s}://" for s in KNOWN_TRANSPORTS)
        raise UnknownScheme(f"no transport for {url!r}; known schemes: {known}")
    module_name, _, cls_name = str(entry[role]).rpartition(".")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        extra = entry["extra"]
        hint = f"pip install 'tensorwire[{extra}]'" if extra else "reinstall tensorwire"
        raise MissingDependency(f"{scheme}:// needs {exc.name or exc}: {hint}") from exc
    return getattr(module, cls_name)


def serve(url: str, **options: Any) -> Hub:
    """Open a hub at ``url`` (e.g. ``tcp://127.0.0.1:5555``); options go to the transport."""
    return _load(url, "hub")(url, **options)


def connect(url: str, **options: Any) -> Channel:
    """Open a channel to the hub at ``url``; ``client_id=`` names this client."""
    return _load(url, "channel")(url, **options)


__all__ = [
    "KNOWN_TRANSPORTS",
    "Channel",
    "Hub",
    "TransferRecord",
    "connect",
    "register_transport",
    "serve",
]
