"""``bench scale``: a tiny run (tcp and mqtt on a private broker, 2 and 6 clients) prints its
table and writes its rows and figure; a client process that dies or hangs is counted, not
waited for past the deadline; bad choices are refused before anything starts."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq

from tensorwire.bench.scale import _tallies, client_procs, cpu_seconds

SRC = Path(__file__).resolve().parents[2] / "src"
ENV = os.environ | {"COLUMNS": "220", "PYTHONPATH": f"{SRC}{os.pathsep}"}


def _bench(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tensorwire", "bench", "scale", *args],
        capture_output=True,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
        env=ENV,
    )


def test_a_tiny_run_has_a_row_per_case_and_writes_its_files(tmp_path: Path):
    out = tmp_path / "results"
    done = _bench("--transports", "tcp,mqtt", "--clients", "2,6", "--procs", "2", "--out", str(out))
    assert done.returncode == 0, done.stderr[-3000:]
    assert "One hub, many clients" in done.stdout and "per_client_ms" in done.stdout
    rows = pq.read_table(out / "scale.parquet").to_pylist()
    assert [(r["transport"], r["clients"]) for r in rows] == [
        ("tcp", 2),
        ("tcp", 6),
        ("mqtt", 2),
        ("mqtt", 6),
    ]
    for r in rows:
        assert r.get("error") is None, r
        assert r["clients_failed"] == 0 and r["join_s"] > 0 and r["gather_s"] >= 0
        if r["transport"] == "tcp":  # a socket per client (mqtt's hub: one broker link)
            assert r["fds_per_client"] >= 1 and r["hub_fds"] >= r["clients"]
        assert r["hub_threads"] >= 1 and r["hub_rss_mb"] > 0
        assert r["client_procs"] == 2 and r["clients_cpu_s"] >= 0.0  # ticks of 10 ms: may be 0
    assert (out / "scale.png").exists()


def test_client_processes_hold_at_most_a_hundred_clients_each_unless_told():
    assert [client_procs(n) for n in (2, 10, 400, 401, 2000, 5000, 9000)] == [
        2, 4, 4, 5, 20, 50, 64
    ]  # fmt: skip
    assert client_procs(2000, 4) == 4 and client_procs(3, 8) == 3


def test_cpu_seconds_counts_a_busy_child_and_not_one_that_ended():
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        deadline = time.monotonic() + 60
        while cpu_seconds([busy.pid]) < 0.05:  # polled: it burns CPU from its start
            assert time.monotonic() < deadline
            time.sleep(0.01)
    finally:
        busy.kill()
        busy.wait()
    assert cpu_seconds([busy.pid]) == 0.0  # reaped: nothing left to read


def test_a_client_process_that_dies_or_hangs_is_counted_by_the_deadline():
    dead = subprocess.Popen([sys.executable, "-c", "pass"], stdout=subprocess.PIPE, text=True)
    hung = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    t = time.monotonic()
    tally = _tallies([dead, hung], time.monotonic() + 2)
    assert time.monotonic() - t < 10  # the hung one is killed at the deadline
    assert tally["failed"] == 2 and "gave no tally" in tally["error"]
    assert hung.poll() is not None


def test_bad_choices_are_refused_before_anything_starts():
    done = _bench("--transports", "tcp,foo")
    assert done.returncode == 2 and "unknown transport(s) foo" in done.stderr
    assert "known: " in done.stderr and "tcp" in done.stderr
    done = _bench("--clients", "10,9000")
    assert done.returncode == 2 and "1 to 5000" in done.stderr
