"""``bench stream``: a tiny run has a row per contender, every byte arrived, figures positive."""

from __future__ import annotations

import pytest

from tensorwire.bench.stream import FLIGHT, bench_stream


def test_a_small_stream_bench_measures_every_contender():
    pytest.importorskip("pyarrow.flight", reason="pyarrow Flight is not installed")
    rows = bench_stream(["tcp", "zmq+tcp"], records=256, columns=4, batches=40, repeat=2, window=4)
    by = {r["contender"]: r for r in rows}
    assert set(by) == {FLIGHT, "tensorwire-tcp", "tensorwire-zmq"}, sorted(by)
    for row in rows:
        assert row["complete"], row
        assert row["batch_bytes"] == 256 * 4 * 8
        assert row["mb_per_s"] > 0 and row["batches_per_s"] > 0
        assert 0 < row["p50_us"] <= row["p95_us"] <= row["p99_us"] <= row["max_us"]
        # each side's CPU per batch: something, and less than the wall time per batch
        wall_us = 1e6 / row["batches_per_s"]
        for side in ("send_cpu_us", "recv_cpu_us"):
            assert 0 < row[side] < 2 * wall_us, (side, row)
    assert by[FLIGHT]["vs_flight"] == 1.0
