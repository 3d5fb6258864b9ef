"""``bench collective --profiles``: a tiny run on the testbed (2 ranks, each in its own
namespace behind a link shaped at 100 Mbit/s) writes rows with the ring bound beside each,
and the exact allreduces take at least about what the bound says (the links are shaped)."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest
from test_collective_bench import run_bench

from tensorwire.bench.collective import gloo_missing, ring_bytes
from tensorwire.collective.mpirun import mpi_missing
from tensorwire.testbed import probe_capabilities

MiB = 1 << 20


def _namespaces_missing() -> str | None:
    caps = probe_capabilities()
    if caps.mode is None:
        return "; ".join(caps[n].reason for n in ("root", "userns", "netns") if n in caps.items)
    if not caps.has("tbf"):
        return caps["tbf"].reason
    return None


def test_a_tiny_testbed_run_has_the_bound_beside_each_row(tmp_path: Path):
    missing = _namespaces_missing()
    if missing:
        pytest.skip(f"no shaped namespaces here: {missing}")
    out = tmp_path / "results"
    args = [
        *("--profiles", "100mbit", "--sizes", "1MiB", "--ranks", "2", "--repeat", "1"),
        *("--algorithms", "ring", "--compress", "int8", "--out", str(out)),
    ]
    done = run_bench(args, timeout=240)
    assert "each behind its own shaped link (testbed), median of 1" in done.stdout
    assert "ring_bound_ms: that at the link's rate" in done.stdout
    expected = ["tensorwire-ring", "tensorwire-ring-int8"]
    for name, why in (("gloo", gloo_missing()), ("mpi-tcp", mpi_missing())):
        if why:
            print(f"{name} left out: {why}")
        else:
            expected.append(name)
    rows = pq.read_table(out / "collective.parquet").to_pylist()
    assert [r["contender"] for r in rows] == expected
    bound_ms = ring_bytes(MiB, 2) * 8 / 100e6 * 1e3
    for r in rows:
        assert r["link"] == "100mbit" and r["link_bits_per_s"] == 100e6
        assert r["placed"] == "netns", r  # MPI too: mpirun placed its ranks in the namespaces
        assert r["ring_bound_ms"] == pytest.approx(bound_ms)
        assert r["vs_ring_bound"] == pytest.approx(r["median_ms"] / bound_ms)
        assert r["max_rel_error"] is not None and r["max_rel_error"] >= 0
        if r["contender"] != "tensorwire-ring-int8":  # the exact ones move every byte
            assert r["max_rel_error"] < 1e-5
            assert r["median_ms"] > 0.9 * bound_ms, r  # the link really is shaped
    int8 = next(r for r in rows if r["contender"] == "tensorwire-ring-int8")
    assert 1e-4 < int8["max_rel_error"] < 2e-2
    for name in ("collective.csv", "collective.png", "collective.svg"):
        assert (out / name).stat().st_size > 0
