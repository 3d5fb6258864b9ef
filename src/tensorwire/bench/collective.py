"""``tensorwire bench collective``: allreduce over a group of rank processes on loopback,
tensorwire against torch.distributed's gloo and MPI in the same run.

Every contender is a job of ``ranks`` processes (``collective_rank.py``) started once and
kept: tensorwire (one group; a variant per algorithm, and per compression when asked),
gloo (``GLOO_SOCKET_IFNAME=lo``, a FileStore) and MPI (mpi4py's ``Allreduce`` under
``mpirun``, its traffic on loopback: see :mod:`tensorwire.collective.mpirun`). Trials
alternate: every round times each size on every contender in turn (the order rotating
from round to round), so that a slow spell of the machine hits all alike; the first round
only warms up. A trial is ``iterations`` allreduces of a float32 tensor of ``bytes``
(enough to move about 16 MiB); its figure is the slowest rank's time per allreduce, and a
row's the median over rounds.

Beside each: the ring bound, ``2 (N - 1) / N x bytes`` that each rank must send and receive
at least, and the bus bandwidth it implies (that many bytes / the median time): on a link
of a known rate, the time the bound allows is that rate's. Shaped links (the testbed's
namespaces) are later work; this runs on loopback only.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import os
import queue
import statistics
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tensorwire.bench.collective_rank import QUIT
from tensorwire.collective import Group, Rendezvous
from tensorwire.collective.mpirun import mpi_missing, mpirun_command, mpirun_env

KiB, MiB = 1 << 10, 1 << 20
MIN_BYTES, MAX_BYTES = 4 * KiB, 256 * MiB
MIN_RANKS, MAX_RANKS = 2, 8
SIZES = (4 * KiB, 64 * KiB, 1 * MiB, 16 * MiB, 64 * MiB)
"""The default sizes, bytes of float32 per rank."""
ALGORITHMS = {"ring": "ring", "doubling": "recursive_doubling"}
"""tensorwire's allreduce algorithms: the contender's name -> ``algorithm=``."""
TRIAL_BYTES = 16 * MiB
"""A trial repeats the allreduce until about this many bytes have been reduced."""
MAX_ITERATIONS = 20
TIMEOUT = 300.0
"""Seconds any one reply may take before the run fails (a rank that died or hung)."""


@dataclass
class Contender:
    """A named allreduce: variant ``variant`` of job ``job``."""

    name: str
    job: Job
    variant: int = 0


@dataclass
class Job:
    """A contender's rank processes; rank 0's stdin and stdout carry commands and answers."""

    name: str
    procs: list[subprocess.Popen[str]]
    answers: queue.Queue[dict[str, Any] | None] = field(default_factory=queue.Queue)

    def __post_init__(self) -> None:
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        out = self.procs[0].stdout
        assert out is not None
        for line in out:
            if line.startswith("{"):
                self.answers.put(json.loads(line))
        self.answers.put(None)

    def answer(self) -> dict[str, Any]:
        """Rank 0's next answer; raises when there is none within ``TIMEOUT``."""
        try:
            got = self.answers.get(timeout=TIMEOUT)
        except queue.Empty:
            raise RuntimeError(f"{self.name}: no answer in {TIMEOUT:g} s (a rank hung)") from None
        if got is None:
            codes = [p.poll() for p in self.procs]
            raise RuntimeError(f"{self.name}: a rank ended (exit codes {codes})")
        return got

    def ask(self, nbytes: int, variant: int, iterations: int) -> tuple[float, float]:
        """Seconds per allreduce of ``nbytes`` by ``variant``, the slowest rank's, and the
        most process CPU seconds a rank spent per allreduce."""
        stdin = self.procs[0].stdin
        assert stdin is not None
        stdin.write(f"{nbytes} {variant} {iterations}\n")
        stdin.flush()
        got = self.answer()
        return float(got["seconds"]), float(got["cpu_seconds"])

    def stop(self) -> None:
        """End the job: the quit command, then a kill for any rank still there."""
        stdin = self.procs[0].stdin
        assert stdin is not None
        with contextlib.suppress(OSError, ValueError):  # a job that died has no stdin left
            stdin.write(f"{QUIT} 0 0\n")  # mpirun passes lines on, but not the end of stdin
            stdin.close()
        for proc in self.procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=30)


