"""URLs to serve a hub on this machine, per transport, starting a broker when none answers."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator


@contextlib.contextmanager
def local_hub_url(transport: str, tag: str | None = None) -> Iterator[str]:
    """A URL for a hub on this machine over ``transport`` (tcp, udp, zmq, mqtt, amqp, flight,
    shm). For mqtt and amqp the broker on its default port is used if it answers, else a
    private one runs for the duration. ``tag`` names topics / queues (random by default)."""
    tag = tag or f"tw-{uuid.uuid4().hex[:8]}"
    if transport == "mqtt":
        from tensorwire.transports.brokers.mosquitto import ensure_mosquitto

        with ensure_mosquitto(f"mqtt://127.0.0.1:1883/{tag}") as url:
            yield url
    elif transport == "amqp":
        from tensorwire.transports.brokers.rabbitmq import ensure_rabbitmq

        with ensure_rabbitmq(f"amqp://guest:guest@127.0.0.1:5672/%2F?prefix={tag}") as url:
            yield url
    elif transport == "shm":
        yield f"shm://{tag}"
    elif transport == "udp":
        yield "udp://127.0.0.1:0?mtu=65000"  # loopback carries 64 KiB datagrams
    else:
        scheme = "zmq+tcp" if transport == "zmq" else transport
        yield f"{scheme}://127.0.0.1:0"
