"""The settings of ``flight://``: its options, its constants (``docs/transports/flight.md``
section 9) and where a hub listens (``grpc+tcp`` or ``grpc+tls``)."""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
import pyarrow.flight as flight

from tensorwire.transports.base import ChannelOptions, HubOptions
from tensorwire.transports.security import TLS

FLIGHT_ERRORS = (pa.ArrowException, OSError)
"""What a Flight call raises when its call fails: Flight's errors, or a bare ``OSError``
("server disconnect?")."""

SCHEMA = pa.schema([("bytes", pa.binary())])
"""Every data batch: one binary column whose values are consecutive bytes of the messages."""

UP = (b"tensorwire", b"up")  # descriptor path of a session's uplink, followed by its id
BATCH_BYTES = 4 << 20  # most message bytes per record batch (one gRPC message)
JOIN_BELOW = 512 << 10  # smaller buffers share a batch: copying them beats a gRPC message each
FEED_BYTES = 256 << 10  # bytes fed to the decoder at a time: it hashes them while in cache
HANDSHAKE_TIMEOUT = 10.0  # seconds a session's second call has to arrive after its first
MAX_HANDSHAKES = 1024  # downlinks (and, apart, uplinks) waiting for their other call at once
MAX_HANDSHAKES_PER_SOURCE = 512  # ... from one host; past either, the oldest is ended
BYE_TIMEOUT = 1.0  # seconds spent saying goodbye before closing anyway
SHUTDOWN_TIMEOUT = 5.0  # seconds the hub waits for its server to stop before leaving it be


@dataclass(frozen=True, kw_only=True)
class FlightHubOptions(HubOptions):
    """What ``serve("flight://...")`` takes."""

    batch_bytes: int = BATCH_BYTES
    """Most message bytes per record batch (gRPC message) the hub sends."""


@dataclass(frozen=True, kw_only=True)
class FlightChannelOptions(ChannelOptions):
    """What ``connect("flight://...")`` takes."""

    batch_bytes: int = BATCH_BYTES
    """Most message bytes per record batch (gRPC message) the channel sends."""


def location(host: str, port: int, tls: TLS | None) -> flight.Location:
    if tls is None:
        return flight.Location.for_grpc_tcp(host, port)
    return flight.Location.for_grpc_tls(host, port)