def _spawn(argv: Sequence[str], first: bool, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        list(argv),
        stdin=subprocess.PIPE if first else subprocess.DEVNULL,
        stdout=subprocess.PIPE if first else subprocess.DEVNULL,
        env=env,
        text=True,
    )


def _rank_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "tensorwire.bench.collective_rank", *args]


def tensorwire_variants(compress: Sequence[str]) -> list[tuple[str, dict[str, Any]]]:
    """tensorwire's contenders: every algorithm, each with every ``compress`` option (when
    ``Group.allreduce`` takes ``compress=``; asking for one when it does not is an error)."""
    variants = [(f"tensorwire-{n}", {"algorithm": a}) for n, a in ALGORITHMS.items()]
    if not compress:
        return variants
    if "compress" not in inspect.signature(Group.allreduce).parameters:
        raise ValueError("this tensorwire's Group.allreduce takes no compress=")
    return variants + [
        (f"{name}-{c}", {**kwargs, "compress": c}) for name, kwargs in variants for c in compress
    ]


def _tensorwire_job(ranks: int, variants: list[dict[str, Any]]) -> Job:
    env = dict(os.environ)
    with Rendezvous("tcp://127.0.0.1:0", ranks, timeout=TIMEOUT) as meeting:
        spec = json.dumps(variants)
        procs = [
            _spawn(_rank_argv("tensorwire", meeting.url, str(r), str(ranks), spec), r == 0, env)
            for r in range(ranks)
        ]
        return Job("tensorwire", procs)


def _gloo_job(ranks: int, store: Path) -> Job:
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "MASTER_ADDR": "127.0.0.1"}
    procs = [
        _spawn(_rank_argv("gloo", str(store), str(r), str(ranks)), r == 0, env)
        for r in range(ranks)
    ]
    return Job("gloo", procs)


def _mpi_job(ranks: int, btl: str) -> Job:
    command = mpirun_command(ranks, _rank_argv("mpi"), btl)
    return Job(f"mpi-{btl}", [_spawn(command, True, mpirun_env())])


def gloo_missing() -> str | None:
    """Why gloo cannot run here, or None when it can."""
    try:
        import torch.distributed as dist
    except ImportError:
        return "torch is not installed: pip install 'tensorwire[fl]'"
    return None if dist.is_available() and dist.is_gloo_available() else "torch has no gloo"


@contextlib.contextmanager
def contenders(
    ranks: int, compress: Sequence[str], mpi_btls: Sequence[str], skipped: dict[str, str]
) -> Iterator[list[Contender]]:
    """Every contender's job started and ready; those that cannot run here are left out,
    with the reason in ``skipped``. The jobs end when the block does."""
    jobs: list[Job] = []
    chosen: list[Contender] = []
    with tempfile.TemporaryDirectory(prefix="tw-bench-collective-") as tmp:
        try:
            variants = tensorwire_variants(compress)
            job = _tensorwire_job(ranks, [kwargs for _, kwargs in variants])
            jobs.append(job)
            chosen += [Contender(name, job, i) for i, (name, _) in enumerate(variants)]
            reason = gloo_missing()
            if reason is None:
                jobs.append(_gloo_job(ranks, Path(tmp) / "store"))
                chosen.append(Contender("gloo", jobs[-1]))
            else:
                skipped["gloo"] = reason
            reason = mpi_missing()
            for btl in mpi_btls:
                if reason is None:
                    jobs.append(_mpi_job(ranks, btl))
                    chosen.append(Contender(f"mpi-{btl}", jobs[-1]))
                else:
                    skipped[f"mpi-{btl}"] = reason
            for job in jobs:
                if not job.answer().get("ready"):
                    raise RuntimeError(f"{job.name}: its rank 0 did not say it was ready")
            yield chosen
        finally:
            for job in jobs:
                job.stop()


