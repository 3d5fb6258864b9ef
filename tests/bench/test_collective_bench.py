"""``bench collective``: a tiny run (2 ranks, 2 sizes, 1 trial) prints its table and
writes its rows and figure; bad choices are refused before any rank starts."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import typer

from tensorwire.bench.collective import (
    bench_collective,
    gloo_missing,
    ring_bytes,
    tensorwire_variants,
)
from tensorwire.cli.bench_collective import parse_size
from tensorwire.collective import Group
from tensorwire.collective.mpirun import mpi_missing

SRC = Path(__file__).resolve().parents[2] / "src"


def run_bench(args: list[str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``tensorwire bench collective ARGS`` run as a command, with this tree's source;
    asserts it succeeded."""
    env = os.environ | {"COLUMNS": "250", "PYTHONPATH": f"{SRC}{os.pathsep}"}
    done = subprocess.run(
        [sys.executable, "-m", "tensorwire", "bench", "collective", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
        env=env,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def test_a_tiny_run_has_a_row_per_size_and_contender_and_writes_its_files(tmp_path: Path):
    out = tmp_path / "results"
    done = run_bench(["--sizes", "4KiB,64KiB", "--ranks", "2", "--repeat", "1", "--out", str(out)])
    expected = ["tensorwire-ring", "tensorwire-doubling"]
    for name, missing in (("gloo", gloo_missing()), ("mpi-tcp", mpi_missing())):
        if missing:
            assert f"{name} left out: {missing}" in done.stdout
        else:
            expected.append(name)
    assert "Allreduce (sum, float32) over 2 ranks on loopback, median of 1" in done.stdout
    assert "ring_bytes_per_rank: 2(N-1)/N x bytes" in done.stdout  # it says what each is
    rows = pq.read_table(out / "collective.parquet").to_pylist()
    assert [(r["bytes"], r["contender"]) for r in rows] == [
        (n, c) for n in (4096, 65536) for c in expected
    ]
    for r in rows:
        assert r["ranks"] == 2 and r["trials"] == 1 and len(r["times_s"]) == 1
        assert 0 < r["min_ms"] <= r["median_ms"]
        assert r["ring_bytes_per_rank"] == r["bytes"]  # 2 (N - 1) / N = 1 for two ranks
        assert r["bus_gb_per_s"] == pytest.approx(r["bytes"] / r["median_ms"] / 1e6)
        if "gloo" in expected:
            assert r["vs_gloo"] > 0
    for name in ("collective.csv", "collective.png", "collective.svg"):
        assert (out / name).stat().st_size > 0


def test_sizes_are_read_with_their_units():
    assert [parse_size(s) for s in ("4KiB", "64 mib", "4096")] == [4096, 64 << 20, 4096]
    with pytest.raises(typer.BadParameter, match="4KiB, 64MiB or 4096"):
        parse_size("4 gigs")


def test_the_ring_bound_is_2_n_minus_1_over_n_of_the_bytes():
    assert ring_bytes(1 << 20, 4) == 1.5 * (1 << 20)
    assert ring_bytes(4096, 8) == 7168


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        ({"ranks": 9}, "ranks=9: choose 2 to 8"),
        ({"sizes": [1024]}, "size 1024: choose multiples of 4 bytes from 4 KiB to 256 MiB"),
        ({"sizes": [512 << 20]}, "from 4 KiB to 256 MiB"),
    ],
)
def test_choices_out_of_bounds_are_refused_before_any_rank_starts(kwargs, says):
    with pytest.raises(ValueError, match=says):
        bench_collective(**kwargs)


def test_compression_variants_run_only_where_allreduce_takes_compress():
    names = [name for name, _ in tensorwire_variants(())]
    assert names == ["tensorwire-ring", "tensorwire-doubling"]
    if "compress" in inspect.signature(Group.allreduce).parameters:
        with_int8 = tensorwire_variants(("int8",))
        assert [n for n, _ in with_int8][2:] == ["tensorwire-ring-int8", "tensorwire-doubling-int8"]
    else:
        with pytest.raises(ValueError, match="takes no compress="):
            tensorwire_variants(("int8",))
