"""Runs that keep going: devices killed (SIGKILL), hung (SIGSTOP) and restarted as real
processes on tcp and mqtt, and a server killed after round 3 of 5 and resumed.

Both are measured against one fault-free run of the same settings (4 devices, digits,
VGG-5). Training is deterministic (each device's round depends on seed, device and round
only), so the resumed run must reach the fault-free run's accuracy exactly, and the faulty
run, which aggregates fewer updates, must come within 2 points of it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pyarrow.parquet as pq
import pytest

pytest.importorskip("torch", reason="torch is not installed (extra 'fl')")

from tensorwire.fl import FLConfig, run_client, run_server
from tensorwire.fl.run import device_command
from tensorwire.transports import KNOWN_TRANSPORTS, local_hub_url

DEADLINE = 30.0  # seconds: a round with a hung device ends here (others take ~3-10 s)
CFG = dict(
    dataset="digits",
    model="vgg5",
    clients=4,
    rounds=5,
    batch_size=20,
    min_updates=3,
    downlink="delta",
    round_timeout=DEADLINE,
    join_timeout=180.0,
)
SLACK = 20.0  # seconds past the deadline a round may take to end (evaluation, checkpoint)

pytestmark = pytest.mark.slow

T = TypeVar("T")


@pytest.fixture(scope="module")
def fault_free() -> list[dict]:
    """The rounds of the run without faults (devices as threads here: training is the same)."""
    cfg = FLConfig(**CFG)
    threads: list[threading.Thread] = []

    def spawn(url: str) -> None:
        for i in range(1, 5):
            t = threading.Thread(
                target=run_client, args=(url, f"device-{i}"), kwargs={"timeout": 120}, daemon=True
            )
            t.start()
            threads.append(t)

    result = run_server("tcp://127.0.0.1:0", cfg, on_ready=spawn)
    for t in threads:
        t.join(30)
    assert [r["status"] for r in result.rounds] == ["aggregated"] * 5
    assert [r["updates"] for r in result.rounds] == [4] * 5
    return result.rounds


class Devices:
    """Device processes, by number, with their logs; stopped and killed at the end."""

    def __init__(self, logs: Path, timeout: float = 180.0) -> None:
        self.logs, self.timeout = logs, timeout
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self.starts = 0
        self.url = ""

    def start(self, i: int) -> None:
        self.starts += 1
        log = (self.logs / f"device-{i}-{self.starts}.log").open("wb")
        self.procs[i] = subprocess.Popen(
            device_command(self.url, i, self.timeout), stdout=log, stderr=subprocess.STDOUT
        )

    def signal(self, i: int, sig: int) -> None:
        self.procs[i].send_signal(sig)

    def stop(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGCONT)
        deadline = time.monotonic() + 30
        for p in self.procs.values():
            try:
                p.wait(timeout=max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def _protocols() -> list:
    return [
        p if p in KNOWN_TRANSPORTS else pytest.param(p, marks=pytest.mark.skip(f"no {p}://"))
        for p in ("tcp", "mqtt")
    ]


@pytest.mark.parametrize("protocol", _protocols())
def test_killed_hung_and_restarted_devices_do_not_stop_the_run(protocol, tmp_path, fault_free):
    """device-1 killed in round 2, device-2 hung in round 3 (quorum 3 of 4), device-1
    restarted for round 4, device-2 woken for round 5."""
    devices = Devices(tmp_path)
    timers: list[threading.Timer] = []

    def spawn(url: str) -> None:
        devices.url = url
        for i in range(1, 5):
            devices.start(i)

    def on_round(row: dict) -> None:
        r = row["round"]
        if r == 1:  # killed once round 2 is under way
            # frozen now, so a timer that fires late on a busy machine cannot let its round-2
            # update out first; killed half a second later
            devices.signal(1, signal.SIGSTOP)
            timers.append(threading.Timer(0.5, devices.signal, (1, signal.SIGKILL)))
            timers[-1].start()
        elif r == 2:
            devices.signal(2, signal.SIGSTOP)
        elif r == 3:
            devices.start(1)
        elif r == 4:
            devices.signal(2, signal.SIGCONT)

    try:
        with local_hub_url(protocol) as url:
            result = run_server(
                url, FLConfig(**CFG), on_ready=spawn, on_round=on_round, out_dir=tmp_path / "run"
            )
    finally:
        for t in timers:
            t.cancel()
        devices.stop()
    rounds = {r["round"]: r for r in pq.read_table(tmp_path / "run" / "rounds.parquet").to_pylist()}
    assert sorted(rounds) == [1, 2, 3, 4, 5]  # every round completes
    r2, r3, r4 = rounds[2], rounds[3], rounds[4]
    assert r2["status"] == "aggregated" and r2["updates"] == 3
    assert "device-1" not in r2["applied"]
    assert r2["round_s"] < DEADLINE + SLACK
    # the hung device holds round 3 up to its deadline, not longer; 2 of 3 is short of quorum
    assert "device-2" in r3["missing"]
    assert DEADLINE <= r3["round_s"] < DEADLINE + SLACK
    assert r3["ended"] == "deadline" and r3["status"] == "no-quorum"
    # the killed device, restarted, rejoins and trains, from the whole model
    assert "device-1" in r4["applied"]
    updates = pq.read_table(tmp_path / "run" / "updates.parquet").to_pylist()
    rejoined = [u for u in updates if u["round"] == 4 and u["device"] == "device-1"]
    assert rejoined and rejoined[0]["model_sent"] == "full"
    late = [u for u in updates if u["device"] == "device-2" and u["status"] == "late"]
    assert late and late[0]["round"] == 3  # the hung device's update, once woken: recorded
    events = pq.read_table(tmp_path / "run" / "events.parquet").to_pylist()
    assert any(e["kind"] == "left" and e["device"] == "device-1" for e in events)
    final = result.rounds[-1]["accuracy"]
    assert abs(final - fault_free[-1]["accuracy"]) <= 0.02, (final, fault_free[-1]["accuracy"])


def _server(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "tensorwire", "fl", "server", *args]
    return subprocess.Popen(cmd, stdout=log.open("ab"), stderr=subprocess.STDOUT)


def _progress(progress: Path) -> list[dict]:
    """The events the server wrote so far (a line being written is left out)."""
    try:
        lines = progress.read_text().splitlines()
    except OSError:
        return []
    return [json.loads(x) for x in lines if x.endswith("}")]


def _rounds_done(progress: Path) -> int:
    return max((e["round"] for e in _progress(progress) if "round" in e), default=0)


def _served_at(progress: Path) -> str | None:
    """The URL the server's hub listens at, once it does."""
    return next((e["url"] for e in _progress(progress) if e["event"] == "ready"), None)


