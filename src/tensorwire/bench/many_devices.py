"""``tensorwire fl scale``: one FL server and a thousand devices on this machine.

Each protocol gets a whole run (the built-in ``mlp`` on synthetic data by default), its
devices held ``devices_per_process`` to a process, a thread each. Measured: the time for
every device to join and be set up (wall), each round's wall time, and the server's memory:
its resident memory once it listens (before any device) and its peak (VmHWM) over the run,
whose difference is what the devices cost it. Over mqtt a private Mosquitto is started,
sized for the devices (``max_connections``; it inherits this process's descriptor limit),
and its own peak memory is reported too: the machine's broker is never used.
"""

from __future__ import annotations

import contextlib
import os
import resource
import statistics
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tensorwire.fl.config import FLConfig
from tensorwire.fl.engines.local import LocalEngine

BROKER_SPARE = 64  # broker connections beyond one per device (the hub's, probes)
FD_PER_DEVICE = 2  # descriptors a broker or hub needs per device, with room to spare


def status_kib(pid: int | str, key: str) -> int:
    """A ``/proc/PID/status`` value in KiB (``VmRSS``, ``VmHWM`` ...); 0 if it is gone."""
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return 0


def reset_peak_memory() -> bool:
    """Start this process's VmHWM again from its current resident memory (Linux's
    ``clear_refs`` 5); False where the kernel refuses."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


@dataclass
class _Watch:
    """What one run's hooks saw: when the server listened and its memory then."""

    ready_at: float = 0.0
    rss_ready_kib: int = 0
    round_ends: list[float] = field(default_factory=list)


class _TimedEngine(LocalEngine):
    """The local engine, noting when the server listened and its memory at that moment."""

    def __init__(self, watch: _Watch, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.watch = watch

    def start(self, url: str) -> None:
        self.watch.ready_at = time.perf_counter()
        self.watch.rss_ready_kib = status_kib("self", "VmRSS")
        super().start(url)


@contextlib.contextmanager
def _serving_url(protocol: str, devices: int) -> Iterator[tuple[str, int | None]]:
    """A URL to serve ``protocol`` on here, and the private broker's pid (if any)."""
    from tensorwire.transports import local_hub_url
    from tensorwire.transports.brokers import MosquittoBroker
    from tensorwire.transports.registry import get_transport

    entry = get_transport(protocol)
    kind = entry.broker_kind()
    if kind is not None and kind.load("server") is not MosquittoBroker:
        raise ValueError(
            f"fl scale starts a broker of its own for Mosquitto's transports only; {protocol} "
            f"would load the machine's {entry.broker}"
        )
    if kind is not None:
        limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        if limit != resource.RLIM_INFINITY and limit < FD_PER_DEVICE * devices + BROKER_SPARE:
            raise RuntimeError(
                f"{devices} devices over mqtt need {FD_PER_DEVICE * devices + BROKER_SPARE} "
                f"file descriptors for the broker; this process may open {limit} (ulimit -n)"
            )
        with MosquittoBroker(devices=devices) as broker:  # its URL names its limit
            yield broker.url(f"tw-scale-{uuid.uuid4().hex[:8]}"), broker.pid
        return
    with local_hub_url(protocol) as url:
        yield url, None


def run_many(
    cfg: FLConfig, protocol: str, out_dir: Path, devices_per_process: int
) -> dict[str, Any]:
    """One run of ``cfg`` over ``protocol``; its row of the table (seconds, MiB)."""
    from tensorwire.fl.run import run_local

    watch = _Watch()
    engine = _TimedEngine(
        watch, cfg, devices_per_process=devices_per_process, log_dir=out_dir / "logs"
    )
    peak_reset = reset_peak_memory()
    broker_hwm = 0
    with _serving_url(protocol, cfg.clients) as (url, broker_pid):
        result, _ = run_local(
            cfg,
            protocol,
            out_dir=out_dir,
            engine=engine,
            url=url,
            on_round=lambda row: watch.round_ends.append(time.perf_counter()),
        )
        if broker_pid is not None:
            broker_hwm = status_kib(broker_pid, "VmHWM")
    rows = result.rounds
    round_s = [float(r["round_s"]) for r in rows]
    first_end = watch.round_ends[0] if watch.round_ends else watch.ready_at
    return {
        "protocol": protocol,
        "devices": cfg.clients,
        "per process": devices_per_process,
        "sampled/round": statistics.median(len(r["sampled"]) for r in rows) if rows else 0,
        "rounds": len(rows),
        "join s (wall, all)": round(first_end - (round_s[0] if round_s else 0) - watch.ready_at, 2),
        "round s (median)": round(statistics.median(round_s), 3) if round_s else None,
        "round s (max)": round(max(round_s), 3) if round_s else None,
        "server RSS ready MiB": round(watch.rss_ready_kib / 1024, 1),
        "server peak MiB": round(status_kib("self", "VmHWM") / 1024, 1) if peak_reset else None,
        "broker peak MiB": round(broker_hwm / 1024, 1) if broker_hwm else None,
        "accuracy": round(float(rows[-1]["accuracy"]), 4) if rows else None,
        "updates": sum(int(r["updates"]) for r in rows),
        "pid": os.getpid(),
    }


COLUMNS = (
    "protocol",
    "devices",
    "per process",
    "sampled/round",
    "rounds",
    "join s (wall, all)",
    "round s (median)",
    "round s (max)",
    "server RSS ready MiB",
    "server peak MiB",
    "broker peak MiB",
    "updates",
    "accuracy",
)
