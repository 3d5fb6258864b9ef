"""``fl run --engine ray`` on a real two-node Ray cluster: the head in the testbed's server
namespace, a second node in a device namespace (a shaped link between them), so Ray binds
only the namespaces' addresses. The server runs beside the head; devices join it by URL.

Answers: devices land on both nodes and train to the same accuracy as without Ray; a device
process killed is restarted by Ray and rejoins; a node that dies has its devices restarted
on the other; a bad address is a clear error at once.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow.parquet as pq
import pytest

pytest.importorskip("torch", reason="torch is not installed (extra 'fl')")
pytest.importorskip("ray", reason="ray is not installed (extra 'ray')")

from tensorwire.fl import FLConfig
from tensorwire.fl.engines.ray import RayEngine
from tensorwire.fl.errors import EngineError
from tensorwire.fl.run import run_local
from tensorwire.testbed import Testbed, probe_capabilities
from tensorwire.testbed.base import stop_all

SRC = Path(__file__).resolve().parents[2] / "src"
RAY = shutil.which("ray", path=str(Path(sys.executable).parent))
GCS_PORT = 6379  # inside the testbed's own namespace: nothing else listens there
RUN_TIMEOUT = 420.0  # seconds a whole run may take on a loaded 2-core machine


@dataclass
class Cluster:
    testbed: Testbed
    head: subprocess.Popen
    worker: subprocess.Popen
    address: str
    temp: Path


def _ray_env() -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": str(SRC),
        "RAY_USAGE_STATS_ENABLED": "0",
        # a dead node is noticed in seconds, not the default half minute
        "RAY_health_check_period_ms": "1000",
        "RAY_health_check_timeout_ms": "1000",
        "RAY_health_check_failure_threshold": "3",
        "RAY_raylet_start_wait_time_s": "300",  # a loaded 2-core machine starts nodes slowly
    }


def _ray_start(tb: Testbed, node: str, args: list[str], log: Path) -> subprocess.Popen:
    common = [
        "--block",
        f"--node-ip-address={tb.address(node)}",
        "--num-cpus=1",
        "--object-store-memory=80000000",
        "--disable-usage-stats",
    ]
    with log.open("wb") as out:
        return tb.popen(
            node, [str(RAY), "start", *args, *common], env=_ray_env(), stdout=out, stderr=out
        )


def _alive_nodes(cluster: Cluster) -> int:
    probe = (
        "import ray, sys; ray.init(address=sys.argv[1], log_to_driver=False, "
        "configure_logging=False); print(sum(n['Alive'] for n in ray.nodes()))"
    )
    argv = cluster.testbed.command("srv", [sys.executable, "-c", probe, cluster.address])
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=_ray_env())
    except subprocess.TimeoutExpired:  # a head too busy to answer: asked again
        return 0
    return int(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 else 0


def _wait_for_nodes(c: Cluster, n: int, log: Path) -> None:
    deadline = time.monotonic() + 300
    while _alive_nodes(c) < n:  # polled: a joining node tells no one but the head
        assert time.monotonic() < deadline, log.read_text()[-2000:]
        assert c.worker.poll() is None and c.head.poll() is None, log.read_text()[-2000:]
        time.sleep(1)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    if RAY is None:
        pytest.skip("the ray command is not installed beside this Python")
    caps = probe_capabilities()
    if caps.mode != "root":
        pytest.skip(f"two Ray nodes need named network namespaces: {caps['netns'].reason}")
    temp = Path(tempfile.mkdtemp(prefix="twray-"))  # short: Ray's socket paths must fit 107 bytes
    with Testbed(devices=1, profile="lan") as tb:
        address = f"{tb.server_address}:{GCS_PORT}"
        head = _ray_start(
            tb,
            "srv",
            ["--head", f"--port={GCS_PORT}", "--include-dashboard=false", f"--temp-dir={temp}"],
            tmp_path / "head.log",
        )
        worker = None
        try:
            deadline = time.monotonic() + 180
            while not tb._listening(tb.node("srv"), GCS_PORT, "tcp"):  # polled: no other sign
                assert head.poll() is None, (tmp_path / "head.log").read_text()[-2000:]
                assert time.monotonic() < deadline, "the Ray head did not listen in 180 s"
                time.sleep(0.5)
            c = Cluster(tb, head, head, address, temp)
            _wait_for_nodes(c, 1, tmp_path / "head.log")  # the head registered itself
            c.worker = worker = _ray_start(
                tb, "dev1", [f"--address={address}"], tmp_path / "node2.log"
            )
            _wait_for_nodes(c, 2, tmp_path / "node2.log")
            yield c
        finally:
            stop_all([p for p in (worker, head) if p is not None])
            left = _ray_processes(temp)
            shutil.rmtree(temp, ignore_errors=True)
    assert not left, "Ray processes of this cluster outlived it"


def _ray_processes(temp: Path) -> list[int]:
    """Processes whose command line names this cluster's temporary directory."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if str(temp) in (entry / "cmdline").read_bytes().decode(errors="replace"):
                    found.append(int(entry.name))
    return found


