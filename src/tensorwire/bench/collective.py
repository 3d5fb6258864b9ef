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
at least, and the bus bandwidth it implies (that many bytes / the median time).

With ``profiles`` the jobs run on the testbed instead (:mod:`tensorwire.bench.collective_testbed`):
each rank in a network namespace of its own behind its own link, shaped with each profile
in turn (the jobs stay up; only the links change), and each row also has the time the ring
bound allows at the link's rate and the median's ratio to it. Once per size (on the first
link) every contender's error is measured too: one allreduce of random data against the
exact sum (see :mod:`tensorwire.bench.collective_rank`).
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
from typing import TYPE_CHECKING, Any, Protocol

from tensorwire.bench.collective_rank import QUIT
from tensorwire.collective import Group, Rendezvous
from tensorwire.collective.mpirun import mpi_missing, mpirun_command, mpirun_env

if TYPE_CHECKING:
    from tensorwire.testbed import Testbed

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
TRIAL_SECONDS = 1.0
"""On a shaped link a trial moves at most what the link carries in about this long."""
TIMEOUT = 300.0
"""Seconds any one reply may take before the run fails (a rank that died or hung)."""


@dataclass
class Contender:
    """A named allreduce: variant ``variant`` of job ``job``, its ranks ``placed`` so
    (``loopback``, ``netns``: each in its own namespace behind its own link)."""

    name: str
    job: Job
    variant: int = 0
    placed: str = "loopback"


class Placement(Protocol):
    """Where a run's jobs start: loopback, or the testbed's namespaces (``placed`` says
    which, in the rows)."""

    placed: str

    def tensorwire_job(self, ranks: int, variants: list[dict[str, Any]]) -> Job: ...

    def gloo_job(self, ranks: int, store: Path) -> Job: ...

    def mpi_job(self, ranks: int, btl: str, tmp: Path) -> tuple[Job, str]: ...


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
        got = self._command(nbytes, variant, iterations)
        return float(got["seconds"]), float(got["cpu_seconds"])

    def error(self, nbytes: int, variant: int) -> float:
        """``variant``'s largest error over the largest exact sum, on random data."""
        return float(self._command(nbytes, variant, 0)["max_rel_error"])

    def _command(self, nbytes: int, variant: int, iterations: int) -> dict[str, Any]:
        stdin = self.procs[0].stdin
        assert stdin is not None
        stdin.write(f"{nbytes} {variant} {iterations}\n")
        stdin.flush()
        return self.answer()

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


def rank_argv(*args: str) -> list[str]:
    """The argv of one of a job's rank processes (see :mod:`tensorwire.bench.collective_rank`)."""
    return [sys.executable, "-m", "tensorwire.bench.collective_rank", *args]


def tensorwire_variants(
    compress: Sequence[str], algorithms: Sequence[str] = tuple(ALGORITHMS)
) -> list[tuple[str, dict[str, Any]]]:
    """tensorwire's contenders: every one of ``algorithms``, each with every ``compress``
    option (when ``Group.allreduce`` takes ``compress=``; asking for one when it does not is
    an error)."""
    if not algorithms:
        raise ValueError(f"no algorithm: choose from {', '.join(ALGORITHMS)}")
    for name in algorithms:
        if name not in ALGORITHMS:
            raise ValueError(f"algorithm {name!r}: choose from {', '.join(ALGORITHMS)}")
    variants = [(f"tensorwire-{n}", {"algorithm": ALGORITHMS[n]}) for n in algorithms]
    if not compress:
        return variants
    if "compress" not in inspect.signature(Group.allreduce).parameters:
        raise ValueError("this tensorwire's Group.allreduce takes no compress=")
    return variants + [
        (f"{name}-{c}", {**kwargs, "compress": c}) for name, kwargs in variants for c in compress
    ]


class Loopback:
    """Every job's ranks on this host's loopback."""

    placed = "loopback"

    def tensorwire_job(self, ranks: int, variants: list[dict[str, Any]]) -> Job:
        env = dict(os.environ)
        with Rendezvous("tcp://127.0.0.1:0", ranks, timeout=TIMEOUT) as meeting:
            spec = json.dumps(variants)
            argv = [
                rank_argv("tensorwire", meeting.url, str(r), str(ranks), spec) for r in range(ranks)
            ]
            return Job("tensorwire", [_spawn(a, r == 0, env) for r, a in enumerate(argv)])

    def gloo_job(self, ranks: int, store: Path) -> Job:
        env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "MASTER_ADDR": "127.0.0.1"}
        argv = [rank_argv("gloo", str(store), str(r), str(ranks)) for r in range(ranks)]
        return Job("gloo", [_spawn(a, r == 0, env) for r, a in enumerate(argv)])

    def mpi_job(self, ranks: int, btl: str, tmp: Path) -> tuple[Job, str]:
        command = mpirun_command(ranks, rank_argv("mpi"), btl)
        return Job(f"mpi-{btl}", [_spawn(command, True, mpirun_env())]), self.placed


