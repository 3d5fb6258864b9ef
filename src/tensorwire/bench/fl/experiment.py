"""One experiment on an open testbed: its server and devices as processes, its stressor and
faults, the counters read at each round boundary, and its directory's results."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pandas as pd

from tensorwire.bench.fl.commands import (
    JOIN_TIMEOUT,
    device_command,
    experiment_limit,
    round_deadline,
    round_quorum,
    server_command,
)
from tensorwire.bench.fl.endpoints import Endpoints, device_rates, endpoints, enrol
from tensorwire.bench.fl_faults import (
    FaultActions,
    FaultInjector,
    parse_scenario,
)
from tensorwire.bench.fl_matrix import Experiment, fanout_of
from tensorwire.errors import TensorwireError
from tensorwire.testbed import (
    Counters,
    Stressor,
    cpu_stress,
    network_stress,
)
from tensorwire.testbed.base import BaseTestbed, stop_all

DEVICE_EXIT_GRACE = 30.0  # seconds the server gets to notice a failed device and end

POLL = 0.01  # seconds between looks at the processes and the progress file

DONE = "done"

FAILED = "failed"


class ExperimentFailed(TensorwireError, RuntimeError):
    """An experiment's server or devices failed or ran out of time; the message says why."""


class ProgressReader:
    """New events of a server's ``progress.jsonl`` (whole lines only), and its ``.ack``."""

    def __init__(self, path: Path, from_end: bool = False) -> None:
        self.path = path
        self.ack_path = path.with_name(path.name + ".ack")
        self._offset = path.stat().st_size if from_end and path.is_file() else 0
        self._partial = b""
        self._pending: list[dict[str, Any]] = []

    def events(self) -> list[dict[str, Any]]:
        pending, self._pending = self._pending, []
        return pending + self._read()

    def wait_for(self, name: str, server: subprocess.Popen[Any], timeout: float) -> dict[str, Any]:
        """The server's first ``name`` event (the others stay to be read); ExperimentFailed
        if the server exits or ``timeout`` seconds pass first."""
        limit = time.monotonic() + timeout
        while True:
            events = self.events()
            found = next((e for e in events if e.get("event") == name), None)
            if found is not None:
                events.remove(found)
                self._pending = events
                return found
            self._pending = events
            if server.poll() is not None or time.monotonic() > limit:
                if server.poll() is None:
                    why = f"did not say {name} within {timeout:.0f} s"
                else:
                    why = f"exited with {server.returncode}"
                log = _tail(self.path.parent / "logs" / "server.log")
                raise ExperimentFailed(f"the server {why}; its log ends:\n{log}")
            time.sleep(POLL)

    def _read(self) -> list[dict[str, Any]]:
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
            progress = ProgressReader(exp_dir / "progress.jsonl", from_end=resume)
            with open(logs / "server.log", "ab") as log:
                server = testbed.popen(
                    "srv",
                    server_command(exp, ends.server_url, exp_dir, certs, resume),
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=env,
                )
            processes.append(server)
            if ends.bound is not None:
                # listening on a port the kernel gave it: the devices learn which from it
                ready = progress.wait_for("ready", server, JOIN_TIMEOUT)
                ends = ends.bound(urlsplit(ready["url"]).port or 0)
            # Devices start with the server where its port is known: each retries
            # connecting until the hub is up, so their torch import overlaps the server's.
            for i in range(1, len(testbed.device_nodes) + 1):
                start_device(i)
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