def _cfg(**over) -> FLConfig:
    settings = dict(
        dataset="synthetic",
        model="mlp",
        clients=4,
        rounds=3,
        batch_size=20,
        seed=7,
        join_timeout=300,
        round_timeout=300,
    )
    return FLConfig(**(settings | over))


def _fl_run(cluster: Cluster, cfg: FLConfig, out: Path, *extra: str) -> subprocess.Popen:
    """``fl run --engine ray`` in the server namespace, serving at the server's address."""
    argv = [
        sys.executable, "-m", "tensorwire", "fl", "run", "--engine", "ray",
        "--ray-address", cluster.address, "--ray-nodes", "2",
        "--url", f"tcp://{cluster.testbed.server_address}:0", "--out", str(out),
        "--dataset", cfg.dataset, "--model", cfg.model, "--clients", str(cfg.clients),
        "--rounds", str(cfg.rounds), "--epochs", str(cfg.epochs),
        "--batch-size", str(cfg.batch_size),
        "--seed", str(cfg.seed), "--min-updates", str(cfg.min_updates),
        "--join-timeout", str(cfg.join_timeout), "--round-timeout", str(cfg.round_timeout),
        *extra,
    ]  # fmt: skip
    log = (out.parent / f"{out.name}.log").open("wb")
    return cluster.testbed.popen("srv", argv, env=_ray_env(), stdout=log, stderr=log)


def _finish(proc: subprocess.Popen, out: Path) -> dict:
    try:
        code = proc.wait(timeout=RUN_TIMEOUT)
    except subprocess.TimeoutExpired:
        stop_all([proc])
        code = None
    log = (out.parent / f"{out.name}.log").read_text(errors="replace")
    assert code == 0, log[-3000:]
    return json.loads((out / "manifest.json").read_text())


def _rounds(out: Path) -> list[dict]:
    return pq.read_table(out / "rounds.parquet").to_pylist()


@pytest.mark.timeout(900)
def test_devices_run_on_both_nodes_and_train_as_without_ray(cluster, tmp_path):
    cfg = _cfg()
    manifest = _finish(_fl_run(cluster, cfg, tmp_path / "ray-run"), tmp_path / "ray-run")
    placement = manifest["placement"]
    assert placement["engine"] == "ray"
    ips = {where["ip"] for runs in placement["devices"].values() for where in runs}
    assert ips == {cluster.testbed.address("srv"), cluster.testbed.address("dev1")}
    assert sorted(placement["devices"]) == [f"device-{i}" for i in range(1, 5)]
    with_ray = _rounds(tmp_path / "ray-run")
    without, _ = run_local(cfg, "tcp", out_dir=tmp_path / "local-run")
    assert [r["accuracy"] for r in with_ray] == [r["accuracy"] for r in without.rounds]
    assert [r["test_loss"] for r in with_ray] == [r["test_loss"] for r in without.rounds]
    assert with_ray[-1]["accuracy"] > 0.2  # ten classes: chance is 0.1


