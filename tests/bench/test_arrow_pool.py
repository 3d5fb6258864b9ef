"""The ``tensorwire`` command asks Arrow for its system pool (mimalloc keeps pages per gRPC
thread: twice a flight:// hub's memory per idle client) unless the environment chose one.
Each case runs in a fresh interpreter: Arrow reads the choice once per process."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

# the command's own entry point with --help, then the pool Arrow's C++ side allocates from
RUN_MAIN = """
import sys
from tensorwire.cli.app import main
sys.argv = ["tensorwire", "--help"]
try:
    main()
except SystemExit:
    pass
import pyarrow as pa
print("POOL", pa.default_memory_pool().backend_name)
"""


def pool_after_main(env: dict[str, str]) -> str:
    base = {k: v for k, v in os.environ.items() if k != "ARROW_DEFAULT_MEMORY_POOL"}
    done = subprocess.run(
        [sys.executable, "-c", RUN_MAIN],
        capture_output=True,
        text=True,
        timeout=120,
        env=base | env,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.rsplit("POOL", 1)[1].strip()


def test_the_command_runs_on_arrows_system_pool():
    assert pool_after_main({}) == "system"


def test_a_pool_chosen_in_the_environment_is_kept():
    import pyarrow as pa

    if "jemalloc" not in pa.supported_memory_backends():
        pytest.skip("this pyarrow has no jemalloc pool to choose")
    assert pool_after_main({"ARROW_DEFAULT_MEMORY_POOL": "jemalloc"}) == "jemalloc"
