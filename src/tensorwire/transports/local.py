"""URLs to serve a hub on this machine, per transport, starting a broker when none answers."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from pathlib import Path

from tensorwire.transports.registry import get_transport
from tensorwire.transports.security import TLS


@contextlib.contextmanager
def local_hub_url(
    transport: str, tag: str | None = None, secure: Path | None = None
) -> Iterator[str]:
    """A URL for a hub on this machine over ``transport`` (a registered transport's name or
    scheme: tcp, zmq, udp, mqtt, ...), from its entry's ``local_url``. For a transport with a
    broker, the broker at that URL is used if it answers, else a private one runs for the
    duration. ``tag`` names topics / queues / segments (random by default).

    ``secure``: a directory from ``tensorwire certs``; a broker transport then gets a private
    broker with a TLS listener on its ``hub.pem`` (the URL names it: mqtts://, amqps://)."""
    entry = get_transport(transport)
    tag = tag or f"tw-{uuid.uuid4().hex[:8]}"
    url = entry.url_here(tag)
    broker = entry.broker_kind()
    if broker is None:
        yield url
        return
    if secure is not None:
        tls = TLS(cert=secure / "hub.pem", key=secure / "hub.key", ca=secure / "ca.pem")
        with broker.load("server")(tls=tls) as server:
            yield server.url(tag)
        return
    with broker.load("ensure")(url) as url:
        yield url
