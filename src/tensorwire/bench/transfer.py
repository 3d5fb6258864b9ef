"""``tensorwire bench transfer``: tensorwire over every transport against the peers used directly.

Each trial is one tensor from this process to a receiver process plus a small ack back, timed
here from the start of the send to the ack. tensorwire trials send through a hub to a channel
that decodes into the previous message's arrays (``recv(out=...)``); baseline trials use a
library directly, the way its users do (``tensorwire.bench.baselines``): a raw socket doing
``sendall`` / ``recv_into`` a reused buffer, pyzmq with ``copy=False``, pyarrow Flight, paho +
Mosquitto, pika + RabbitMQ. With ``tls``, every transport also runs secured (TLS or the
transport's own encryption, and enrolled device keys: ``tensorwire certs``), compared with the
same transport unsecured (``vs_baseline`` = plain time / secured time).

All trials of a case alternate, so a slow spell of the machine hits all of them alike;
``vs_baseline`` is the median over those rounds of baseline time / tensorwire time (> 1: faster
than the library it wraps). With two or more CPUs the sender is pinned to the first and the
receivers to the last, as two hosts would be: left to the scheduler, a receiver that lands on
the sender's CPU halves the throughput of whichever trial it happens to.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

import tensorwire
from tensorwire.bench import baselines
from tensorwire.bench.progress import progress_bar
from tensorwire.transports.local import local_hub_url
from tensorwire.transports.registry import get_transport
from tensorwire.transports.security import credentials_from_dir

GSOC_DTYPES = ("float16", "float32", "float64")
GSOC_SHAPES = ((100, 100), (200, 200), (500, 500), (1000, 1000), (3000, 3000))
_ACK_TIMEOUT = 300.0


def wrapped_library(transport: str) -> str | None:
    """The baseline module (in ``tensorwire.bench.baselines``) that uses the library
    ``transport`` wraps directly, from its registry entry; None if it has none."""
    return get_transport(transport).baseline


def wrapped_libraries(transports: Iterable[str]) -> list[str]:
    """The baseline modules of ``transports``, each once, in their order."""
    found = (wrapped_library(t) for t in transports)
    return list(dict.fromkeys(b for b in found if b is not None))


@dataclass
class TransferTrial:
    """A named way of moving one array to the receiver and waiting for its ack."""

    name: str
    once: Callable[[np.ndarray], float]
    baseline: str | None = None  # the trial this one is compared with


# The CPUs this process may use, read before pinned_sender() narrows the calling thread's.
_CPUS = sorted(os.sched_getaffinity(0))


def peer_argv(*args: str) -> list[str]:
    """The argv of a receiver process (``tensorwire.bench.peer``), on the last CPU when 2+."""
    pin = ["--cpu", str(_CPUS[-1])] if len(_CPUS) > 1 else []
    return [sys.executable, "-m", "tensorwire.bench.peer", *pin, *args]


def spawn_peer(*args: str) -> subprocess.Popen[bytes]:
    """Start a receiver process (``tensorwire.bench.peer``), on the last CPU when there are 2+."""
    return subprocess.Popen(peer_argv(*args))


@contextlib.contextmanager
def pinned_sender() -> Iterator[None]:
    """Run this thread (and the threads it starts) on the first CPU only, if there are two+."""
    before = os.sched_getaffinity(0)
    if len(_CPUS) > 1:
        os.sched_setaffinity(0, {_CPUS[0]})
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


class TransferRig:
    """Hubs for the chosen transports and senders for the chosen baselines, each with a receiver."""

    def __init__(
        self,
        transports: Iterable[str],
        baseline_modules: Iterable[str],
        codec: Any = "auto",
        certs: Path | None = None,
    ) -> None:
        self._stack = contextlib.ExitStack()
        self._procs: list[subprocess.Popen[bytes]] = []
        self.trials: list[TransferTrial] = []
        try:
            for module in baseline_modules:
                self._add_baseline(module)
            for transport in transports:
                self._add_transport(transport, codec)
                if certs is not None:
                    self._add_transport(transport, codec, certs)
        except BaseException:
            self.close()
            raise

    def _add_baseline(self, module: str) -> None:
        mod = baselines.load(module)
        try:
            sender = mod.Sender()
        except baselines.BaselineUnavailable as exc:
            print(f"{mod.NAME}: skipped: {exc}", file=sys.stderr)
            return
        self._stack.callback(sender.close)
        if sender.receiver_args is not None:  # else the sender placed its receiver itself
            self._procs.append(spawn_peer("baseline", module, *sender.receiver_args))
        self.trials.append(TransferTrial(mod.NAME, sender.once))

    def _add_transport(self, transport: str, codec: Any, certs: Path | None = None) -> None:
        url = self._stack.enter_context(local_hub_url(transport, secure=certs))
        security = credentials_from_dir(certs, "hub") if certs else {}
        hub = self._stack.enter_context(tensorwire.serve(url, codec=codec, **security))
        peer_url = hub.url
        if certs is not None:
            d = credentials_from_dir(certs, "channel", "bench-peer")
            sep = "&" if "?" in peer_url else "?"
            peer_url += (
                f"{sep}ca={d['tls'].ca}&cert={d['tls'].cert}&certkey={d['tls'].key}"
                f"&secret={d['key']}"
            )
        self._procs.append(spawn_peer("tw", peer_url, "bench-peer", "reuse"))
        hub.wait_for(1, timeout=120)

        def once(arr: np.ndarray) -> float:
            t = time.perf_counter()
            hub.send("bench-peer", {"x": arr})
            hub.recv(timeout=_ACK_TIMEOUT)
            return time.perf_counter() - t

        entry = get_transport(transport)
        if certs is not None:  # compared with the same transport unsecured
            self.trials.append(TransferTrial(f"{entry.label}+tls", once, entry.label))
            return
        names = {t.name for t in self.trials}
        base = baselines.load(entry.baseline).NAME if entry.baseline else None
        self.trials.append(TransferTrial(entry.label, once, base if base in names else None))

    def close(self) -> None:
        self._stack.close()
        for p in self._procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()


def random_tensor(shape: tuple[int, ...], dtype: str, seed: int = 0) -> np.ndarray:
    """Normal random data at full precision: what model weights and updates look like to a
    compressor (float64 drawn as float64: float32 cast up would leave mantissa bits zero)."""
    rng = np.random.default_rng(seed)
    return rng.standard_normal(shape).astype(dtype)


def time_trials(
    trials: Iterable[TransferTrial], arr: np.ndarray, repeat: int
) -> dict[str, list[float]]:
    """Time each trial ``repeat`` times after one warm-up, interleaved so drift hits all alike."""
    trials = list(trials)
    times: dict[str, list[float]] = {t.name: [] for t in trials}
    for t in trials:
        t.once(arr)
    for _ in range(repeat):
        for t in trials:
            times[t.name].append(t.once(arr))
    return times


def _paired_ratio(baseline: list[float], ours: list[float]) -> float:
    return statistics.median(b / t for t, b in zip(ours, baseline, strict=True))


def paired_ratio(rows: list[dict[str, Any]], baseline: str, ours: str, **case: Any) -> float | None:
    """Median over rounds of ``baseline`` time / ``ours`` time in the rows matching ``case``
    (e.g. ``dtype="float64", shape="3000x3000"``); None if either is missing."""
    found = {
        r["transport"]: r["times_ms"]
        for r in rows
        if all(r.get(k) == v for k, v in case.items()) and r["transport"] in (baseline, ours)
    }
    if baseline not in found or ours not in found:
        return None
    return _paired_ratio(found[baseline], found[ours])


def _rows(
    case: str, arr: np.ndarray, trials: list[TransferTrial], times: dict[str, list[float]]
) -> list[dict[str, Any]]:
    rows = []
    for trial in trials:
        ts = times[trial.name]
        med = statistics.median(ts)
        row = {
            "case": case,
            "transport": trial.name,
            "dtype": str(arr.dtype),
            "shape": "x".join(map(str, arr.shape)),
            "bytes": arr.nbytes,
            "runs": len(ts),
            "median_ms": med * 1e3,
            "min_ms": min(ts) * 1e3,
            "gb_per_s": arr.nbytes / med / 1e9,
            "baseline": trial.baseline or "",
            "vs_baseline": _paired_ratio(times[trial.baseline], ts) if trial.baseline else None,
            "times_ms": [t * 1e3 for t in ts],  # in trial order: pairs line up across trials
        }
        rows.append(row)
    return rows


def bench_transfer(
    *,
    transports: Iterable[str] = ("tcp",),
    baseline_modules: Iterable[str] = ("socket",),
    dtypes: Iterable[str] = GSOC_DTYPES,
    shapes: Iterable[tuple[int, ...]] = GSOC_SHAPES,
    repeat: int = 7,
    big_mib: int = 128,
    codec: Any = "auto",
    tls: bool = False,
) -> list[dict[str, Any]]:
    """Run the GSoC table and the big-tensor throughput case; one row per (case, trial).

    ``tls``: also run every transport secured (certificates made for the run)."""
    cases = [("gsoc", dt, tuple(sh)) for dt in dtypes for sh in shapes]
    if big_mib:
        cases.append(("throughput", "float32", (big_mib << 18,)))  # big_mib MiB of float32
    rows: list[dict[str, Any]] = []
    with contextlib.ExitStack() as stack, pinned_sender(), progress_bar() as bar:
        certs = None
        if tls:
            from tensorwire.transports.certs import make_certs

            certs = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="tw-certs-")))
            make_certs(certs, hosts=["127.0.0.1", "localhost"], clients=["bench-peer"])
        rig = TransferRig(transports, baseline_modules, codec, certs)
        try:
            task = bar.add_task("transfer", total=len(cases))
            for case, dtype, shape in cases:
                bar.update(task, description=f"{case} {dtype} {'x'.join(map(str, shape))}")
                arr = random_tensor(shape, dtype)
                times = time_trials(rig.trials, arr, repeat)
                rows += _rows(case, arr, rig.trials, times)
                bar.advance(task)
        finally:
            rig.close()
    return rows


def bench_receiver_memory(gib: float = 1.0) -> dict[str, Any]:
    """Peak resident memory a fresh receiver process adds to receive one ``gib`` GiB tensor."""
    nbytes = int(gib * (1 << 30)) // 4 * 4
    arr = np.ones(nbytes // 4, np.float32)
    with tensorwire.serve("tcp://127.0.0.1:0", codec=None) as hub:
        proc = spawn_peer("tw", hub.url, "bench-rss", "fresh")
        try:
            hub.wait_for(1, timeout=60)
            t = time.perf_counter()
            hub.send("bench-rss", {"x": arr})
            _, ack = hub.recv(timeout=_ACK_TIMEOUT)
            seconds = time.perf_counter() - t
        finally:
            hub.close()
            proc.wait(timeout=30)
    growth = ack.meta["rss_peak"] - ack.meta["rss_before"]
    return {
        "case": "receiver-memory",
        "bytes": nbytes,
        "rss_before_bytes": ack.meta["rss_before"],
        "rss_peak_bytes": ack.meta["rss_peak"],
        "rss_growth_bytes": growth,
        "growth_per_byte": growth / nbytes,
        "seconds": seconds,
    }
