"""Reading transport URLs."""

from __future__ import annotations

from collections.abc import Iterable
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

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


def query_options(url: str, known: Iterable[str]) -> dict[str, str]:
    """The URL's query as a dict (last value wins); ``TransportError`` naming any option that
    is not in ``known`` (nor a security option, which ``serve``/``connect`` take out first)."""
    allowed = set(known)
    query = dict(parse_qsl(urlsplit(url).query, keep_blank_values=True))
    unknown = sorted(set(query) - allowed)
    if unknown:
        from tensorwire.transports.security import URL_OPTIONS

        every = sorted(allowed | set(URL_OPTIONS))
        raise TransportError(
            f"{url!r}: unknown option(s) {', '.join(unknown)}; this scheme takes "
            f"{', '.join(every) or 'none'}"
        )
    return query


def redacted(url: str) -> str:
    """``url`` with any password in it replaced by ``***``, for logs and errors."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return parts._replace(netloc=netloc).geturl()


def with_option(url: str, name: str, value: str) -> str:
    """``url`` with ``name=value`` in its query (replacing a value it had)."""
    parts = urlsplit(url)
    query = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k != name]
    return urlunsplit(parts._replace(query=urlencode([*query, (name, value)])))
