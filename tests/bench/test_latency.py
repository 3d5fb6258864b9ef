"""``bench latency``: a tiny run has every trial's row, and a dead echo fails the run."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from tensorwire.bench.latency import (
    TARGETS,
    bench_latency,
    latency_targets,
    raw_socket_trial,
    stop_trial,
    tensorwire_trial,
)
from tensorwire.bench.tables import write_rows
from tensorwire.errors import PeerGone, TransportTimeout

TRIALS = ["raw-socket", "tensorwire-tcp", "tensorwire-tcp-nochecksum", "pyzmq", "tensorwire-zmq"]


def test_a_tiny_run_has_a_row_per_trial_and_payload(tmp_path: Path) -> None:
    rows = bench_latency(payloads=(4096, 40960), round_trips=15, repeat=2, warmup=3)
    assert [(r["bytes"], r["transport"]) for r in rows] == [
        (n, t) for n in (4096, 40960) for t in TRIALS
    ]
    for r in rows:
        assert r["round_trips"] == 30 and r["blocks"] == 2
        assert 0 < r["min_us"] <= r["median_us"] <= r["p99_us"]
        if r["transport"] in ("raw-socket", "pyzmq"):
            assert r["baseline"] == "" and r["time_vs_baseline"] is None
        else:
            assert r["baseline"] in ("raw-socket", "pyzmq") and r["time_vs_baseline"] > 0
    targets = list(latency_targets(rows))
    assert len(targets) == 2 * len(TARGETS)
    assert all(measured is not None and target in (1.2, 1.5) for _, target, measured in targets)
    paths = write_rows(rows, tmp_path, "latency")
    table = pq.read_table(tmp_path / "latency.parquet")
    assert table.num_rows == len(rows) and "block_medians_us" in table.column_names
    assert (tmp_path / "latency.csv") in paths


def test_each_side_s_cpu_per_round_trip_is_reported_beside_the_wall_time(tmp_path: Path) -> None:
    rows = bench_latency(payloads=(4096,), round_trips=15, repeat=2, warmup=3)
    assert [r["transport"] for r in rows] == TRIALS
    for r in rows:
        for side in ("hub_cpu_us", "echo_cpu_us"):
            assert isinstance(r[side], float) and r[side] > 0, (r["transport"], side, r[side])
    write_rows(rows, tmp_path, "latency")
    table = pq.read_table(tmp_path / "latency.parquet").to_pylist()
    assert all(r["hub_cpu_us"] > 0 and r["echo_cpu_us"] > 0 for r in table)


def test_an_echo_that_dies_fails_the_raw_trial_at_once() -> None:
    trial = raw_socket_trial(timeout=10)
    arr = np.zeros(1024, np.float32)
    try:
        trial.once(arr)
        assert trial.proc is not None
        trial.proc.kill()
        trial.proc.wait(timeout=10)
        start = time.monotonic()
        with pytest.raises(OSError):  # ConnectionError: reset, or closed mid-message
            for _ in range(3):
                trial.once(arr)
        assert time.monotonic() - start < 10
    finally:
        stop_trial(trial)


def test_an_echo_that_dies_fails_the_tensorwire_trial_within_its_timeout() -> None:
    trial = tensorwire_trial("tcp", "tensorwire-tcp", timeout=3)
    arr = np.zeros(1024, np.float32)
    try:
        trial.once(arr)
        assert trial.proc is not None
        trial.proc.kill()
        trial.proc.wait(timeout=10)
        start = time.monotonic()
        with pytest.raises((PeerGone, TransportTimeout)):
            for _ in range(3):
                trial.once(arr)
        assert time.monotonic() - start < 3 * 3 + 5
    finally:
        stop_trial(trial)


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="round_trips"):
        bench_latency(round_trips=0)
