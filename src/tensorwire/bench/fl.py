"""``tensorwire bench fl``: the FedComm benchmark, FedAvg runs on the emulated testbed.

For each :class:`~tensorwire.bench.fl_matrix.Experiment` the links get the experiment's
profile and loss (and each device its own link, with ``links``), on a testbed of the
experiment's topology (a new one when the topology changes); a broker (mqtt, amqp) starts
inside the server namespace, or in the switch's on ``shared-broker-near``; the FL server runs
as its own process there (``tensorwire fl server``) and each device as its own process in its
namespace (``tensorwire fl client``, one torch thread); a stressor loads the devices or their
links for the run, bounded in time. The server appends an event per round to
``progress.jsonl`` and waits for an acknowledgement, and in between this process reads the
testbed's counters, so each round's retransmissions and link bytes are exactly its own.

A run directory holds ``manifest.json`` and ``experiments/<key>/``, each with
``manifest.json``, ``rounds.parquet``, ``transfers.parquet``, ``counters.parquet``,
``progress.jsonl``, ``logs/`` and, once complete, ``done``: a rerun skips those. Then
``experiments.parquet``, ``figures/`` and ``report.html`` are made from all of them.
Where no network namespaces can be made the run goes on :class:`LoopbackTestbed`, and every
output says "unshaped loopback".
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pandas as pd

from tensorwire.bench.fl_faults import (
    FaultActions,
    FaultInjector,
    needs_broker,
    needs_links,
    parse_scenario,
)
from tensorwire.bench.fl_matrix import SEQUENTIAL, Experiment, Matrix, fanout_of, transport_of
from tensorwire.errors import MissingDependency, TensorwireError
from tensorwire.testbed import (
    Counters,
    LoopbackTestbed,
    Stressor,
    Testbed,
    cpu_stress,
    network_stress,
    probe_capabilities,
)
from tensorwire.testbed.base import BaseTestbed, stop_all
from tensorwire.transports.registry import bench_protocols
from tensorwire.transports.security import TLS

SERVER_PORT = 5555  # the FL server's port in the server namespace (a fresh one: always free)
JOIN_TIMEOUT = 180.0  # seconds the server waits for every device (2 s of torch import each)
ROUND_TIMEOUT = 600.0  # seconds the server waits for a round's updates
ACK_TIMEOUT = 5.0  # seconds the server waits, after a round, for the counters to be read
DEVICE_EXIT_GRACE = 30.0  # seconds the server gets to notice a failed device and end
POLL = 0.01  # seconds between looks at the processes and the progress file
# A paced transport (udp) paces its payloads; a 1472-byte UDP payload is a 1514-byte frame
# (97 %), and tbf counts frames: pacing at 95 % of the link rate keeps its queue from
# overflowing.
PACE = 0.95
DONE = "done"
FAILED = "failed"


class ExperimentFailed(TensorwireError, RuntimeError):
    """An experiment's server or devices failed or ran out of time; the message says why."""


@dataclasses.dataclass
class RunSummary:
    """What :func:`run_matrix` did: experiments run now (``ran``), found done from before
    (``resumed``), skipped with a reason, failed with a reason; the report's path."""

    out_dir: Path
    label: str
    ran: list[str] = dataclasses.field(default_factory=list)
    resumed: list[str] = dataclasses.field(default_factory=list)
    skipped: dict[str, str] = dataclasses.field(default_factory=dict)
    failed: dict[str, str] = dataclasses.field(default_factory=dict)
    report: Path | None = None
    seconds: float = 0.0


# --- what can run here ---------------------------------------------------------------------


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


# --- one experiment ------------------------------------------------------------------------