def _poll(check: Callable[[], T], server: subprocess.Popen[bytes], timeout: float, what: str) -> T:
    """Poll ``check()`` until it holds or the server exits; what it returned last."""
    deadline = time.monotonic() + timeout
    while not (value := check()) and server.poll() is None:
        assert time.monotonic() < deadline, f"{what} never came"
        time.sleep(0.05)
    return value


def test_a_server_killed_after_round_3_resumes_to_the_same_accuracy(tmp_path, fault_free):
    """SIGKILL the server once round 3 is written, and two of the devices; resume it, restart
    those two (the other two reconnect by themselves): rounds 4 and 5 are those of the run
    that was never stopped."""
    run, logs = tmp_path / "run", tmp_path / "logs"
    logs.mkdir()
    progress = run / "progress.jsonl"
    options = [
        "--dataset", "digits", "--model", "vgg5", "--clients", "4",
        "--rounds", "5", "--batch-size", "20", "--min-updates", "3", "--downlink", "delta",
        "--round-timeout", "300", "--join-timeout", "180", "--progress", str(progress),
    ]  # fmt: skip
    devices = Devices(logs, timeout=60)
    server = _server(
        ["--url", "tcp://127.0.0.1:0", *options, "--out", str(run)], logs / "server-1.log"
    )
    try:
        url = _poll(lambda: _served_at(progress), server, 120, "the server's URL")
        assert url, (logs / "server-1.log").read_text()[-2000:]
        devices.url = url
        for i in range(1, 5):
            devices.start(i)
        _poll(lambda: _rounds_done(progress) >= 3, server, 600, "the end of round 3")
        server.kill()  # SIGKILL: no goodbye, no final write
        server.wait()
        for i in (3, 4):  # killed too; devices 1 and 2 stay up and find the server again
            devices.signal(i, signal.SIGKILL)
            devices.procs[i].wait()
        assert _rounds_done(progress) == 3, (logs / "server-1.log").read_text()[-2000:]
        assert len(pq.read_table(run / "rounds.parquet")) == 3  # what finished, on disk
        # at the port the killed server held, where devices 1 and 2 look for it
        server = _server(
            ["--url", url, "--resume", str(run), "--progress", str(progress)],
            logs / "server-2.log",
        )
        for i in (3, 4):  # restarted: nothing of the first run in memory
            devices.start(i)
        server.wait(timeout=600)
        assert server.returncode == 0, (logs / "server-2.log").read_text()[-3000:]
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
        devices.stop()
    rounds = pq.read_table(run / "rounds.parquet").to_pylist()
    assert [r["round"] for r in rounds] == [1, 2, 3, 4, 5]
    assert [round(r["accuracy"], 3) for r in rounds] == [
        round(r["accuracy"], 3) for r in fault_free
    ]
    assert rounds[-1]["test_loss"] == pytest.approx(fault_free[-1]["test_loss"], rel=1e-4)
    assert all(len(r["applied"]) == 4 for r in rounds)  # survivors and restarted alike
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["resumed"][0]["after_round"] == 3
    assert os.path.isdir(run / "checkpoints" / "round-000005")
