"""``bench scale``: a tiny run (tcp and mqtt on a private broker, 2 and 6 clients) prints its
table and writes its rows and figure; a client process that dies or hangs is counted, not
waited for past the deadline; bad choices are refused before anything starts."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tensorwire.bench import scale
from tensorwire.bench.scale import client_procs, cpu_seconds, with_descendants
from tensorwire.bench.scale_case import _tallies
from tensorwire.bench.scale_summary import median_rows

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "transports"))
from waiting import until

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
        if r["transport"] == "mqtt":  # its private broker's CPU; none for a brokerless hub
            assert r["broker_join_cpu_ms"] >= 0.0 and r["broker_cpu_s"] >= 0.0
        else:
            assert r.get("broker_cpu_s") is None
    assert (out / "scale.png").exists()


def test_client_processes_hold_at_most_a_hundred_clients_each_unless_told():
    assert [client_procs(n) for n in (2, 10, 400, 401, 2000, 5000, 9000)] == [
        2, 4, 4, 5, 20, 50, 64
    ]  # fmt: skip
    assert client_procs(2000, 4) == 4 and client_procs(3, 8) == 3
    # one I/O thread per process: four processes at every count, unless told
    assert [client_procs(n, transport="mqtt") for n in (2, 100, 2000, 5000)] == [2, 4, 4, 4]
    assert client_procs(2000, transport="amqp?persistent=0") == 4
    assert client_procs(2000, 20, transport="amqp") == 20


def test_a_transports_url_options_reach_its_hub(tmp_path: Path):
    """``tcp?frobnicate=1``: the hub's URL has the option, which tcp refuses by name."""
    done = _bench(
        "--transports", "tcp?frobnicate=1", "--clients", "2", "--out", str(tmp_path / "r")
    )  # fmt: skip
    assert done.returncode == 1 and "unknown option(s) frobnicate" in done.stderr, done.stderr
    refused = _bench("--transports", "nope?x=1", "--clients", "2")
    assert refused.returncode != 0 and "unknown transport" in refused.stderr


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


HUNG_CASE = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
open(sys.argv[1] + ".pid", "w").write(str(child.pid))
time.sleep(600)  # a hub whose threads ran away: it never reports
"""


def test_a_case_that_runs_past_its_deadline_is_killed_with_its_clients(tmp_path, monkeypatch):
    script = tmp_path / "hung_case.py"
    script.write_text(HUNG_CASE)
    monkeypatch.setattr(scale, "CASE", (str(script), str(tmp_path / "client")))
    monkeypatch.setattr(scale, "GRACE_S", 1.0)
    started = time.monotonic()
    row = scale.scale_case("tcp", 3, timeout=1.0)
    assert time.monotonic() - started < 20
    assert "past its 1 s deadline" in row["error"] and "were killed" in row["error"], row
    client = int((tmp_path / "client.pid").read_text())
    assert until(lambda: not Path(f"/proc/{client}").exists() or _zombie(client))


def _zombie(pid: int) -> bool:
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] == "Z"
    return True


def test_bad_choices_are_refused_before_anything_starts():
    done = _bench("--transports", "tcp,foo")
    assert done.returncode == 2 and "unknown transport(s) foo" in done.stderr
    assert "known: " in done.stderr and "tcp" in done.stderr
    done = _bench("--clients", "10,9000")
    assert done.returncode == 2 and "1 to 5000" in done.stderr


def test_repeated_runs_are_interleaved_and_the_table_gives_their_medians(tmp_path: Path):
    out = tmp_path / "results"
    done = _bench(
        "--transports", "tcp,udp", "--clients", "2,4", "--procs", "2", "--repeat", "3",
        "--out", str(out),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "medians of 3 interleaved runs" in done.stdout and "per_client_ratio" in done.stdout
    rows = pq.read_table(out / "scale.parquet").to_pylist()
    cases = [("tcp", 2), ("tcp", 4), ("udp", 2), ("udp", 4)]
    assert [(r["run"], r["transport"], r["clients"]) for r in rows] == [
        (run, *case) for run in (1, 2, 3) for case in cases
    ]
    medians = pq.read_table(out / "scale-medians.parquet").to_pylist()
    assert [(m["transport"], m["clients"], m["runs"]) for m in medians] == [
        (*case, 3) for case in cases
    ]
    for m in medians:
        runs = sorted(r["join_s"] for r in rows if m_case(r) == m_case(m))
        assert m["join_s"] == runs[1]
    small = {m["transport"]: m["per_client_ms"] for m in medians if m["clients"] == 2}
    for m in medians:
        assert m["per_client_ratio"] == pytest.approx(m["per_client_ms"] / small[m["transport"]])


def m_case(row: dict[str, object]) -> tuple[object, object]:
    return row["transport"], row["clients"]


def test_medians_leave_out_failed_runs_and_say_so():
    rows = [
        {"run": 1, "transport": "tcp", "clients": 10, "per_client_ms": 2.0, "join_s": 1.0},
        {"run": 1, "transport": "tcp", "clients": 100, "per_client_ms": 3.0, "join_s": 5.0},
        {"run": 2, "transport": "tcp", "clients": 10, "per_client_ms": 4.0, "join_s": 3.0},
        {"run": 2, "transport": "tcp", "clients": 100, "error": "TransportTimeout: late"},
        {"run": 1, "transport": "quic", "clients": 10, "error": "TransportError: no"},
    ]
    tcp10, tcp100, quic10 = median_rows(rows)
    assert (tcp10["runs"], tcp10["failed_runs"], tcp10["per_client_ms"]) == (2, 0, 3.0)
    assert tcp10["join_s"] == 2.0 and tcp10["per_client_ratio"] == 1.0
    assert (tcp100["runs"], tcp100["failed_runs"], tcp100["per_client_ms"]) == (1, 1, 3.0)
    assert tcp100["per_client_ratio"] == 1.0 and "error" not in tcp100
    assert quic10["runs"] == 0 and quic10["error"] == "TransportError: no"
    assert "per_client_ratio" not in quic10 and "run" not in tcp10


def test_with_descendants_finds_a_grandchild_and_nothing_else():
    code = "import subprocess, sys, time; c = subprocess.Popen([sys.executable, '-c', "
    code += "'import time; time.sleep(60)']); print(c.pid, flush=True); c.wait()"
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        grandchild = int(child.stdout.readline())
        found = with_descendants(child.pid)
        assert sorted(found) == sorted([child.pid, grandchild])
        assert with_descendants(os.getpid())[0] == os.getpid()
    finally:
        subprocess.run(["pkill", "-P", str(child.pid)], check=False)
        child.kill()
        child.wait()


def test_the_figure_shows_at_least_a_decade_so_small_growth_looks_small():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from tensorwire.bench.scale_figure import _at_least_a_decade

    fig, ax = plt.subplots()
    ax.set_yscale("log")
    ax.plot([100, 2000], [2.45, 3.27])
    _at_least_a_decade(ax, [2.45, 3.27])  # 1.34x
    low, high = ax.get_ylim()
    assert high / low == pytest.approx(10.0) and low < 2.45 and high > 3.27
    ax.set_ylim(0.5, 100.0)
    _at_least_a_decade(ax, [1.0, 50.0])  # already more than a decade: left alone
    assert ax.get_ylim() == (0.5, 100.0)
    plt.close(fig)