def _free_port() -> int:
    """A port free for both TCP and UDP on 127.0.0.1 (udp:// takes the same number for both)."""
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as tcp:
            tcp.bind(("127.0.0.1", 0))
            port = tcp.getsockname()[1]
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
                try:
                    udp.bind(("127.0.0.1", port))
                except OSError:
                    continue
                return port


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
    port = SERVER_PORT if testbed.shaped else _free_port()
    listen = "0.0.0.0" if testbed.shaped else address
    server = _with_query(f"{entry.scheme}://{listen}:{port}", hub_params)
    device = _with_query(f"{entry.scheme}://{address}:{port}", hub_params)
    each = None
    if entry.paced and device_rates:
        each = [
            _with_query(f"{entry.scheme}://{address}:{port}", [*params, f"rate={int(r * PACE)}"])
            for r in device_rates
        ]
    yield Endpoints(server, device, device_urls=each)


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


def _python_tensorwire(*args: str) -> list[str]:
    return [sys.executable, "-m", "tensorwire", *args]


def round_deadline(exp: Experiment) -> float:
    """The deadline of each round of ``exp``: its own, else :data:`ROUND_TIMEOUT` without
    faults and :func:`fault_deadline` with."""
    if exp.deadline is not None:
        return exp.deadline
    return ROUND_TIMEOUT if exp.faults == "none" else fault_deadline(exp)


def fault_deadline(exp: Experiment) -> float:
    """A deadline a round of ``exp`` meets without faults: three times its transfers at the
    slowest link's rate (the model down and the update up), plus 30 s for training,
    evaluation and a device's start."""
    from tensorwire.fl.models import model_bytes

    size = model_bytes(exp.model) or 50_000_000
    rate = exp.link_profile().rate or 1e9
    return round(30.0 + 3 * 2 * size * 8 / rate, 1)


