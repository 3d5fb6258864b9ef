"""``bench stream``: a tiny run has a row per contender, every byte arrived, figures positive."""

from __future__ import annotations

import pytest

from tensorwire.bench.stream import FLIGHT, bench_stream, stream_targets


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


def test_the_peer_says_goodbye_on_flight_so_nothing_is_logged_at_its_exit(capfd):
    """The hub closes first; the peer's channels must still be closed, not left to the
    interpreter's exit, where pyarrow logs each cancelled call as a failed Close()."""
    pytest.importorskip("pyarrow.flight", reason="pyarrow Flight is not installed")
    rows = bench_stream(
        ["flight"], records=256, columns=4, batches=20, repeat=1, window=4, flight_baseline=False
    )
    assert [r["complete"] for r in rows] == [True]
    err = capfd.readouterr().err
    assert "Close() failed" not in err and "Cancelled" not in err, err


def test_the_stream_targets_are_judged_against_doget_in_the_same_run():
    """tcp needs DoGet's MB/s and a p99 no worse; flight 0.9x DoGet's MB/s; without DoGet
    nothing is judged."""

    def row(contender: str, vs: float | None, p99: float) -> dict:
        return {"contender": contender, "batch_bytes": 131072, "vs_flight": vs, "p99_us": p99}

    rows = [
        row(FLIGHT, 1.0, 300),
        row("tensorwire-tcp", 1.1, 350),  # faster, but its p99 is worse
        row("tensorwire-flight", 0.92, 900),
        row("tensorwire-zmq", 0.8, 200),  # no target
    ]
    got = {what.split(" vs")[0]: (met, measured) for what, met, measured in stream_targets(rows)}
    assert got == {
        "tensorwire-tcp": (False, "1.10x, p99 350 vs 300 µs"),
        "tensorwire-flight": (True, "0.92x"),
    }
    rows[1]["p99_us"] = 250
    assert next(stream_targets(rows))[1] is True
    no_doget = [row("tensorwire-tcp", None, 250)]
    assert [met for _, met, _ in stream_targets(no_doget)] == [None]
