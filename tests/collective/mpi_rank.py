"""One rank of an ``mpirun`` job: forms its group with ``Group.from_mpi()`` and checks the
group's operations against MPI's own on the same data.

    mpirun -np 4 python mpi_rank.py

Rank 0 prints one JSON line: {"ok": true, ...} when every rank agreed with MPI, else
{"error": ...}. Every operation has a deadline, so a broken group cannot hang the job.
"""

from __future__ import annotations

import json

import numpy as np
from mpi4py import MPI

from tensorwire.collective import Group

N = 1 << 18  # float32 elements: 1 MiB, the ring's side of the size threshold
SMALL = 1000  # float32 elements: recursive doubling's side


def check(comm: MPI.Comm, group: Group) -> list[str]:
    """What differed from MPI's results, on this rank."""
    rank, size = comm.Get_rank(), comm.Get_size()
    rng = np.random.default_rng(rank)
    wrong = []
    for n in (SMALL, N):
        for op, mpi_op in (("sum", MPI.SUM), ("max", MPI.MAX)):
            x = rng.integers(-1000, 1000, n).astype(np.float32)  # integers: sums are exact
            expected = np.empty_like(x)
            comm.Allreduce(x, expected, op=mpi_op)
            if not np.array_equal(group.allreduce(x.copy(), op), expected):
                wrong.append(f"allreduce({op}) of {n} elements")
        x = np.full(n, float(rank), np.float32) if rank == 1 else np.zeros(n, np.float32)
        expected = x.copy()
        comm.Bcast(expected, root=1)
        if not np.array_equal(group.broadcast(x, root=1), expected):
            wrong.append(f"broadcast of {n} elements")
        x = rng.standard_normal(n).astype(np.float32)
        expected = np.empty((size, n), np.float32)
        comm.Allgather(x, expected)
        if not np.array_equal(group.allgather(x), expected):
            wrong.append(f"allgather of {n} elements")
    group.barrier()
    return wrong


def main() -> None:
    comm = MPI.COMM_WORLD
    try:
        with Group.from_mpi(timeout=30, connect_timeout=30) as group:
            assert (group.rank, group.size) == (comm.Get_rank(), comm.Get_size())
            wrong = check(comm, group)
            address = group.address
        report = {"wrong": wrong, "address": list(address)}
    except Exception as exc:  # reported, so that rank 0 can say which rank failed and why
        report = {"error": f"{type(exc).__name__}: {exc}"}
    reports = comm.gather(report, root=0)
    if comm.Get_rank() == 0:
        assert reports is not None
        ok = all(r.get("wrong") == [] for r in reports)
        print(json.dumps({"ok": ok, "size": comm.Get_size(), "ranks": reports}), flush=True)


if __name__ == "__main__":
    main()
