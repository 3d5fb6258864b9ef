"""``tensorwire bench fl --faults``: scenarios parsed and refused, the injector's schedule, and
for real on the namespace testbed a device killed and restarted, a link flapped, the broker
restarted, each beside the same run without faults in the report; and ``--resume`` going on
from an interrupted experiment's last server checkpoint.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

pytest.importorskip("torch", reason="torch is not installed (extra 'fl')")

from ctrl_c import heed_sigint
from made_once import made_once
from tensorwire.bench.fl import DONE, fault_problem, protocol_problem, round_deadline
from tensorwire.bench.fl_faults import (
    FaultActions,
    FaultInjector,
    FaultSpecError,
    parse_scenario,
)
from tensorwire.bench.fl_matrix import Experiment, Matrix
from tensorwire.testbed import LoopbackTestbed, probe_capabilities

# --- scenarios ------------------------------------------------------------------------------


def test_events_take_devices_from_the_last_and_never_one_twice():
    kill, hang = parse_scenario("kill@2-4+hang@3", clients=4, rounds=5)
    assert (kill.kind, kill.round, kill.devices, kill.until) == ("kill", 2, (4,), 4)
    assert (hang.kind, hang.round, hang.devices, hang.until) == ("hang", 3, (3,), None)
    (flap,) = parse_scenario("flap2@3:4s", clients=4, rounds=5)
    assert flap.devices == (4, 3) and flap.seconds == 4.0
    (broker,) = parse_scenario("broker@2", clients=4, rounds=5)
    assert broker.devices == () and broker.seconds == 2.0
    assert parse_scenario("none", 4, 5) == ()
    assert "restarted in round 4" in kill.describe()


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("kill@1", "round 1 is when devices join"),
        ("kill@6", "not in 2..5"),
        ("kill5@2", "only 4 of 4"),
        ("kill3@2+hang2@3", "only 1 of 4"),
        ("hang@2:3s", "only flap and broker take :SECONDS"),
        ("flap@2-3", "only kill and hang take -BACK"),
        ("kill@3-3", "a round after 3"),
        ("broker2@2", "one broker"),
        ("reboot@2", "kind one of kill, hang, flap, broker"),
        ("kill@two", "kind[N]@ROUND"),
    ],
)
def test_a_scenario_that_cannot_happen_is_refused_with_why(text, says):
    with pytest.raises(FaultSpecError, match=None) as err:
        parse_scenario(text, clients=4, rounds=5)
    assert says in str(err.value)
    with pytest.raises(ValueError):  # and the matrix refuses it before anything starts
        Matrix(protocols=("tcp",), faults=(text,), rounds=5)


def test_the_injector_acts_when_rounds_start_and_undoes_what_is_left_at_the_end():
    now = [100.0]
    done: list[tuple] = []
    actions = FaultActions(
        kill=lambda i: done.append(("kill", i)),
        stop=lambda i: done.append(("stop", i)),
        resume=lambda i: done.append(("cont", i)),
        restart=lambda i: done.append(("start", i)),
        link=lambda i, up: done.append(("up" if up else "down", i)),
        restart_broker=lambda s: done.append(("broker", s)),
    )
    events = parse_scenario("kill@2-4+hang@3+flap@3:10s+broker@2", clients=4, rounds=5)
    injector = FaultInjector(events, actions, after_s=1.0, clock=lambda: now[0])
    injector.round_started(2)
    injector.tick()
    assert done == []  # not yet: 1 s into the round
    now[0] += 1.0
    injector.tick()
    for thread in injector._threads:
        thread.join(5)
    assert ("kill", 4) in done and ("broker", 2.0) in done
    assert injector.killed == {4}
    injector.round_started(3)
    now[0] += 1.0
    injector.tick()
    assert done[-2:] == [("stop", 3), ("down", 2)]
    injector.round_started(4)
    injector.tick()
    assert done[-1] == ("start", 4) and injector.killed == set()
    injector.finish()  # the hung device goes on and the link comes up, though not due yet
    assert sorted(done[-2:]) == [("cont", 3), ("up", 2)]
    logged = [row["action"] for row in injector.log]
    assert "round 2: kill device 4" in logged and "round 4: restart device 4" in logged


def test_keys_name_the_faults_and_a_broker_fault_needs_a_broker():
    free = Experiment(protocol="tcp", rounds=4, quorum=3)
    faulty = Experiment(protocol="tcp", rounds=4, quorum=3, faults="kill@2")
    assert free.key != faulty.key and "faults-kill-2" in faulty.key and "_q3_" in faulty.key
    assert round_deadline(free) == 600.0
    assert 30.0 < round_deadline(faulty) < 600.0  # from the model's size and the link
    loopback = LoopbackTestbed(devices=4)
    broker = Experiment(protocol="tcp", rounds=4, faults="broker@2")
    assert "no broker to restart" in (fault_problem(broker, loopback) or "")
    flap = Experiment(protocol="tcp", rounds=4, faults="flap@2")
    assert "namespace testbed" in (fault_problem(flap, loopback) or "")


# --- for real -------------------------------------------------------------------------------


def _namespaces() -> None:
    caps = probe_capabilities()
    if caps.mode is None:
        pytest.skip(f"no network namespaces here: {caps['netns'].reason}")
    if not caps.has("tbf"):
        pytest.skip(f"no rate shaping here: {caps['tbf'].reason}")


def _bench(out: Path, *args: str, timeout: float = 600) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "tensorwire", "bench", "fl", "--out", str(out), "--yes", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


SMALL = ("--models", "vgg5", "--profiles", "4g", "--dataset", "synthetic", "--clients", "3")


def _faults_run(tmp_path_factory, protocol: str, faults: str) -> tuple[Path, str]:
    """One run for every worker that takes a test that reads it."""
    _namespaces()

    def make(where: Path) -> str:
        args = ("--protocols", protocol, *SMALL, "--rounds", "5", "--quorum", "3")
        return _bench(where / "run", *args, "--faults", faults)

    where, stdout = made_once(tmp_path_factory, f"faults-{protocol}", make)
    return where / "run", stdout


# two runs (a fixture each, so that two workers can make them at once): tcp with a device killed
# and a link flapped (and the broker case, which tcp has no broker for), mqtt with its broker
# restarted; each beside its fault-free twin
@pytest.fixture(scope="module")
def tcp_faults(tmp_path_factory) -> tuple[Path, str]:
    return _faults_run(tmp_path_factory, "tcp", "none,kill@2-3+flap@2:3s,broker@2")


@pytest.fixture(scope="module")
def mqtt_faults(tmp_path_factory) -> tuple[Path, str]:
    problem = protocol_problem("mqtt")
    if problem is not None:
        pytest.skip(f"mqtt is not available here: {problem}")
    return _faults_run(tmp_path_factory, "mqtt", "none,broker@2")


def _experiment(out: Path, protocol: str, faults: str) -> Path:
    failed = {
        d.name: (d / "failed").read_text()[:3000]
        for d in (out / "experiments").iterdir()
        if (d / "failed").is_file()
    }
    found = [
        d
        for d in (out / "experiments").iterdir()
        if d.name.startswith(f"{protocol}_")
        and json.loads((d / "manifest.json").read_text()).get("experiment", {}).get("faults")
        == faults
    ]
    assert len(found) == 1 and not failed, (failed, sorted(d.name for d in out.glob("*/*")))
    return found[0]


@pytest.mark.slow
def test_a_killed_device_comes_back_and_a_flapped_link_recovers(tcp_faults):
    out, stdout = tcp_faults
    assert "no broker to restart" in stdout  # tcp's broker case is skipped, and said
    exp_dir = _experiment(out, "tcp", "kill@2-3+flap@2:3s")
    assert (exp_dir / DONE).is_file()
    doc = json.loads((exp_dir / "manifest.json").read_text())["faults"]
    actions = [row["action"] for row in doc["log"]]
    for action in ("kill device 3", "link of device 2 down", "link of device 2 up"):
        assert any(action in a for a in actions), actions
    assert any("restart device 3" in a for a in actions), actions
    rounds = pd.read_parquet(exp_dir / "rounds.parquet")
    assert list(rounds["round"]) == [1, 2, 3, 4, 5]  # every round ran
    # a quorum of all 3: round 2 lost one and kept the model; round 3 waited for device 3
    assert list(rounds["status"]) == ["aggregated", "no-quorum", *["aggregated"] * 3]
    assert "device-3" in rounds.iloc[1]["left"]
    log = (exp_dir / "logs" / "device-3.log").read_text()
    assert log.count("set up in") == 2  # the first process and the restarted one
    trained = re.search(r"device-3: trained (\d+) rounds", log)
    assert trained and int(trained[1]) >= 1, log[-2000:]  # it rejoined and trained
    assert any("device-3" in list(r) for r in rounds["applied"].iloc[3:])


@pytest.mark.slow
def test_a_broker_restart_costs_time_not_the_run(mqtt_faults):
    out, _ = mqtt_faults
    exp_dir = _experiment(out, "mqtt", "broker@2")
    doc = json.loads((exp_dir / "manifest.json").read_text())["faults"]
    actions = [row["action"] for row in doc["log"]]
    assert any("restart the broker" in a for a in actions) and "broker back" in actions
    rounds = pd.read_parquet(exp_dir / "rounds.parquet")
    assert list(rounds["round"]) == [1, 2, 3, 4, 5]
    assert (rounds["status"] == "aggregated").all()
    from tensorwire.bench.fault_report import fault_table

    (row,) = fault_table([out]).to_dict("records")  # beside its fault-free twin in the report
    assert row["time_free_s"] > 0 and row["x_time"] > 0, row


@pytest.mark.slow
def test_the_report_sets_each_faulty_run_beside_its_fault_free_twin(tcp_faults):
    out, _ = tcp_faults
    report = (out / "report.html").read_text()
    assert "<section id='faults'>" in report
    assert "all 5 rounds ran" in report and "without faults" in report
    from tensorwire.bench.fault_report import fault_table

    table = fault_table([out])
    assert len(table) == 1  # tcp's kill + flap (its broker case is skipped)
    assert table["time_free_s"].notna().all() and table["x_time"].notna().all()


@pytest.mark.slow
def test_an_interrupted_experiment_resumes_from_its_checkpoint(tmp_path):
    _namespaces()
    out = tmp_path / "run"
    args = [*SMALL, "--protocols", "tcp", "--rounds", "4"]
    cmd = [sys.executable, "-m", "tensorwire", "bench", "fl", "--out", str(out), "--yes", *args]
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        preexec_fn=heed_sigint,  # SIGINT as a terminal's Ctrl-C finds it
    )
    try:
        deadline = time.monotonic() + 300
        rounds_seen = 0
        while time.monotonic() < deadline and proc.poll() is None and rounds_seen < 2:
            progress = list((out / "experiments").glob("*/progress.jsonl"))
            if progress:
                text = progress[0].read_text()
                rounds_seen = text.count('"event": "round"')
            time.sleep(0.2)
        assert rounds_seen >= 2, "the run never reached round 2"
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    (exp_dir,) = (out / "experiments").iterdir()
    assert not (exp_dir / DONE).exists()
    assert list((exp_dir / "checkpoints").glob("round-*"))
    stdout = _bench(out, "--resume", str(out))
    assert "1 experiment(s) run" in stdout
    manifest = json.loads((exp_dir / "manifest.json").read_text())
    assert manifest.get("resumed"), "the server did not go on from its checkpoint"
    assert manifest["resumed"][0]["after_round"] >= 2
    rounds = pd.read_parquet(exp_dir / "rounds.parquet")
    assert list(rounds["round"]) == [1, 2, 3, 4]