def gloo_missing() -> str | None:
    """Why gloo cannot run here, or None when it can."""
    try:
        import torch.distributed as dist
    except ImportError:
        return "torch is not installed: pip install 'tensorwire[fl]'"
    return None if dist.is_available() and dist.is_gloo_available() else "torch has no gloo"


@contextlib.contextmanager
def contenders(
    ranks: int,
    compress: Sequence[str],
    mpi_btls: Sequence[str],
    skipped: dict[str, str],
    algorithms: Sequence[str] = tuple(ALGORITHMS),
    place: Placement | None = None,
) -> Iterator[list[Contender]]:
    """Every contender's job started (``place``: where; loopback by default) and ready;
    those that cannot run here are left out, with the reason in ``skipped``. The jobs end
    when the block does."""
    place = place or Loopback()
    placed = place.placed
    jobs: list[Job] = []
    chosen: list[Contender] = []
    with tempfile.TemporaryDirectory(prefix="tw-bench-collective-") as tmp:
        try:
            variants = tensorwire_variants(compress, algorithms)
            job = place.tensorwire_job(ranks, [kwargs for _, kwargs in variants])
            jobs.append(job)
            chosen += [Contender(name, job, i, placed) for i, (name, _) in enumerate(variants)]
            reason = gloo_missing()
            if reason is None:
                jobs.append(place.gloo_job(ranks, Path(tmp) / "store"))
                chosen.append(Contender("gloo", jobs[-1], 0, placed))
            else:
                skipped["gloo"] = reason
            reason = mpi_missing()
            for btl in mpi_btls:
                if reason is None:
                    job, where = place.mpi_job(ranks, btl, Path(tmp))
                    jobs.append(job)
                    chosen.append(Contender(f"mpi-{btl}", job, 0, where))
                else:
                    skipped[f"mpi-{btl}"] = reason
            for job in jobs:
                if not job.answer().get("ready"):
                    raise RuntimeError(f"{job.name}: its rank 0 did not say it was ready")
            yield chosen
        finally:
            for job in jobs:
                job.stop()