def round_quorum(exp: Experiment) -> int:
    """The updates a round of ``exp`` needs: its own quorum, else half the devices (at least
    one) with faults, and one without (every sampled device is waited for anyway)."""
    if exp.quorum is not None:
        return exp.quorum
    return 1 if exp.faults == "none" else max(1, -(-exp.clients // 2))


def server_command(
    exp: Experiment, url: str, exp_dir: Path, certs: Path | None = None, resume: bool = False
) -> list[str]:
    """``tensorwire fl server`` for ``exp``, writing results and progress into ``exp_dir``;
    ``resume``: going on from the last checkpoint there."""
    secured = ["--certs", str(certs)] if certs is not None else []
    secured += ["--resume", str(exp_dir)] if resume else []
    fanout = fanout_of(exp.protocol)
    fanout_args = ["--fanout", fanout] if fanout != "concurrent" else []
    return [
        *_python_tensorwire(),
        "fl",
        "server",
        "--url",
        url,
        "--dataset",
        exp.dataset,
        "--model",
        exp.model,
        "--clients",
        str(exp.clients),
        "--rounds",
        str(exp.rounds),
        "--uplink",
        exp.uplink,
        "--ratio",
        repr(exp.ratio),
        "--downlink",
        exp.downlink,
        "--epochs",
        str(exp.epochs),
        "--seed",
        str(exp.rep),
        "--join-timeout",
        str(JOIN_TIMEOUT),
        "--round-timeout",
        str(round_deadline(exp)),
        "--min-updates",
        str(round_quorum(exp)),
        "--out",
        str(exp_dir),
        "--progress",
        str(exp_dir / "progress.jsonl"),
        "--progress-ack",
        str(ACK_TIMEOUT),
        *secured,
        *fanout_args,
    ]


def device_command(url: str, device: int, certs: Path | None = None) -> list[str]:
    """``tensorwire fl client`` as device ``device``, one torch thread."""
    from tensorwire.fl.run import device_command as fl_device_command

    timeout = max(JOIN_TIMEOUT, ROUND_TIMEOUT)
    return [*fl_device_command(url, device, timeout, certs), "--threads", "1"]


def experiment_limit(exp: Experiment) -> float:
    """Seconds after which an experiment is stopped as failed: join plus every round."""
    return JOIN_TIMEOUT + exp.rounds * round_deadline(exp) + 60.0


class ProgressReader:
    """New events of a server's ``progress.jsonl`` (whole lines only), and its ``.ack``."""

    def __init__(self, path: Path, from_end: bool = False) -> None:
        self.path = path
        self.ack_path = path.with_name(path.name + ".ack")
        self._offset = path.stat().st_size if from_end and path.is_file() else 0
        self._partial = b""

    def events(self) -> list[dict[str, Any]]:
        try:
            with self.path.open("rb") as f:
                f.seek(self._offset)
                data = f.read()
        except FileNotFoundError:
            return []
        self._offset += len(data)
        lines = (self._partial + data).split(b"\n")
        self._partial = lines.pop()
        return [json.loads(line) for line in lines if line.strip()]

    def ack(self, round_: int) -> None:
        self.ack_path.write_text(str(round_))


def _tail(path: Path, chars: int = 1500) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return ""


def _counter_rows(counters: Counters, point: str, round_: int) -> list[dict[str, Any]]:
    now = time.time()
    return [{"point": point, "round": round_, "time": now, **row} for row in counters.rows()]


def _start_stress(testbed: BaseTestbed, exp: Experiment, network_mbit: float) -> Stressor | None:
    seconds = experiment_limit(exp)
    if exp.stress == "cpu":
        return cpu_stress(testbed, workers=1, seconds=seconds)
    if exp.stress == "network":
        return network_stress(testbed, mbit=network_mbit, seconds=seconds)
    return None


def run_experiment(
    testbed: BaseTestbed,
    exp: Experiment,
    exp_dir: Path,
    *,
    network_mbit: float = 250.0,
    on_round: Callable[[int], None] | None = None,
) -> None:
    """Run ``exp`` on the open ``testbed`` into ``exp_dir``, ending with ``done``: from its
    server's last checkpoint where an interrupted run left one there, else from the start
    (``exp_dir`` replaced). :class:`ExperimentFailed` (with the log's end) if the server or a
    device fails."""
    from tensorwire.fl.checkpoint import latest_checkpoint

    resume = latest_checkpoint(exp_dir) is not None and not (exp_dir / DONE).exists()
    if not resume:
        shutil.rmtree(exp_dir, ignore_errors=True)
    logs = exp_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    if testbed.shaped:
        if exp.topology != getattr(testbed, "topology", "star"):
            raise ExperimentFailed(f"{exp.key}: needs a {exp.topology} testbed")
        links = exp.device_profiles()
        testbed.set_profile(exp.link_profile(), links=links)
    started = time.time()
    readings: list[dict[str, Any]] = []
    processes: list[subprocess.Popen[Any]] = []
    devices: dict[int, subprocess.Popen[Any]] = {}
    stressor: Stressor | None = None
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    certs = enrol(testbed, exp, exp_dir)
    outcome: dict[str, Any] = {}
    with endpoints(testbed, exp, certs) as ends:

        def start_device(i: int) -> None:
            with open(logs / f"device-{i}.log", "ab") as log:
                proc = testbed.popen(
                    testbed.device_nodes[i - 1],
                    device_command(ends.url_of(i), i, certs),
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=env,
                )
            devices[i] = proc
            processes.append(proc)

        injector = _injector(testbed, exp, ends, devices, start_device)
        try:
            readings += _counter_rows(testbed.counters(), "start", 0)
            stressor = _start_stress(testbed, exp, network_mbit)
            with open(logs / "server.log", "ab") as log:
                server = testbed.popen(
                    "srv",
                    server_command(exp, ends.server_url, exp_dir, certs, resume),
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=env,
                )
            processes.append(server)
            # Devices start with the server: each retries connecting until the hub is up,
            # so their torch import overlaps the server's.
            for i in range(1, len(testbed.device_nodes) + 1):
                start_device(i)
            progress = ProgressReader(exp_dir / "progress.jsonl", from_end=resume)
            finished = _watch(
                testbed, exp, progress, server, devices, on_round, readings, injector, outcome
            )
            readings += _counter_rows(testbed.counters(), "end", exp.rounds)
        finally:
            if injector is not None:
                injector.finish()
            if stressor is not None:
                stressor.stop()
            # Once the server said done its results are written and the devices' records
            # are in: what is left is five interpreters' teardown, seconds on two cores.
            stop_all(processes)
    if not finished:
        raise ExperimentFailed(
            f"{exp.key}: the server exited with {server.returncode}; its log ends:\n"
            f"{_tail(logs / 'server.log')}"
        )
    if not (exp_dir / "rounds.parquet").is_file():
        raise ExperimentFailed(f"{exp.key}: the server wrote no rounds.parquet")
    # TCP rows and link rows have different fields: a frame takes the union of them.
    pd.DataFrame(readings).to_parquet(exp_dir / "counters.parquet", index=False)
    faults = {
        "scenario": exp.faults,
        "events": [e.describe() for e in injector.events] if injector else [],
        "log": injector.log if injector else [],
        "deadline_s": round_deadline(exp),
        "quorum": round_quorum(exp),
        "stopped": outcome.get("stopped"),
    }
    _write_manifest(testbed, exp, exp_dir, ends, started, stressor, network_mbit, faults)
    (exp_dir / DONE).write_text(json.dumps({"seconds": time.time() - started}) + "\n")


def _signal(proc: subprocess.Popen[Any], sig: int) -> None:
    """``sig`` to ``proc``'s session (a device and anything it started), or to it alone."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            proc.send_signal(sig)


def _injector(
    testbed: BaseTestbed,
    exp: Experiment,
    ends: Endpoints,
    devices: dict[int, subprocess.Popen[Any]],
    start_device: Callable[[int], None],
) -> FaultInjector | None:
    """The fault injector of ``exp``'s scenario acting on this run, or None without faults."""
    events = parse_scenario(exp.faults, exp.clients, exp.rounds)
    if not events:
        return None

    def restart_broker(down_s: float) -> None:
        if ends.broker_server is None:
            raise ExperimentFailed(f"{exp.key}: no broker to restart")
        ends.broker_server.restart(down_s=down_s)

    actions = FaultActions(
        kill=lambda i: _signal(devices[i], signal.SIGKILL),
        stop=lambda i: _signal(devices[i], signal.SIGSTOP),
        resume=lambda i: _signal(devices[i], signal.SIGCONT),
        restart=start_device,
        link=testbed.set_link_state,
        restart_broker=restart_broker,
    )
    return FaultInjector(events, actions)


def _watch(
    testbed: BaseTestbed,
    exp: Experiment,
    progress: ProgressReader,
    server: subprocess.Popen[Any],
    devices: dict[int, subprocess.Popen[Any]],
    on_round: Callable[[int], None] | None,
    readings: list[dict[str, Any]],
    injector: FaultInjector | None = None,
    outcome: dict[str, Any] | None = None,
) -> bool:
    """Follow the server until it says done (True), or that it stopped for want of a quorum
    (True, the reason in ``outcome["stopped"]``), or ends without (False), appending the
    counters at each round boundary to ``readings`` before acknowledging the round. The
    ``injector``'s faults happen as rounds start; a device it killed is not a failure."""
    exp_dir = progress.path.parent
    limit = time.monotonic() + experiment_limit(exp)
    device_failed_at: float | None = None
    outcome = outcome if outcome is not None else {}

    def handle(events: list[dict[str, Any]]) -> bool:
        for event in events:
            if event.get("event") == "round":
                readings.extend(_counter_rows(testbed.counters(), "round", event["round"]))
                progress.ack(event["round"])
                if injector is not None and event["round"] < exp.rounds:
                    injector.round_started(event["round"] + 1)
                if on_round:
                    on_round(event["round"])
            elif event.get("event") == "stopped":
                outcome["stopped"] = event.get("reason", "stopped")
                return True
            elif event.get("event") == "done":
                return True
        return False

    # Polled: the server's only signals are its progress file and its exit.
    while server.poll() is None:
        if handle(progress.events()):
            return True
        if injector is not None:
            injector.tick()
        now = time.monotonic()
        if now > limit:
            raise ExperimentFailed(
                f"{exp.key}: not done within {experiment_limit(exp):.0f} s; the server's log "
                f"ends:\n{_tail(exp_dir / 'logs' / 'server.log')}"
            )
        killed = injector.killed if injector is not None else set()
        failed = [
            i for i, d in sorted(devices.items()) if i not in killed and d.poll() not in (None, 0)
        ]
        if failed and device_failed_at is None:
            device_failed_at = now
        if device_failed_at is not None and now - device_failed_at > DEVICE_EXIT_GRACE:
            log = exp_dir / "logs" / f"device-{failed[0]}.log"
            raise ExperimentFailed(
                f"{exp.key}: device {failed[0]} exited with {devices[failed[0]].returncode};"
                f" its log ends:\n{_tail(log)}"
            )
        time.sleep(POLL)
    return handle(progress.events())


def _write_manifest(
    testbed: BaseTestbed,
    exp: Experiment,
    exp_dir: Path,
    ends: Endpoints,
    started: float,
    stressor: Stressor | None,
    network_mbit: float,
    faults: dict[str, Any] | None = None,
) -> None:
    """The server's manifest (config, versions, host, commit) plus the experiment's setting."""
    path = exp_dir / "manifest.json"
    doc = json.loads(path.read_text()) if path.is_file() else {}
    shaping = testbed.shaping
    rate = shaping.profile.rate if testbed.shaped else None
    if testbed.shaped and exp.profile == "mixed":
        rate = None  # no one rate: each device's is in device_rate_bps
    rates = device_rates(exp, shaping.direction) if testbed.shaped else None
    doc.update(
        key=exp.key,
        experiment=exp.to_config(),
        label=testbed.label,
        shaped=testbed.shaped,
        shaping=shaping.to_config(),
        link_rate_bps={
            "downlink": rate if shaping.direction in ("both", "down") else None,
            "uplink": rate if shaping.direction in ("both", "up") else None,
        },
        device_rate_bps=rates,
        topology=exp.topology,
        links=list(exp.links),
        fanout=fanout_of(exp.protocol),
        server_url=ends.server_url,
        device_url=ends.device_url,
        device_urls=ends.device_urls,
        broker=ends.broker,
        secured=exp.security != "none",
        stress={
            "kind": exp.stress,
            "network_mbit": network_mbit if exp.stress == "network" else None,
        },
        stress_results=stressor.results() if stressor is not None else None,
        faults=faults,
        started=started,
        seconds=time.time() - started,
    )
    path.write_text(json.dumps(doc, indent=2, default=str))


# --- the matrix ----------------------------------------------------------------------------


def run_label(testbed: BaseTestbed) -> str:
    """What a whole run is labelled with: shaped namespaces, or "unshaped loopback"."""
    return "shaped links in network namespaces" if testbed.shaped else testbed.label


def _by_reason(skipped: dict[str, str]) -> dict[str, list[str]]:
    reasons: dict[str, list[str]] = {}
    for key, why in skipped.items():
        reasons.setdefault(why, []).append(key.split("_", 1)[0])
    return {why: list(dict.fromkeys(keys)) for why, keys in reasons.items()}


def _run_manifest(
    matrix: Matrix, testbed: BaseTestbed, summary: RunSummary, started: float
) -> dict[str, Any]:
    from tensorwire.fl.results import manifest

    caps = probe_capabilities()
    return manifest(
        {
            "kind": "bench-fl",
            "matrix": matrix.to_config(),
            "label": run_label(testbed),
            "shaped": testbed.shaped,
            "testbed": {
                "kind": type(testbed).__name__,
                "mode": getattr(testbed, "mode", "loopback"),
                "devices": testbed.devices,
                "server_address": testbed.server_address,
            },
            "capabilities": caps.to_config(),
            "experiments": [e.key for e in matrix.experiments()],
            "skipped": summary.skipped,
            "failed": summary.failed,
            "seconds": time.time() - started,
        }
    )


def run_matrix(
    matrix: Matrix,
    out_dir: Path,
    *,
    say: Callable[[str], None] = print,
    show_progress: bool = True,
) -> RunSummary:
    """Run every experiment of ``matrix`` not done yet in ``out_dir``, then combine the
    results, draw the figures and write the report. Ctrl-C stops after cleaning up; run
    again with the same ``out_dir`` to go on where it stopped."""
    from tensorwire.bench.fl_results import EXPERIMENTS_DIR
    from tensorwire.bench.report import build_report

    started = time.time()
    out_dir.mkdir(parents=True, exist_ok=True)
    with _testbeds(matrix.clients, say) as testbed_for:
        testbed = testbed_for(matrix.topologies[0])
        summary = RunSummary(out_dir=out_dir, label=run_label(testbed))
        summary.skipped = skip_reasons(matrix, testbed)
        for why, keys in _by_reason(summary.skipped).items():
            say(f"[yellow]skip[/] {len(keys)} experiment(s) ({', '.join(keys)}): {why}")
        manifest_path = out_dir / "manifest.json"
        manifest_path.write_text(
            json.dumps(_run_manifest(matrix, testbed, summary, started), indent=2, default=str)
        )
        todo = [e for e in matrix.experiments() if e.key not in summary.skipped]
        with _progress(show_progress) as bar:
            task = bar.add_task("experiments", total=len(todo))
            for exp in todo:
                exp_dir = out_dir / EXPERIMENTS_DIR / exp.key
                if (exp_dir / DONE).is_file():
                    summary.resumed.append(exp.key)
                    bar.advance(task)
                    continue
                what = f"{exp.protocol} {exp.model} {exp.profile}"
                what += f" loss {exp.loss:g}" if exp.loss else ""
                what += f" {exp.stress} stress" if exp.stress != "none" else ""
                what += f" up {exp.codec_label}" if exp.codec_label != "none" else ""
                bar.update(task, description=f"{what}: starting")

                def show(r: int, what: str = what, total: int = exp.rounds) -> None:
                    bar.update(task, description=f"{what}: round {r}/{total}")

                try:
                    testbed = testbed_for(exp.topology)
                    run_experiment(
                        testbed, exp, exp_dir, network_mbit=matrix.network_mbit, on_round=show
                    )
                except (TensorwireError, OSError) as exc:
                    summary.failed[exp.key] = str(exc)
                    (exp_dir / FAILED).write_text(str(exc) + "\n")
                    say(f"[red]failed[/] {exp.key}: {str(exc)[:2000]}")
                else:
                    summary.ran.append(exp.key)
                    _experiment_report(exp_dir, say)
                bar.advance(task)
        summary.seconds = time.time() - started
        manifest_path.write_text(
            json.dumps(_run_manifest(matrix, testbed, summary, started), indent=2, default=str)
        )
    summary.report = build_report([out_dir])
    summary.seconds = time.time() - started
    return summary


@contextlib.contextmanager
def _testbeds(devices: int, say: Callable[[str], None]) -> Iterator[Callable[[str], BaseTestbed]]:
    """A function of a topology giving an open testbed of it: the one open now if it has
    that topology, else (the open one closed first) a new one; all closed at the end."""
    current: list[BaseTestbed] = []

    def testbed_for(topology: str) -> BaseTestbed:
        if current and getattr(current[0], "topology", "star") in (topology, None):
            return current[0]
        if current and not current[0].shaped:
            return current[0]  # loopback has no topology: those experiments are skipped
        if current:
            current.pop().close()
        current.append(choose_testbed(devices, say, topology).open())
        return current[0]

    try:
        yield testbed_for
    finally:
        if current:
            current.pop().close()


def _experiment_report(exp_dir: Path, say: Callable[[str], None]) -> None:
    """The experiment's own figures and ``report.html`` in its directory. Its results are
    already written, so a report that cannot be drawn is said, and the matrix goes on."""
    from tensorwire.bench.report import build_report

    try:
        build_report([exp_dir])
    except Exception as exc:  # drawing is not worth the rest of the matrix
        say(f"[yellow]no report[/] for {exp_dir.name}: {type(exc).__name__}: {exc}")


@contextlib.contextmanager
def _progress(show: bool) -> Iterator[Any]:
    from tensorwire.bench.progress import progress_bar

    bar = progress_bar()
    if not show:
        bar.disable = True
    with bar:
        yield bar
