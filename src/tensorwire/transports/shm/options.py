"""The settings of ``shm://``: its options, its constants (``docs/transports/shm.md``
section 10), its URL (``shm://NAME``) and the platform it needs."""

from __future__ import annotations

import fcntl
import os
import re
from dataclasses import dataclass
from typing import Any

from tensorwire.codecs import AutoCodec
from tensorwire.errors import TransportError
from tensorwire.transports.base import ChannelOptions, HubOptions
from tensorwire.transports.url import query_options

INLINE_BYTES = 64 << 10
"""Messages up to this many bytes (encoded) travel in their control packet, copied."""
ALIGN = 64
"""A message is placed so that its first tensor starts on this boundary (bytes)."""
MAX_MAPPED = 256
"""Segments one peer may have mapped in this process at once."""
SHM_BANDWIDTH = 4e9
"""Bytes/s a same-host copy moves: where ``codec="auto"`` starts its link estimate."""
HANDSHAKE_TIMEOUT = 10.0  # seconds a new connection has to say hello
BYE_TIMEOUT = 1.0  # seconds spent saying goodbye (or dropping a segment) before giving up
RELEASE_TIMEOUT = 10.0  # seconds a release notice may wait for room in the socket


@dataclass(frozen=True, kw_only=True)
class ShmSegmentOptions:
    """How an endpoint shares its big messages, hub and channel alike."""

    max_segments: int = 8
    """Big messages one receiver may hold (keep alive) before sends to it wait."""
    cache_bytes: int = 1 << 30
    """Bytes of free segments kept for reuse (their pages stay mapped on both sides)."""
    trust_other_users: bool = False
    """Accept peers of other users (they keep write access to the segments they send)."""


@dataclass(frozen=True, kw_only=True)
class ShmHubOptions(HubOptions, ShmSegmentOptions):
    """What ``serve("shm://...")`` takes."""

    backlog: int = 128
    """Connections the listening socket queues before it accepts them."""


@dataclass(frozen=True, kw_only=True)
class ShmChannelOptions(ChannelOptions, ShmSegmentOptions):
    """What ``connect("shm://...")`` takes."""


_NAME = re.compile(r"[A-Za-z0-9._-]{1,90}")


def address(name: str) -> str:
    """The abstract Unix socket address of the hub called ``name``."""
    return f"\0tensorwire-{name}"


def name_of(url: str) -> str:
    """``shm://name`` -> ``name`` (may be empty: the hub then picks one); ``TransportError``
    for any URL option (the security options are taken out before, and mean nothing here)."""
    query_options(url, ())
    scheme, sep, name = url.partition("://")
    if scheme != "shm" or not sep:
        raise TransportError(f"{url!r} is not an shm:// URL; write it as shm://NAME")
    if name and not _NAME.fullmatch(name):
        raise TransportError(
            f"{url!r}: the name after shm:// must be 1 to 90 characters of A-Z a-z 0-9 . _ -"
        )
    return name


def require_linux() -> None:
    if not hasattr(os, "memfd_create") or not hasattr(fcntl, "F_ADD_SEALS"):
        raise TransportError(
            "shm:// needs Linux (memfd_create with seals); on this system use tcp://127.0.0.1:0"
        )


def seed_bandwidth(selector: Any) -> None:
    if isinstance(selector, AutoCodec):
        # A copy in memory, not a network: compression rarely pays.
        selector.bandwidth = SHM_BANDWIDTH