def iterations_for(nbytes: int, rate: float | None = None) -> int:
    """Allreduces per trial: enough to reduce about ``TRIAL_BYTES`` (on a link of ``rate``
    bits/s at most what it carries in ``TRIAL_SECONDS``), 1 to ``MAX_ITERATIONS``."""
    budget = TRIAL_BYTES if rate is None else min(TRIAL_BYTES, rate / 8 * TRIAL_SECONDS)
    return int(max(1, min(MAX_ITERATIONS, budget // nbytes)))


def ring_bytes(nbytes: int, ranks: int) -> float:
    """The ring bound: bytes each rank must send (and receive) to allreduce ``nbytes``."""
    return 2 * (ranks - 1) / ranks * nbytes


@dataclass(frozen=True)
class Link:
    """What the ranks are joined by for a pass of rounds: ``name`` (a profile, or
    ``loopback``) and its rate in bits/s (None: unshaped)."""

    name: str
    rate: float | None = None


def bench_collective(
    sizes: Sequence[int] = SIZES,
    ranks: int = 4,
    repeat: int = 5,
    compress: Sequence[str] = (),
    mpi_btls: Sequence[str] = ("tcp",),
    progress: Callable[[int], None] | None = None,
    algorithms: Sequence[str] = tuple(ALGORITHMS),
    profiles: Sequence[str] | None = None,
    say: Callable[[str], None] = lambda _: None,
) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """Rows (one per link, size and contender) and the contenders left out, with why.
    ``profiles``: run on the testbed, each rank behind its own link shaped with each of
    these in turn (None: on loopback). ``progress`` is called after every trial with the
    number of trials in all; ``say`` gets notes (where the testbed cannot be made)."""
    if not MIN_RANKS <= ranks <= MAX_RANKS:
        raise ValueError(f"ranks={ranks}: choose {MIN_RANKS} to {MAX_RANKS}")
    for n in sizes:
        if not MIN_BYTES <= n <= MAX_BYTES or n % 4:
            raise ValueError(f"size {n}: choose multiples of 4 bytes from 4 KiB to 256 MiB")
    tensorwire_variants(compress, algorithms)  # a wrong choice fails before any rank starts
    skipped: dict[str, str] = {}
    with contextlib.ExitStack() as stack:
        place: Placement = Loopback()
        links = [Link("loopback")]
        testbed: Testbed | None = None
        if profiles is not None:
            from tensorwire.bench.collective_testbed import open_testbed

            testbed, place, links = stack.enter_context(open_testbed(ranks, profiles, say))
        chosen = stack.enter_context(
            contenders(ranks, compress, mpi_btls, skipped, algorithms, place)
        )
        total = (repeat + 1) * len(sizes) * len(chosen) * len(links) + len(sizes) * len(chosen)
        rows: list[dict[str, Any]] = []
        errors: dict[tuple[str, int], float] = {}
        for link in links:
            if testbed is not None:
                testbed.set_profile(link.name)
            times, cpu = _rounds(chosen, sizes, repeat, link, total, progress)
            if not errors:
                for nbytes in sizes:
                    for c in chosen:
                        errors[c.name, nbytes] = c.job.error(nbytes, c.variant)
                        if progress:
                            progress(total)
            rows += _rows(times, cpu, errors, chosen, sizes, ranks, link)
    return rows, skipped


def _rounds(
    chosen: list[Contender],
    sizes: Sequence[int],
    repeat: int,
    link: Link,
    total: int,
    progress: Callable[[int], None] | None,
) -> tuple[dict[tuple[str, int], list[float]], dict[tuple[str, int], list[float]]]:
    """Every contender's times and CPU times per size: ``repeat`` rounds after one that
    warms up, the order of contenders rotating from round to round."""
    times: dict[tuple[str, int], list[float]] = {}
    cpu: dict[tuple[str, int], list[float]] = {}
    for round_ in range(repeat + 1):
        turn = round_ % len(chosen)
        for nbytes in sizes:
            for c in chosen[turn:] + chosen[:turn]:
                seconds, cpu_s = c.job.ask(nbytes, c.variant, iterations_for(nbytes, link.rate))
                if round_:  # the first round warms up
                    times.setdefault((c.name, nbytes), []).append(seconds)
                    cpu.setdefault((c.name, nbytes), []).append(cpu_s)
                if progress:
                    progress(total)
    return times, cpu


def _rows(
    times: dict[tuple[str, int], list[float]],
    cpu: dict[tuple[str, int], list[float]],
    errors: dict[tuple[str, int], float],
    chosen: list[Contender],
    sizes: Sequence[int],
    ranks: int,
    link: Link,
) -> list[dict[str, Any]]:
    rows = []
    for nbytes in sizes:
        median = {c.name: statistics.median(times[c.name, nbytes]) for c in chosen}
        baselines = {b: median.get(b) for b in ("gloo", "mpi-tcp")}
        bound = ring_bytes(nbytes, ranks)
        bound_s = None if link.rate is None else bound * 8 / link.rate
        for c in chosen:
            mine = median[c.name]
            rows.append(
                {
                    "link": link.name,
                    "link_bits_per_s": link.rate,
                    "placed": c.placed,
                    "contender": c.name,
                    "ranks": ranks,
                    "bytes": nbytes,
                    "iterations": iterations_for(nbytes, link.rate),
                    "trials": len(times[c.name, nbytes]),
                    "median_ms": mine * 1e3,
                    "min_ms": min(times[c.name, nbytes]) * 1e3,
                    "cpu_ms": statistics.median(cpu[c.name, nbytes]) * 1e3,
                    "ring_bytes_per_rank": bound,
                    "bus_gb_per_s": bound / mine / 1e9,
                    "ring_bound_ms": None if bound_s is None else bound_s * 1e3,
                    "vs_ring_bound": _ratio(mine, bound_s),
                    "vs_gloo": _ratio(mine, baselines["gloo"]),
                    "vs_mpi": _ratio(mine, baselines["mpi-tcp"]),
                    "max_rel_error": errors[c.name, nbytes],
                    "times_s": times[c.name, nbytes],
                }
            )
    return rows


def _ratio(mine: float, theirs: float | None) -> float | None:
    return None if theirs is None else mine / theirs
