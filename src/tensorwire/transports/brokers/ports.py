"""Ports for the brokers tensorwire starts: picked free here, and picked again if taken.

A broker is another program, which binds its listeners itself: tensorwire cannot hand it a
bound socket. So it asks the kernel for a free port (binds port 0, reads the number,
closes) and the broker binds that number a moment later, and in that moment another program
may take it. A start that fails because an address was in use is therefore tried again on
new ports, :data:`ATTEMPTS` times in all; only ports tensorwire picked are picked again,
never one the caller gave.
"""

from __future__ import annotations

import logging
import re
import socket
from collections.abc import Callable
from typing import TypeVar

from tensorwire.errors import TransportError

log = logging.getLogger("tensorwire.transports.brokers")

ATTEMPTS = 4
"""Starts tried on fresh ports before a clash is the caller's error."""
# Mosquitto: "Error: Address already in use"; Erlang (RabbitMQ's listeners, its
# distribution port): "eaddrinuse"; epmd: "error in bind" / "address already in use"
_IN_USE = re.compile(r"address already in use|eaddrinuse|error in bind", re.IGNORECASE)

T = TypeVar("T")


def free_port(host: str) -> int:
    """A TCP port free on ``host`` now (the kernel's pick for port 0)."""
    with socket.create_server((host, 0)) as probe:
        port: int = probe.getsockname()[1]
        return port


def port_clash(exc: BaseException) -> bool:
    """Whether a failed start says an address it was to bind was in use."""
    return bool(_IN_USE.search(str(exc)))


def start_on_free_ports(start: Callable[[], T], forget: Callable[[], None], what: str) -> T:
    """``start()``; while it fails for a port another program took first, ``forget()`` the
    ports it picked and start again (:data:`ATTEMPTS` in all). Other failures, and the
    last clash, are raised as they are."""
    for attempt in range(1, ATTEMPTS + 1):
        try:
            return start()
        except TransportError as exc:
            if attempt == ATTEMPTS or not port_clash(exc):
                raise
            log.info("%s: a port picked for it was taken before it bound it; new ports", what)
            forget()
    raise AssertionError("unreachable")  # the loop returns or raises
