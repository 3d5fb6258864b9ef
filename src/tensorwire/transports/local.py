"""URLs to serve a hub on this machine, per transport, starting a broker when none answers."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from pathlib import Path

from tensorwire.transports.registry import get_transport
from tensorwire.transports.security import TLS

SHARED_BROKER_DEVICES = 100
"""Devices a run may put on the machine's own broker; more get a private one sized for them."""


@contextlib.contextmanager
def local_hub_url(
    transport: str,
    tag: str | None = None,
    secure: Path | None = None,
    devices: int | None = None,
) -> Iterator[str]:
    """A URL for a hub on this machine over ``transport`` (a registered transport's name or
    scheme: tcp, zmq, udp, mqtt, ...), from its entry's ``local_url``. For a transport with a
    broker, the broker at that URL is used if it answers, else a private one runs for the
    duration. ``tag`` names topics / queues / segments (random by default).

    ``secure``: a directory from ``tensorwire certs``; a broker transport then gets a private
    broker with a TLS listener on its ``hub.pem`` (the URL names it: mqtts://, amqps://).

    ``devices``: how many will join; a private broker is sized for them (file descriptors,
    connection limit), and past :data:`SHARED_BROKER_DEVICES` one runs even where the
    machine's broker answers: a run never exhausts a broker others use."""
    entry = get_transport(transport)
    tag = tag or f"tw-{uuid.uuid4().hex[:8]}"
    url = entry.url_here(tag)
    broker = entry.broker_kind()
    if broker is None:
        yield url
        return
    sized = {} if devices is None else {"devices": devices}
    if secure is not None:
        tls = TLS(cert=secure / "hub.pem", key=secure / "hub.key", ca=secure / "ca.pem")
        with broker.load("server")(tls=tls, **sized) as server:
            yield server.url(tag)
        return
    if devices is not None and devices > SHARED_BROKER_DEVICES:
        with broker.load("server")(**sized) as server:
            yield server.url(tag)
        return
    with broker.load("ensure")(url, **sized) as url:
        yield url