def _actor_pids(cluster: Cluster) -> list[int]:
    """The device processes (Ray actors) running on the second node (in its namespace)."""
    netns = os.readlink(f"/proc/{cluster.worker.pid}/ns/net")
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                title = (entry / "cmdline").read_bytes()[:64]
                if b"DeviceHost" in title and os.readlink(entry / "ns" / "net") == netns:
                    pids.append(int(entry.name))
    return pids


def _titles(cluster: Cluster) -> list[str]:
    """What runs in the second node's namespace (to say why no device process was found)."""
    netns = os.readlink(f"/proc/{cluster.worker.pid}/ns/net")
    found = []
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            if entry.name.isdigit() and os.readlink(entry / "ns" / "net") == netns:
                found.append((entry / "cmdline").read_bytes()[:48].decode(errors="replace"))
    return found


def _wait_rounds(out: Path, n: int, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + RUN_TIMEOUT
    while time.monotonic() < deadline and proc.poll() is None:  # polled: rounds land on disk
        with contextlib.suppress(OSError, ValueError):
            if (out / "rounds.parquet").is_file() and len(_rounds(out)) >= n:
                return
        time.sleep(0.2)
    raise AssertionError(f"fewer than {n} rounds in {out} (run ended: {proc.poll()})")


# Rounds long enough (seconds each, longer on a loaded machine) that the run is still going
# when a test has seen round 1 and kills something: at one epoch the mlp's four rounds end
# within a second, before the test looks (which once read as "no device on the second node").
SLOW_EPOCHS = 150


@pytest.mark.timeout(900)
def test_a_killed_device_process_is_restarted_by_ray_and_rejoins(cluster, tmp_path):
    """Quorum of all 4: no round goes on without the killed device, so it must come back."""
    cfg = _cfg(rounds=4, min_updates=4, epochs=SLOW_EPOCHS)
    out = tmp_path / "run"
    proc = _fl_run(cluster, cfg, out, "--max-restarts", "2")
    _wait_rounds(out, 1, proc)
    victims = _actor_pids(cluster)
    assert victims, f"no device process on the second node: {_titles(cluster)}"
    os.kill(victims[0], signal.SIGKILL)
    manifest = _finish(proc, out)
    runs = {cid: r for cid, r in manifest["placement"]["devices"].items() if len(r) > 1}
    assert len(runs) == 1, manifest["placement"]
    ((cid, seen),) = runs.items()
    assert seen[0]["pid"] == victims[0] and seen[1]["pid"] != victims[0]
    rounds = _rounds(out)
    assert len(rounds) == 4 and rounds[-1]["status"] == "aggregated"
    assert cid in rounds[-1]["applied"]
    events = pq.read_table(out / "events.parquet").to_pylist()
    assert sum(e["kind"] == "joined" and e["device"] == cid for e in events) >= 2


@pytest.mark.timeout(900)
def test_a_node_that_dies_has_its_devices_restarted_on_the_other(cluster, tmp_path):
    cfg = _cfg(rounds=4, min_updates=4, epochs=SLOW_EPOCHS)
    out = tmp_path / "run"
    proc = _fl_run(cluster, cfg, out, "--max-restarts", "2")
    _wait_rounds(out, 1, proc)
    stop_all([cluster.worker])  # the second node, every process of it
    manifest = _finish(proc, out)
    srv, dev1 = cluster.testbed.address("srv"), cluster.testbed.address("dev1")
    moved = [
        cid for cid, seen in manifest["placement"]["devices"].items()
        if seen[0]["ip"] == dev1 and seen[-1]["ip"] == srv
    ]  # fmt: skip
    assert moved, manifest["placement"]
    rounds = _rounds(out)
    assert len(rounds) == 4 and set(moved) <= set(rounds[-1]["applied"])


def test_a_bad_ray_address_is_a_clear_error_at_once(tmp_path):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, never listening: connections are refused
        engine = RayEngine(_cfg(), address=f"127.0.0.1:{port}")
        started = time.monotonic()
        with pytest.raises(EngineError, match=rf"no Ray cluster answers at '127.0.0.1:{port}'"):
            engine.start("tcp://127.0.0.1:1")
    assert time.monotonic() - started < 30
    engine.stop()
