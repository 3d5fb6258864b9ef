"""``tensorwire bench transfer``: tensorwire over TCP against a raw socket, same run, same data.

Each trial is one tensor from this process to a receiver process plus a small ack back, timed
here from the start of the send to the ack. The raw baseline is what a careful hand-written
sender does: ``sendall`` of the array's memoryview after an 8-byte length, and ``recv_into``
a preallocated buffer that is reused. The tensorwire receiver decodes into the previous
message's arrays (``recv(out=...)``), its equivalent of that reuse.

Trials of the two alternate, so a slow spell of the machine hits both; ``ratio`` is the
median over those pairs. With two or more CPUs the sender is pinned to the first and the
receivers to the last, as two hosts would be: left to the scheduler, a receiver that lands on
the sender's CPU halves the throughput of whichever trial it happens to.
"""

from __future__ import annotations

import contextlib
import os
import socket
import statistics
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

import tensorwire
from tensorwire.bench.progress import progress_bar

GSOC_DTYPES = ("float16", "float32", "float64")
GSOC_SHAPES = ((100, 100), (200, 200), (500, 500), (1000, 1000), (3000, 3000))
_LEN = struct.Struct("<Q")
_ACK_TIMEOUT = 120.0


@dataclass
class TransferTrial:
    """A named way of moving one array to the receiver and waiting for its ack."""

    name: str
    once: Callable[[np.ndarray], float]


def _cpus() -> list[int]:
    return sorted(os.sched_getaffinity(0))


def _spawn(*args: str) -> subprocess.Popen[bytes]:
    pin = ["--cpu", str(_cpus()[-1])] if len(_cpus()) > 1 else []
    return subprocess.Popen([sys.executable, "-m", "tensorwire.bench.peer", *pin, *args])


@contextlib.contextmanager
def pinned_sender() -> Any:
    """Run this thread (and the threads it starts) on the first CPU only, if there are two+."""
    before = os.sched_getaffinity(0)
    if len(before) > 1:
        os.sched_setaffinity(0, {min(before)})
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


class TransferRig:
    """A tensorwire hub and a raw socket server, each with its own receiver process."""

    def __init__(self, codec: Any = "auto") -> None:
        self.hub = tensorwire.serve("tcp://127.0.0.1:0", codec=codec)
        self._procs = [_spawn("tw", self.hub.url, "bench-peer", "reuse")]
        self.hub.wait_for(1, timeout=60)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._procs.append(_spawn("raw", "127.0.0.1", str(self._listener.getsockname()[1])))
        self._listener.settimeout(60)
        self._raw, _ = self._listener.accept()
        self._raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._ack = bytearray(1)

    def tensorwire_once(self, arr: np.ndarray) -> float:
        t = time.perf_counter()
        self.hub.send("bench-peer", {"x": arr})
        self.hub.recv(timeout=_ACK_TIMEOUT)
        return time.perf_counter() - t

    def raw_once(self, arr: np.ndarray) -> float:
        view = memoryview(arr.reshape(-1).view(np.uint8))
        t = time.perf_counter()
        self._raw.sendall(_LEN.pack(len(view)))
        self._raw.sendall(view)
        self._raw.recv_into(self._ack)
        return time.perf_counter() - t

    @property
    def trials(self) -> list[TransferTrial]:
        return [
            TransferTrial("tensorwire-tcp", self.tensorwire_once),
            TransferTrial("raw-socket", self.raw_once),
        ]

    def close(self) -> None:
        self.hub.close()
        self._raw.close()
        self._listener.close()
        for p in self._procs:
            p.wait(timeout=30)


def _data(shape: tuple[int, ...], dtype: str, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.standard_normal(shape, dtype=np.float32).astype(dtype)


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


def _rows(case: str, arr: np.ndarray, times: dict[str, list[float]]) -> list[dict[str, Any]]:
    rows = []
    baseline = times["raw-socket"]
    for name, ts in times.items():
        med = statistics.median(ts)
        rows.append(
            {
                "case": case,
                "transport": name,
                "dtype": str(arr.dtype),
                "shape": "x".join(map(str, arr.shape)),
                "bytes": arr.nbytes,
                "runs": len(ts),
                "median_ms": med * 1e3,
                "min_ms": min(ts) * 1e3,
                "gb_per_s": arr.nbytes / med / 1e9,
                # > 1 is faster than the raw socket: median of per-pair throughput ratios
                "vs_raw": statistics.median(b / t for t, b in zip(ts, baseline, strict=True)),
            }
        )
    return rows


def bench_transfer(
    *,
    dtypes: Iterable[str] = GSOC_DTYPES,
    shapes: Iterable[tuple[int, ...]] = GSOC_SHAPES,
    repeat: int = 7,
    big_mib: int = 128,
    codec: Any = "auto",
) -> list[dict[str, Any]]:
    """Run the GSoC table and the big-tensor throughput case; one row per (case, transport)."""
    cases = [("gsoc", dt, tuple(sh)) for dt in dtypes for sh in shapes]
    if big_mib:
        cases.append(("throughput", "float32", (big_mib << 18,)))  # big_mib MiB of float32
    rows: list[dict[str, Any]] = []
    with pinned_sender(), progress_bar() as bar:
        rig = TransferRig(codec)
        try:
            task = bar.add_task("transfer", total=len(cases))
            for case, dtype, shape in cases:
                bar.update(task, description=f"{case} {dtype} {'x'.join(map(str, shape))}")
                arr = _data(shape, dtype)
                rows += _rows(case, arr, time_trials(rig.trials, arr, repeat))
                bar.advance(task)
        finally:
            rig.close()
    return rows


def bench_receiver_memory(gib: float = 1.0) -> dict[str, Any]:
    """Peak resident memory a fresh receiver process adds to receive one ``gib`` GiB tensor."""
    nbytes = int(gib * (1 << 30)) // 4 * 4
    arr = np.ones(nbytes // 4, np.float32)
    with tensorwire.serve("tcp://127.0.0.1:0", codec=None) as hub:
        proc = _spawn("tw", hub.url, "bench-rss", "fresh")
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
