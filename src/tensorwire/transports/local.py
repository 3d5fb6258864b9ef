"""URLs to serve a hub on this machine, per transport, starting a broker when none answers."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator

from tensorwire.transports.registry import get_transport


@contextlib.contextmanager
def local_hub_url(transport: str, tag: str | None = None) -> Iterator[str]:
    """A URL for a hub on this machine over ``transport`` (a registered transport's name or
    scheme: tcp, zmq, udp, mqtt, ...), from its entry's ``local_url``. For a transport with a
    broker, the broker at that URL is used if it answers, else a private one runs for the
    duration. ``tag`` names topics / queues / segments (random by default)."""
    entry = get_transport(transport)
    url = entry.url_here(tag or f"tw-{uuid.uuid4().hex[:8]}")
    broker = entry.broker_kind()
    if broker is None:
        yield url
        return
    with broker.load("ensure")(url) as url:
        yield url
