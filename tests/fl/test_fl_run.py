"""Whole runs: server here, devices as real processes (or threads where only training
matters), over real transports; what a run writes; a device that crashes."""

from __future__ import annotations

import json
import subprocess
import sys
import threading

import pyarrow.parquet as pq
import pytest

pytest.importorskip("torch", reason="torch is not installed (extra 'fl')")

from tensorwire.fl import FLConfig, QuorumLost, run_client, run_server
from tensorwire.fl.run import run_local
from tensorwire.transports import KNOWN_TRANSPORTS


def _protocols() -> list:
    marks = []
    for p in ("tcp", "mqtt"):
        if p in KNOWN_TRANSPORTS:
            marks.append(p)
        else:
            marks.append(pytest.param(p, marks=pytest.mark.skip(reason=f"{p}:// not registered")))
    return marks


@pytest.mark.parametrize("protocol", _protocols())
def test_two_rounds_two_devices_learn_and_record_everything(protocol, tmp_path):
    cfg = FLConfig(
        dataset="synthetic", model="vgg5", clients=2, rounds=2, batch_size=50, round_timeout=300
    )
    _, out = run_local(cfg, protocol, out_dir=tmp_path / "run")
    rounds = pq.read_table(out / "rounds.parquet").to_pylist()
    assert [r["round"] for r in rounds] == [1, 2]
    assert rounds[1]["test_loss"] < rounds[0]["test_loss"]
    assert all(0.0 <= r["accuracy"] <= 1.0 for r in rounds)
    assert rounds[-1]["accuracy"] > 0.2  # ten classes: chance is 0.1
    assert [r["applied"] for r in rounds] == [["device-1", "device-2"]] * 2
    transfers = pq.read_table(out / "transfers.parquet").to_pylist()
    # per round and device: downlink seen by server and device, uplink seen by both
    keys = {(t["round"], t["device"], t["direction"], t["side"]) for t in transfers}
    for r in (1, 2):
        for d in ("device-1", "device-2"):
            for direction in ("downlink", "uplink"):
                for side in ("server", "device"):
                    assert (r, d, direction, side) in keys
    for t in transfers:
        assert t["bytes_raw"] > 0 and t["bytes_encoded"] > 0 and t["wall_s"] > 0
        assert t["payload"] == ("model" if t["direction"] == "downlink" else "update")
    updates = pq.read_table(out / "updates.parquet").to_pylist()
    assert {(u["round"], u["device"], u["status"]) for u in updates} == {
        (r, d, "applied") for r in (1, 2) for d in ("device-1", "device-2")
    }
    events = pq.read_table(out / "events.parquet").to_pylist()
    assert {e["device"] for e in events if e["kind"] == "joined"} == {"device-1", "device-2"}
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["config"]["rounds"] == 2 and manifest["outcome"] == "done"
    assert (out / "checkpoints" / "round-000002" / "state.json").is_file()


CRASH = """
import os, sys, tensorwire
ch = tensorwire.connect(sys.argv[1], client_id="device-2", timeout=60)
while True:
    msg = ch.recv(timeout=120)
    if msg.meta.get("fl") == "setup":
        ch.send(None, {"fl": "ready", "nonce": "crashy"})
    elif msg.meta.get("fl") == "round":
        os._exit(3)  # dies with the model in hand
"""


def test_a_crashed_device_is_named_when_too_few_remain_and_results_survive(tmp_path):
    """Quorum 2 of 2: device-2 dies in round 1, so round 1 keeps the model and the run stops
    at round 2 with an error naming device-2 and why; round 1 is on disk."""
    procs: list[subprocess.Popen] = []
    threads: list[threading.Thread] = []

    def spawn(url: str) -> None:
        procs.append(subprocess.Popen([sys.executable, "-c", CRASH, url]))
        threads.append(threading.Thread(target=run_client, args=(url, "device-1"), daemon=True))
        threads[0].start()

    cfg = FLConfig(
        dataset="synthetic",
        model="vgg5",
        clients=2,
        rounds=3,
        min_updates=2,
        round_timeout=120,
        join_timeout=12,
    )
    try:
        with pytest.raises(QuorumLost, match=r"round 2: .*device-2: left in round 1") as caught:
            run_server("tcp://127.0.0.1:0", cfg, on_ready=spawn, out_dir=tmp_path / "run")
    finally:
        for p in procs:
            p.kill()
            p.wait()
        for t in threads:
            t.join(30)
    assert list(caught.value.missing) == ["device-2"]
    rounds = pq.read_table(tmp_path / "run" / "rounds.parquet").to_pylist()
    assert [(r["round"], r["status"], r["left"]) for r in rounds] == [
        (1, "no-quorum", ["device-2"])
    ]
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["outcome"].startswith("QuorumLost")
    assert threading.active_count() < 50


def _threaded_run(cfg: FLConfig) -> list[dict]:
    threads: list[threading.Thread] = []

    def spawn(url: str) -> None:
        for i in range(1, cfg.clients + 1):
            t = threading.Thread(target=run_client, args=(url, f"device-{i}"), daemon=True)
            t.start()
            threads.append(t)

    result = run_server("tcp://127.0.0.1:0", cfg, on_ready=spawn)
    for t in threads:
        t.join(30)
    return result.rounds


def test_delta_downlink_is_exact_and_shrinks_after_a_sparse_uplink():
    """A device's model rebuilt from XOR deltas is the server's bit for bit, so the run trains
    exactly as with the full model sent; after top-k uplinks the delta is a fraction of it."""
    runs = {}
    for downlink in ("none", "delta"):
        cfg = FLConfig(
            dataset="synthetic",
            model="vgg5",
            clients=2,
            rounds=2,
            batch_size=50,
            uplink="topk",
            downlink=downlink,
            round_timeout=300,
        )
        runs[downlink] = _threaded_run(cfg)
    full, delta = runs["none"], runs["delta"]
    for a, b in zip(full, delta, strict=True):
        assert (a["train_loss"], a["test_loss"], a["accuracy"]) == (
            b["train_loss"],
            b["test_loss"],
            b["accuracy"],
        )
    for a, b in zip(full[1:], delta[1:], strict=True):  # round 1 sends the whole model
        assert b["downlink_bytes"] < 0.15 * a["downlink_bytes"]
