"""One rank of a ``tensorwire bench collective`` job, run as its own process.

    python -m tensorwire.bench.collective_rank tensorwire URL RANK SIZE VARIANTS_JSON
    python -m tensorwire.bench.collective_rank gloo STORE_PATH RANK SIZE
    mpirun -np SIZE python -m tensorwire.bench.collective_rank mpi
    python -m tensorwire.bench.collective_rank rendezvous URL SIZE

Rank 0 says ``{"ready": true}`` once its group is formed, then reads commands on stdin,
one a line: ``BYTES VARIANT ITERATIONS`` (``-1 0 0`` ends the job). It hands each to the
other ranks with its engine's own broadcast; every rank then allreduces (sum) a float32
tensor of ``BYTES`` bytes once untimed (the first time it is asked for that size and
variant), meets the others at a barrier, and times
``ITERATIONS`` allreduces with variant ``VARIANT``. Rank 0 answers with one JSON line:
``{"seconds": ..., "cpu_seconds": ...}``, the slowest rank's time per allreduce and the
largest process CPU time (every thread of it) a rank spent per allreduce.

``ITERATIONS`` 0 measures the variant's error instead: every rank allreduces once random
normal float32 data of its own seed (its rank), and rank 0 answers ``{"max_rel_error": ...}``:
the largest error over the tensor against the exact float64 sum, over the largest exact sum
(sparse compressions under a key of their own, so that it is one call's error).

``rendezvous`` serves a tensorwire rendezvous for SIZE ranks at URL (port 0: the kernel's
pick), says ``{"url": ...}`` with the port it got, and ends once every rank has come (the
testbed runs it in the server's namespace, where every rank's namespace reaches it).
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import replace
from typing import Any, Protocol

import numpy as np

QUIT = -1
IDLE_POLL_S = 0.001
"""Seconds an MPI rank sleeps between looks for the next command."""


class Engine(Protocol):
    """What a job's ranks run on: tensorwire's group, gloo or MPI."""

    rank: int
    size: int

    def bcast_command(self, command: np.ndarray) -> None: ...

    def allreduce(self, x: np.ndarray, variant: int) -> None: ...

    def allreduce_once(self, x: np.ndarray, variant: int) -> None: ...

    def barrier(self) -> None: ...

    def slowest(self, seconds: float) -> float: ...

    def close(self) -> None: ...


class TensorwireEngine:
    """A tensorwire group met at ``url`` (a rendezvous the benchmark serves); the variants
    are the keyword sets ``allreduce`` is called with (``piece_bytes`` among them sets the
    group's piece size for that variant)."""

    def __init__(self, url: str, rank: int, size: int, variants: list[dict[str, Any]]) -> None:
        from tensorwire.collective import Group

        self.group = Group.join(url, rank=rank, size=size, serve=False, timeout=300)
        self.rank, self.size = rank, size
        self.variants = variants

    def bcast_command(self, command: np.ndarray) -> None:
        self.group.broadcast(command)

    def _kwargs(self, variant: int) -> dict[str, Any]:
        """``allreduce``'s keywords for ``variant``; its ``piece_bytes`` (if any) becomes the
        group's piece size from now on."""
        kwargs = dict(self.variants[variant])
        piece = kwargs.pop("piece_bytes", None)
        if piece is not None and piece != self.group.options.piece_bytes:
            self.group.options = replace(self.group.options, piece_bytes=int(piece))
        return kwargs

    def allreduce(self, x: np.ndarray, variant: int) -> None:
        self.group.allreduce(x, "sum", **self._kwargs(variant))

    def allreduce_once(self, x: np.ndarray, variant: int) -> None:
        self.group.allreduce(x, "sum", **self._kwargs(variant), key=f"error-{x.nbytes}")

    def barrier(self) -> None:
        self.group.barrier()

    def slowest(self, seconds: float) -> float:
        return float(self.group.allreduce(np.array([seconds]), "max")[0])

    def close(self) -> None:
        self.group.close()


class GlooEngine:
    """torch.distributed's gloo, met through a FileStore at ``store_path``."""

    def __init__(self, store_path: str, rank: int, size: int) -> None:
        import torch
        import torch.distributed as dist

        self.torch, self.dist = torch, dist
        store = dist.FileStore(store_path, size)
        dist.init_process_group("gloo", store=store, rank=rank, world_size=size)
        self.rank, self.size = rank, size

    def bcast_command(self, command: np.ndarray) -> None:
        self.dist.broadcast(self.torch.from_numpy(command), src=0)

    def allreduce(self, x: np.ndarray, variant: int) -> None:
        self.dist.all_reduce(self.torch.from_numpy(x))

    allreduce_once = allreduce

    def barrier(self) -> None:
        self.dist.barrier()

    def slowest(self, seconds: float) -> float:
        t = self.torch.tensor([seconds], dtype=self.torch.float64)
        self.dist.all_reduce(t, op=self.dist.ReduceOp.MAX)
        return float(t[0])

    def close(self) -> None:
        self.dist.destroy_process_group()


class MpiEngine:
    """mpi4py's ``COMM_WORLD``, under ``mpirun``: the buffer (upper-case) calls."""

    def __init__(self) -> None:
        from mpi4py import MPI

        self.mpi = MPI
        self.comm = MPI.COMM_WORLD
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()

    def bcast_command(self, command: np.ndarray) -> None:
        request = self.comm.Ibcast(command, root=0)
        while not request.Test():  # MPI's waits spin: an idle job must leave the CPUs be
            time.sleep(IDLE_POLL_S)

    def allreduce(self, x: np.ndarray, variant: int) -> None:
        self.comm.Allreduce(self.mpi.IN_PLACE, x, op=self.mpi.SUM)

    allreduce_once = allreduce

    def barrier(self) -> None:
        self.comm.Barrier()

    def slowest(self, seconds: float) -> float:
        return float(self.comm.allreduce(seconds, op=self.mpi.MAX))

    def close(self) -> None:
        """MPI finalises itself when the process exits."""


def _command(engine: Engine) -> tuple[int, int, int]:
    command = np.zeros(3, np.int64)
    if engine.rank == 0:
        line = sys.stdin.readline().split()
        command[:] = [int(v) for v in line] if len(line) == 3 else [QUIT, 0, 0]
    engine.bcast_command(command)
    nbytes, variant, iterations = (int(v) for v in command)
    return nbytes, variant, iterations


def serve(engine: Engine) -> None:
    """Run the commands rank 0 reads until the one that ends the job."""
    tensors: dict[int, np.ndarray] = {}
    warm: set[tuple[int, int]] = set()
    if engine.rank == 0:
        print(json.dumps({"ready": True}), flush=True)
    while True:
        nbytes, variant, iterations = _command(engine)
        if nbytes == QUIT:
            return
        if iterations == 0:
            error = _error(engine, nbytes, variant)
            if engine.rank == 0:
                print(json.dumps({"max_rel_error": error}), flush=True)
            continue
        x = tensors.setdefault(nbytes, np.ones(nbytes // 4, np.float32))
        x[...] = 1.0  # sums stay small: 8 ranks x 21 sums cannot overflow
        if (nbytes, variant) not in warm:  # once: on a slow link it would double the trial
            engine.allreduce(x, variant)
            warm.add((nbytes, variant))
        engine.barrier()
        start, cpu = time.perf_counter(), time.process_time()
        for _ in range(iterations):
            engine.allreduce(x, variant)
        cpu = (time.process_time() - cpu) / iterations
        seconds = engine.slowest((time.perf_counter() - start) / iterations)
        cpu = engine.slowest(cpu)
        if engine.rank == 0:
            print(json.dumps({"seconds": seconds, "cpu_seconds": cpu}), flush=True)


def _random(rank: int, nbytes: int) -> np.ndarray:
    return np.random.default_rng(rank).standard_normal(nbytes // 4, np.float32)


def _error(engine: Engine, nbytes: int, variant: int) -> float | None:
    """One allreduce of random data; on rank 0 its largest error over the largest exact sum
    (the exact float64 sum from every rank's seed), elsewhere None."""
    x = _random(engine.rank, nbytes)
    engine.allreduce_once(x, variant)
    if engine.rank:
        return None
    exact = np.zeros(nbytes // 4, np.float64)
    for rank in range(engine.size):
        exact += _random(rank, nbytes)
    return float(np.abs(x - exact).max() / np.abs(exact).max())


def rendezvous(url: str, size: int) -> None:
    """Serve a rendezvous for ``size`` ranks at ``url``; say its URL; end once all came."""
    from tensorwire.collective import Rendezvous

    meeting = Rendezvous(url, size, timeout=300)
    print(json.dumps({"url": meeting.url}), flush=True)
    meeting.close()  # waits for every rank (or the timeout), answers them, then closes


def main(argv: list[str]) -> None:
    kind = argv[0]
    engine: Engine
    if kind == "rendezvous":
        rendezvous(argv[1], int(argv[2]))
        return
    if kind == "tensorwire":
        engine = TensorwireEngine(argv[1], int(argv[2]), int(argv[3]), json.loads(argv[4]))
    elif kind == "gloo":
        engine = GlooEngine(argv[1], int(argv[2]), int(argv[3]))
    elif kind == "mpi":
        engine = MpiEngine()
    else:
        raise SystemExit(f"unknown engine {kind!r}: use tensorwire, gloo or mpi")
    try:
        serve(engine)
    finally:
        engine.close()


if __name__ == "__main__":
    main(sys.argv[1:])
