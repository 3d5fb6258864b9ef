"""Reading transport URLs."""

from __future__ import annotations

from urllib.parse import urlsplit

from tensorwire.errors import TransportError


def host_port(url: str, default_port: int | None = None) -> tuple[str, int]:
    """``scheme://host:port/...`` -> ``(host, port)``; ``TransportError`` if no port is known."""
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        raise TransportError(f"{url!r}: the port is not a number in 0..65535") from None
    if port is None:
        port = default_port
    if port is None:
        raise TransportError(f"{url!r} names no port; write it as {parts.scheme}://HOST:PORT")
    return parts.hostname or "127.0.0.1", port
