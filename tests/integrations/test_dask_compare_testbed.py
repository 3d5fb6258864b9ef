"""The Dask comparison on the testbed: schedulers and workers in their own namespaces, the
trials run from the server's, and the table names both protocols."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tensorwire.testbed import probe_capabilities

pytest.importorskip("distributed", reason="the dask extra (distributed) is not installed")


def test_it_runs_both_protocols_behind_shaped_links_and_prints_their_rows(tmp_path) -> None:
    caps = probe_capabilities()
    if caps.mode != "root":
        pytest.skip(f"workers in their own namespaces need root: {caps['netns'].reason}")
    argv = [sys.executable, "-m", "tensorwire.integrations.dask.compare_testbed",
            "--n", "1024", "--trials", "1", "--logs", str(tmp_path)]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = {line.split()[0]: line.split() for line in done.stdout.splitlines() if line}
    assert "behind a 100mbit link" in done.stdout
    assert {"tcp", "tensorwire+tcp"} <= set(rows)
    assert float(rows["tensorwire+tcp"][1]) > 0 and float(rows["tcp"][-1]) == 1.0
