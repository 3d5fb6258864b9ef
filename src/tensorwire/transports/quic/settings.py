"""Reading ``quic://host:port?mtu=1350&cc=cubic&idle=20`` into settings, and the timings
both ends share."""

from __future__ import annotations

from dataclasses import dataclass

from aioquic.quic.configuration import QuicConfiguration

from tensorwire.errors import TransportError
from tensorwire.transports.url import query_options

ALPN = "tensorwire"
OPTIONS = ("mtu", "cc", "idle")
DEFAULT_MTU = 1350
"""UDP payload bytes per datagram: fits a 1500-byte path with room for tunnels (QUIC's floor
is 1200). At most :data:`MAX_MTU`."""
MAX_MTU = 16000
"""aioquic writes a STREAM frame's length as a 2-byte varint (at most 16,383): a larger
datagram would carry frames it cannot describe, and the peer fails to parse them."""
DEFAULT_CC = "cubic"
IDLE_TIMEOUT = 20.0
"""Seconds without a packet from the peer after which its connection is dropped; each side
pings after a third of it, so a live but quiet peer is never dropped."""
MAX_DATA = 64 << 20
"""Flow control: bytes a peer may have in flight to us per connection (and per stream)."""
HANDSHAKE_TIMEOUT = 10.0  # seconds for a QUIC handshake, and for a hub's peer to say hello


@dataclass(frozen=True)
class QuicSettings:
    """One endpoint's QUIC settings from its URL: ``mtu`` (UDP payload bytes per datagram),
    ``cc`` (congestion control: cubic or reno) and ``idle`` (seconds of silence before a
    connection is dropped)."""

    mtu: int = DEFAULT_MTU
    cc: str = DEFAULT_CC
    idle: float = IDLE_TIMEOUT

    @property
    def ping_every(self) -> float:
        """Seconds of our own silence after which an endpoint pings its peer."""
        return self.idle / 3

    def configuration(self, *, is_client: bool) -> QuicConfiguration:
        """aioquic's configuration for one connection, without certificates."""
        return QuicConfiguration(
            is_client=is_client,
            alpn_protocols=[ALPN],
            congestion_control_algorithm=self.cc,
            idle_timeout=self.idle,
            max_datagram_size=self.mtu,
            max_data=MAX_DATA,
            max_stream_data=MAX_DATA,
        )


def parse_quic_url(url: str) -> QuicSettings:
    """The settings ``url``'s query asks for; TransportError for one out of range."""
    query = query_options(url, OPTIONS)
    try:
        mtu = int(query.get("mtu", DEFAULT_MTU))
        idle = float(query.get("idle", IDLE_TIMEOUT))
    except ValueError:
        raise TransportError(f"{url!r}: mtu= is whole bytes, idle= seconds") from None
    if not 1200 <= mtu <= MAX_MTU:
        raise TransportError(f"{url!r}: mtu={mtu}: 1200 (QUIC's least) to {MAX_MTU} bytes")
    cc = query.get("cc", DEFAULT_CC)
    if cc not in ("cubic", "reno"):
        raise TransportError(f"{url!r}: cc={cc}: aioquic offers cubic and reno")
    if not 1.0 <= idle <= 600.0:
        raise TransportError(f"{url!r}: idle={idle}: 1 to 600 seconds")
    return QuicSettings(mtu=mtu, cc=cc, idle=idle)
