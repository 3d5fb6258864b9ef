"""Ports for the brokers tensorwire starts: picked free here, and picked again if taken.

A broker is another program, which binds its listeners itself: tensorwire cannot hand it a
bound socket. So it asks the kernel for a free port (binds port 0, reads the number,
closes) and the broker binds that number a moment later, and in that moment another program
may take it. A start that fails because an address was in use is therefore tried again on
new ports, :data:`ATTEMPTS` times in all; only ports tensorwire picked are picked again,
never one the caller gave. A broker that restarts on its ports keeps them with
:func:`hold_port` while it is down.
"""

from __future__ import annotations

import logging
import re
import socket
from collections.abc import Callable, Iterable
from typing import TypeVar

from tensorwire.errors import TransportError

log = logging.getLogger("tensorwire.transports.brokers")

ATTEMPTS = 4
"""Starts tried on fresh ports before a clash is the caller's error."""
# Mosquitto: "Error: Address already in use"; Erlang (RabbitMQ's listeners, its
# distribution port): "eaddrinuse", RabbitMQ's check of the latter: "dist_port_already_used";
# epmd: "error in bind" / "address already in use"
_IN_USE = re.compile(
    r"address already in use|eaddrinuse|error in bind|dist_port_already_used", re.IGNORECASE
)

T = TypeVar("T")


def free_port(host: str) -> int:
    """A TCP port free on ``host`` now (the kernel's pick for port 0)."""
    with socket.create_server((host, 0)) as probe:
        port: int = probe.getsockname()[1]
        return port


def hold_port(host: str, port: int) -> socket.socket | None:
    """A socket bound to ``host:port`` that keeps the port from the kernel's picks for others
    (no ``connect`` takes it as its local end, no bind to port 0 gets it) while a broker that
    listens on it is down, for a restart: a connection that took it then would keep the broker
    from binding it again. It never listens, and is made reusable once bound, so the broker's
    listener (``SO_REUSEADDR``, which RabbitMQ's listeners set) binds beside it. None if
    the port is in use: the broker's start then says so. Close it when the broker is gone."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        return None
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # after bind: the port is ours
    return sock


class HeldPorts:
    """A broker's listener ports, each held with :func:`hold_port` from :meth:`hold` until
    :meth:`release` (its stop)."""

    def __init__(self) -> None:
        self._socks: dict[tuple[str, int], socket.socket] = {}

    def hold(self, addresses: Iterable[tuple[str, int | None]]) -> None:
        """Hold these ``(host, port)`` (port 0 and None skipped) and no others; one held
        already stays held (the broker may be listening on it: it could not be bound again)."""
        wanted = {(host, port) for host, port in addresses if port}
        for address in set(self._socks) - wanted:
            self._socks.pop(address).close()
        for address in wanted - set(self._socks):
            if (sock := hold_port(*address)) is not None:
                self._socks[address] = sock

    def release(self) -> None:
        for sock in self._socks.values():
            sock.close()
        self._socks.clear()


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