def iterations_for(nbytes: int) -> int:
    """Allreduces per trial: enough to reduce about ``TRIAL_BYTES``, 1 to ``MAX_ITERATIONS``."""
    return max(1, min(MAX_ITERATIONS, TRIAL_BYTES // nbytes))


def ring_bytes(nbytes: int, ranks: int) -> float:
    """The ring bound: bytes each rank must send (and receive) to allreduce ``nbytes``."""
    return 2 * (ranks - 1) / ranks * nbytes


def bench_collective(
    sizes: Sequence[int] = SIZES,
    ranks: int = 4,
    repeat: int = 5,
    compress: Sequence[str] = (),
    mpi_btls: Sequence[str] = ("tcp",),
    progress: Callable[[int], None] | None = None,
) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """Rows (one per size and contender) and the contenders left out, with why.
    ``progress`` is called after every trial with the number of trials in all."""
    if not MIN_RANKS <= ranks <= MAX_RANKS:
        raise ValueError(f"ranks={ranks}: choose {MIN_RANKS} to {MAX_RANKS}")
    for n in sizes:
        if not MIN_BYTES <= n <= MAX_BYTES or n % 4:
            raise ValueError(f"size {n}: choose multiples of 4 bytes from 4 KiB to 256 MiB")
    skipped: dict[str, str] = {}
    times: dict[tuple[str, int], list[float]] = {}
    cpu: dict[tuple[str, int], list[float]] = {}
    with contenders(ranks, compress, mpi_btls, skipped) as chosen:
        total = (repeat + 1) * len(sizes) * len(chosen)
        for round_ in range(repeat + 1):
            turn = round_ % len(chosen)
            for nbytes in sizes:
                for c in chosen[turn:] + chosen[:turn]:
                    seconds, cpu_s = c.job.ask(nbytes, c.variant, iterations_for(nbytes))
                    if round_:  # the first round warms up
                        times.setdefault((c.name, nbytes), []).append(seconds)
                        cpu.setdefault((c.name, nbytes), []).append(cpu_s)
                    if progress:
                        progress(total)
        names = [c.name for c in chosen]
    return _rows(times, cpu, names, sizes, ranks), skipped


def _rows(
    times: dict[tuple[str, int], list[float]],
    cpu: dict[tuple[str, int], list[float]],
    names: list[str],
    sizes: Sequence[int],
    ranks: int,
) -> list[dict[str, Any]]:
    rows = []
    for nbytes in sizes:
        median = {n: statistics.median(times[n, nbytes]) for n in names}
        baselines = {b: median.get(b) for b in ("gloo", "mpi-tcp")}
        for name in names:
            bound = ring_bytes(nbytes, ranks)
            rows.append(
                {
                    "contender": name,
                    "ranks": ranks,
                    "bytes": nbytes,
                    "iterations": iterations_for(nbytes),
                    "trials": len(times[name, nbytes]),
                    "median_ms": median[name] * 1e3,
                    "min_ms": min(times[name, nbytes]) * 1e3,
                    "cpu_ms": statistics.median(cpu[name, nbytes]) * 1e3,
                    "ring_bytes_per_rank": bound,
                    "bus_gb_per_s": bound / median[name] / 1e9,
                    "vs_gloo": _ratio(median[name], baselines["gloo"]),
                    "vs_mpi": _ratio(median[name], baselines["mpi-tcp"]),
                    "times_s": times[name, nbytes],
                }
            )
    return rows


def _ratio(mine: float, theirs: float | None) -> float | None:
    return None if theirs is None else mine / theirs
