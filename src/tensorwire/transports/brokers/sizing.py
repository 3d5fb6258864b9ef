"""How many file descriptors a private broker gets, and how many connections it then takes.

A broker out of descriptors does not refuse connections cleanly: RabbitMQ 3.10 at its limit
(two connections and a queue per device, ~340 devices on 1,024 descriptors) refused new ones
and then shut itself down, its queues unable to open their files. So a private broker gets a
descriptor limit sized for the devices that will use it (``devices``), or a given one
(``fds``), and a connection limit that leaves room for everything else it opens; a device past
it is refused by the broker with a message naming the limit
(:class:`~tensorwire.errors.BrokerFull` on an ``amqp://`` device), and the broker keeps
running.
"""

from __future__ import annotations

import math
import resource
from collections.abc import Sequence
from dataclasses import dataclass

MIN_FDS = 1024  # what a broker gets at least: the usual soft limit
SPARE_CONNECTIONS = 16  # for the hub, probes and reconnections racing their old connection
NEAR_LIMIT = 0.9  # share of its connection limit at which a hub warns (sized to stay below it)


@dataclass(frozen=True)
class Footprint:
    """What one device costs a broker: ``per_device`` descriptors (its connection, and for
    RabbitMQ the files of its durable session queue), beyond ``fixed`` the broker needs for
    itself (its runtime, database, logs, message store)."""

    per_device: int
    fixed: int


RABBITMQ = Footprint(per_device=3, fixed=256)  # a socket, a queue's journal and segment file
MOSQUITTO = Footprint(per_device=1, fixed=64)  # a socket


@dataclass(frozen=True)
class BrokerLimits:
    """A private broker's ``fds`` (its RLIMIT_NOFILE), the most client ``connections`` it
    lets in (one past them is refused with a reason: RabbitMQ's vhost ``max-connections``,
    Mosquitto's ``max_connections``), and ``backstop``, the most it accepts at all (RabbitMQ's
    ``connection_max``: past it, new connections wait unaccepted, as its listener's
    count is approximate), within its descriptors."""

    fds: int
    connections: int

    @property
    def backstop(self) -> int:
        return self.connections + SPARE_CONNECTIONS


def size_for(devices: int | None, fds: int | None, footprint: Footprint) -> BrokerLimits:
    """The limits of a broker for ``devices`` (each one connection), or with ``fds``
    descriptors if given; never above this process's hard limit (a child cannot raise it)."""
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if fds is None:
        # the devices and their hub below the warning mark, and the spares within the limit
        # and past it
        held = math.ceil(((devices or 0) + 1) / NEAR_LIMIT)
        need = footprint.fixed + footprint.per_device * (held + 2 * SPARE_CONNECTIONS)
        fds = max(MIN_FDS, need)
    if hard != resource.RLIM_INFINITY:
        fds = min(fds, hard)
    connections = (fds - footprint.fixed) // footprint.per_device - SPARE_CONNECTIONS
    if connections < 1:
        raise ValueError(
            f"{fds} file descriptors leave no room for connections: a broker needs "
            f"{footprint.fixed + footprint.per_device * (SPARE_CONNECTIONS + 1)} at least"
        )
    return BrokerLimits(fds=fds, connections=connections)


def with_fd_limit(argv: Sequence[str], fds: int) -> list[str]:
    """``argv`` run with a descriptor limit of ``fds`` (soft and hard), through ``sh``'s
    ``ulimit`` (no ``preexec_fn``: unsafe in a process with threads)."""
    return ["sh", "-c", 'ulimit -n "$0" && exec "$@"', str(fds), *argv]
