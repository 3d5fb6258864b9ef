"""``Group.from_mpi()`` under ``mpirun``: a 4-rank job whose group's allreduce, broadcast
and allgather agree with MPI's own on the same data (``mpi_rank.py``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tensorwire.collective.mpirun import mpi_missing, mpirun_command, mpirun_env

RANK = Path(__file__).with_name("mpi_rank.py")
SRC = Path(__file__).resolve().parents[2] / "src"
MISSING = mpi_missing()
pytestmark = pytest.mark.skipif(MISSING is not None, reason=MISSING or "")  # -ra prints it


@pytest.mark.parametrize("btl", ["tcp", "sm"])
def test_a_group_from_mpi_agrees_with_mpi_over_4_ranks(btl: str) -> None:
    env = mpirun_env()
    env["PYTHONPATH"] = f"{SRC}{os.pathsep}{env.get('PYTHONPATH', '')}"
    command = mpirun_command(4, [sys.executable, str(RANK)], btl)
    done = subprocess.run(
        command, env=env, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    assert done.returncode == 0 and lines, done.stdout + done.stderr
    report = json.loads(lines[-1])
    assert report["size"] == 4
    assert report["ok"], report["ranks"]
    hosts = {r["address"][0] for r in report["ranks"]}
    assert hosts == {"127.0.0.1"}  # every rank on this host: the group stays on loopback
