"""Reading ``udp://host:port?mode=...&mtu=...&rate=...&buffer=...`` into options."""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import urlencode

from tensorwire.errors import TransportError
from tensorwire.transports.url import host_port, query_options
from tensorwire.wire import CHUNK_HEADER_SIZE

MODES = ("reliable", "best-effort")
DEFAULT_MTU = 1472  # an Ethernet MTU of 1500 less the IPv4 (20) and UDP (8) headers
MAX_MTU = 65507  # the largest UDP payload IPv4 can carry
DEFAULT_BUFFER = 64 << 20  # bytes of kernel socket buffer asked for, each direction

_UNITS = {"bit": 1, "kbit": 10**3, "mbit": 10**6, "gbit": 10**9}
_RATE = re.compile(r"^\s*((?:\d+(?:\.\d*)?|\.\d+)(?:e[+-]?\d+)?)\s*([a-z]*)\s*$")
_SIZE_UNITS = {"": 1, "b": 1, "kb": 1 << 10, "mb": 1 << 20, "gb": 1 << 30}


@dataclass(frozen=True)
class UdpOptions:
    """How one endpoint sends: ``mode`` (None: take the hub's), ``mtu`` (bytes per datagram
    payload, the 40-byte chunk header included), ``rate`` (bits/s to pace to; None: unpaced)
    and ``buffer`` (bytes of kernel socket buffer to ask for)."""

    mode: str | None = None
    mtu: int = DEFAULT_MTU
    rate: float | None = None
    buffer: int = DEFAULT_BUFFER

    @property
    def chunk_payload(self) -> int:
        """Message bytes per datagram."""
        return self.mtu - CHUNK_HEADER_SIZE

    def query(self, mode: str) -> str:
        """The URL query that gives these options (with ``mode`` filled in)."""
        q = {"mode": mode, "mtu": str(self.mtu)}
        if self.rate is not None:
            q["rate"] = str(int(self.rate)) if self.rate.is_integer() else repr(self.rate)
        if self.buffer != DEFAULT_BUFFER:
            q["buffer"] = str(self.buffer)
        return urlencode(q)


def parse_rate(text: str) -> float:
    """``"5mbit"`` -> 5e6 bits/s (units bit, kbit, mbit, gbit as in ``tc``; none: bits/s)."""
    m = _RATE.match(text.lower())
    if not m or m.group(2) not in ("", *_UNITS) or float(m.group(1)) <= 0:
        raise TransportError(
            f"rate={text!r}: write a positive number of bits/s with an optional unit "
            "bit, kbit, mbit or gbit (e.g. rate=5mbit)"
        )
    return float(m.group(1)) * _UNITS[m.group(2) or "bit"]


def _parse_size(text: str, name: str) -> int:
    m = _RATE.match(text.lower())
    if not m or m.group(2) not in _SIZE_UNITS:
        raise TransportError(f"{name}={text!r}: write a number of bytes, e.g. 1472 or 64mb")
    return int(float(m.group(1)) * _SIZE_UNITS[m.group(2)])


def parse_udp_url(url: str, default_port: int | None = None) -> tuple[str, int, UdpOptions]:
    """``udp://host:port?...`` -> ``(host, port, options)``; ``TransportError`` if malformed."""
    host, port = host_port(url, default_port)
    query = query_options(url, ("mode", "mtu", "rate", "buffer"))
    mode = query.get("mode")
    if mode is not None and mode not in MODES:
        raise TransportError(f"{url!r}: mode must be one of {', '.join(MODES)}, not {mode!r}")
    mtu = _parse_size(query["mtu"], "mtu") if "mtu" in query else DEFAULT_MTU
    if not CHUNK_HEADER_SIZE < mtu <= MAX_MTU:
        raise TransportError(
            f"{url!r}: mtu={mtu} must be more than the {CHUNK_HEADER_SIZE}-byte chunk header "
            f"and at most {MAX_MTU} bytes (the largest UDP payload)"
        )
    rate = parse_rate(query["rate"]) if "rate" in query else None
    buffer = _parse_size(query["buffer"], "buffer") if "buffer" in query else DEFAULT_BUFFER
    return host, port, UdpOptions(mode, mtu, rate, buffer)
