"""Whole FedAvg runs: server here, devices as real processes, over real transports."""

from __future__ import annotations

import subprocess
import sys
import threading

import pyarrow.parquet as pq
import pytest

pytest.importorskip("torch", reason="torch is not installed (extra 'fl')")

from tensorwire.fl import FLConfig, FLError, run_server
from tensorwire.fl.run import device_command, run_local
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
    assert (out / "manifest.json").is_file()


def test_a_device_that_crashes_gives_a_clear_error_at_the_server():
    crash = (
        "import os, sys, tensorwire\n"
        "ch = tensorwire.connect(sys.argv[1], client_id='device-2', timeout=60)\n"
        "ch.recv(timeout=120)\n"
        "os._exit(3)\n"
    )
    procs: list[subprocess.Popen] = []

    def spawn(url: str) -> None:
        procs.append(subprocess.Popen(device_command(url, 1, 120)))
        procs.append(subprocess.Popen([sys.executable, "-c", crash, url]))

    cfg = FLConfig(dataset="synthetic", model="vgg5", clients=2, rounds=2, round_timeout=120)
    try:
        with pytest.raises(FLError, match="device-2"):
            run_server("tcp://127.0.0.1:0", cfg, on_ready=spawn)
    finally:
        for p in procs:
            p.kill()
            p.wait()
    assert threading.active_count() < 50


def test_delta_downlink_is_exact_and_shrinks_after_a_sparse_uplink():
    """A devices' model rebuilt from XOR deltas is the server's bit for bit, so the run trains
    exactly as with the full model sent; after top-k uplinks the delta is a fraction of it."""
    runs = {}
    for downlink in ("none", "delta"):
        cfg = FLConfig(
            dataset="synthetic",
            model="vgg5",
            clients=2,
            rounds=3,
            batch_size=50,
            uplink="topk",
            downlink=downlink,
            round_timeout=300,
        )
        result, _ = run_local(cfg, "tcp")
        runs[downlink] = result.rounds
    full, delta = runs["none"], runs["delta"]
    for a, b in zip(full, delta, strict=True):
        assert (a["train_loss"], a["test_loss"], a["accuracy"]) == (
            b["train_loss"],
            b["test_loss"],
            b["accuracy"],
        )
    for a, b in zip(full[1:], delta[1:], strict=True):  # round 1 sends the whole model
        assert b["downlink_bytes"] < 0.15 * a["downlink_bytes"]
