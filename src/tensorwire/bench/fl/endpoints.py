"""Where an experiment's server listens and its devices connect: URLs with the transport's
query and pace, a private broker for a broker transport, certificates for a secured one."""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from tensorwire.bench.fl_matrix import Experiment, transport_of
from tensorwire.testbed.base import BaseTestbed
from tensorwire.transports.security import TLS

SERVER_PORT = 5555  # the FL server's port in the server namespace (a fresh one: always free)

# A paced transport (udp) paces its payloads; a 1472-byte UDP payload is a 1514-byte frame
# (97 %), and tbf counts frames: pacing at 95 % of the link rate keeps its queue from
# overflowing.
PACE = 0.95


@dataclasses.dataclass
class Endpoints:
    """Where the server listens and where devices connect (``device_urls``: each device's
    own where they differ, as a paced transport's pace does on mixed links), and the broker if
    there is one."""

    server_url: str
    device_url: str
    broker: dict[str, Any] | None = None
    device_urls: list[str] | None = None
    broker_server: Any = None  # the running broker (restarted by a fault), if there is one
    bound: Callable[[int], Endpoints] | None = None
    """Set where the server listens on port 0 (loopback: no port is picked here and bound
    later, a race with every other process): these endpoints once it listens on a port."""

    def url_of(self, device: int) -> str:
        """The URL device ``device`` (1-based) connects to."""
        return self.device_urls[device - 1] if self.device_urls else self.device_url


def hub_tls(certs: Path) -> TLS:
    """The TLS settings of ``tensorwire certs``' hub files in ``certs`` (a broker's too)."""
    return TLS(cert=certs / "hub.pem", key=certs / "hub.key", ca=certs / "ca.pem")


def enrol(testbed: BaseTestbed, exp: Experiment, exp_dir: Path) -> Path | None:
    """For a secured experiment, the certificates and keys of its hub and devices (in
    ``exp_dir/certs``); None for an unsecured one."""
    if exp.security == "none":
        return None
    from tensorwire.transports.certs import make_certs

    certs = exp_dir / "certs"
    hosts = list(dict.fromkeys([testbed.server_address, "127.0.0.1", "localhost"]))
    devices = [f"device-{i}" for i in range(1, exp.clients + 1)]
    make_certs(certs, hosts=hosts, clients=devices)
    return certs


@contextlib.contextmanager
def endpoints(
    testbed: BaseTestbed, exp: Experiment, certs: Path | None = None
) -> Iterator[Endpoints]:
    """The URLs of ``exp``'s server and devices; for a transport with a broker (mqtt, amqp) a
    private one runs inside the server node for the duration, bound to the server's address
    (with a TLS listener when ``certs`` secure the experiment), or inside the switch node,
    on the devices' side of the shared link, on ``shared-broker-near``. The URLs carry the
    query the transport's registry entry gives the protocol, and a pace for a transport that
    takes one: the hub's the slowest link's on its way, each device's its own way's."""
    entry = transport_of(exp.protocol)
    params = [q] if (q := entry.protocol_query(exp.protocol)) else []
    hub_rate, device_rates = _paths(exp) if testbed.shaped else (None, None)
    hub_params = [*params, f"rate={int(hub_rate * PACE)}"] if entry.paced and hub_rate else params
    broker_kind = entry.broker_kind()
    if broker_kind is not None:
        node = getattr(testbed, "broker_node", "srv")
        address = testbed.address(node)
        tag = f"tw-{exp.key[:40]}-{os.getpid()}"
        prefix = testbed.command(node, [])
        port = broker_kind.port if testbed.shaped else 0
        server_class = broker_kind.load("server")
        tls = {"tls": hub_tls(certs)} if certs is not None else {}
        # kept on disk across a restart, as a deployed broker's state is (Debian's
        # mosquitto.conf says persistence true; RabbitMQ keeps durable queues anyway)
        keep = {"persistence": True} if _takes(server_class, "persistence") else {}
        with server_class(port, bind=address, command_prefix=prefix, **tls, **keep) as broker:
            url = _with_query(broker.url(tag), params)
            facts = {a: getattr(broker, a) for a in ("pid", "node") if hasattr(broker, a)}
            facts = {"kind": broker_kind.name, "url": url, "at": node, **facts}
            yield Endpoints(url, url, facts, broker_server=broker)
        return
    address = testbed.server_address
    listen = "0.0.0.0" if testbed.shaped else address

    def at(port: int) -> Endpoints:
        server = _with_query(f"{entry.scheme}://{listen}:{port}", hub_params)
        device = _with_query(f"{entry.scheme}://{address}:{port}", hub_params)
        each = None
        if entry.paced and device_rates:
            each = [
                _with_query(
                    f"{entry.scheme}://{address}:{port}", [*params, f"rate={int(r * PACE)}"]
                )
                for r in device_rates
            ]
        return Endpoints(server, device, device_urls=each)

    # A fresh server namespace has its fixed port free; on loopback the server takes one the
    # kernel gives it (udp:// one free for both TCP and UDP), and says which when it listens.
    yield at(SERVER_PORT) if testbed.shaped else dataclasses.replace(at(0), bound=at)


def _takes(cls: Any, name: str) -> bool:
    return name in inspect.signature(cls).parameters


def _paths(exp: Experiment) -> tuple[float | None, list[float] | None]:
    """The rate (bits/s) of the slowest way between the server and a device (None:
    unshaped), and each device's own where they differ (else None)."""
    ways = [min_rate(d["downlink"], d["uplink"]) for d in device_rates(exp).values()]
    known = [r for r in ways if r is not None]
    differ = len(known) == len(ways) and len(set(known)) > 1
    return (min(known) if known else None), (known if differ else None)


def min_rate(*rates: float | None) -> float | None:
    """The least of ``rates`` (bits/s) that are set; None if none is (all unshaped)."""
    known = [r for r in rates if r is not None]
    return min(known) if known else None


def device_rates(exp: Experiment, direction: str = "both") -> dict[str, dict[str, float | None]]:
    """Per device (``device-1`` ...): the rate in bits/s of its slowest link to the server
    (the shared link or its own, whichever is slower) down and up; None: unshaped."""
    shared = exp.link_profile().rate if exp.topology != "star" else None
    own = exp.device_profiles()
    rates = {}
    for i in range(1, exp.clients + 1):
        if own is not None:
            rate = min_rate(own[i - 1].rate, shared)
        else:
            rate = shared if exp.topology != "star" else exp.link_profile().rate
        rates[f"device-{i}"] = {
            "downlink": rate if direction in ("both", "down") else None,
            "uplink": rate if direction in ("both", "up") else None,
        }
    return rates


def _with_query(url: str, params: list[str]) -> str:
    if not params:
        return url
    return url + ("&" if "?" in url else "?") + "&".join(params)
