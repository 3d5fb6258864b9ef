"""What can run here: a protocol's extra and broker, loss and topologies on the testbed at
hand, stress tools, fault scenarios; and the testbed to run on."""

from __future__ import annotations

from collections.abc import Callable

from tensorwire.bench.fl_faults import (
    needs_broker,
    needs_links,
    parse_scenario,
)
from tensorwire.bench.fl_matrix import SEQUENTIAL, Experiment, Matrix, transport_of
from tensorwire.errors import MissingDependency
from tensorwire.testbed import (
    LoopbackTestbed,
    Testbed,
    probe_capabilities,
)
from tensorwire.testbed.base import BaseTestbed
from tensorwire.transports.registry import bench_protocols


def protocol_problem(protocol: str) -> str | None:
    """Why ``protocol`` cannot run on this machine (a missing extra or broker), or None."""
    entry = bench_protocols().get(SEQUENTIAL.get(protocol, protocol))
    if entry is None:
        return f"{protocol} is not a registered transport"
    if entry.same_host_only:
        return f"{entry.scheme}:// is same-host only: it never crosses the testbed's links"
    broker = entry.broker_kind()
    try:
        entry.load("hub")
        if broker is not None:
            broker.load("find")()
    except MissingDependency as exc:
        return str(exc)
    return None


def skip_reasons(matrix: Matrix, testbed: BaseTestbed) -> dict[str, str]:
    """Experiment key -> why it cannot run here (protocol, loss on loopback, a stress tool)."""
    caps = probe_capabilities()
    protocols = {p: protocol_problem(p) for p in matrix.protocols}
    tools = {"cpu": "tool:stress-ng", "network": "tool:iperf3"}
    reasons = {}
    for exp in matrix.experiments():
        why = protocols[exp.protocol]
        if why is None and exp.loss and not testbed.shaped:
            why = "packet loss needs the namespace testbed (this is an unshaped loopback run)"
        if why is None and (exp.topology != "star" or exp.links) and not testbed.shaped:
            why = "topologies and per-device links need the namespace testbed (loopback here)"
        if why is None and exp.stress in tools and not caps.has(tools[exp.stress]):
            why = caps[tools[exp.stress]].reason
        if why is None:
            why = fault_problem(exp, testbed)
        if why is not None:
            reasons[exp.key] = why
    return reasons


def fault_problem(exp: Experiment, testbed: BaseTestbed) -> str | None:
    """Why ``exp``'s fault scenario cannot happen here (a broker restart without a broker,
    a link flap without links), or None."""
    events = parse_scenario(exp.faults, exp.clients, exp.rounds)
    if needs_broker(events) and transport_of(exp.protocol).broker_kind() is None:
        return f"fault {exp.faults!r}: {exp.protocol} has no broker to restart"
    if needs_links(events) and not testbed.shaped:
        return f"fault {exp.faults!r}: a link flap needs the namespace testbed (loopback here)"
    return None


def choose_testbed(devices: int, say: Callable[[str], None], topology: str = "star") -> BaseTestbed:
    """A namespace :class:`Testbed` with ``devices`` devices in ``topology`` (to open); where
    namespaces cannot be made, say why and return a :class:`LoopbackTestbed` ("unshaped
    loopback")."""
    caps = probe_capabilities()
    if caps.mode is None:
        why = "; ".join(caps[n].reason for n in ("root", "userns", "netns") if n in caps.items)
        say(
            f"[yellow]no network namespaces here ({why}): running unshaped on loopback, "
            "and every result is labelled 'unshaped loopback'[/]"
        )
        return LoopbackTestbed(devices=devices)
    return Testbed(devices=devices, topology=topology)
