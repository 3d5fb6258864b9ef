"""Device processes on this machine: ``fl run``'s engine.

Each process holds ``devices_per_process`` devices (a thread each, :mod:`.host`), so a
thousand devices need not be a thousand processes. A process's output goes to
``log_dir/device-N.log`` (N: its first device).
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from typing import Any

from tensorwire.fl.config import FLConfig

STOP_GRACE = 30.0  # seconds the device processes get to end by themselves after the run


class LocalEngine:
    """``cfg.clients`` devices, ``devices_per_process`` to a process, on this machine."""

    name = "local"

    def __init__(
        self,
        cfg: FLConfig,
        *,
        devices_per_process: int = 1,
        log_dir: Path | None = None,
        certs: Path | None = None,
    ) -> None:
        if devices_per_process < 1:
            raise ValueError(f"devices_per_process must be positive, got {devices_per_process}")
        self.cfg = cfg
        self.per_process = devices_per_process
        self.log_dir = log_dir
        self.certs = certs
        self.procs: list[subprocess.Popen[bytes]] = []
        self._groups: list[tuple[int, int]] = []  # (first device, count) per process

    def start(self, url: str) -> None:
        from tensorwire.fl.run import device_command

        timeout = max(self.cfg.round_timeout, self.cfg.join_timeout)
        if self.log_dir:
            self.log_dir.mkdir(parents=True, exist_ok=True)
        for first in range(1, self.cfg.clients + 1, self.per_process):
            count = min(self.per_process, self.cfg.clients + 1 - first)
            argv = device_command(url, first, timeout, self.certs, self.cfg.model, count=count)
            sink: Any = subprocess.DEVNULL
            if self.log_dir:
                sink = (self.log_dir / f"device-{first}.log").open("wb")
            try:
                self.procs.append(subprocess.Popen(argv, stdout=sink, stderr=subprocess.STDOUT))
            finally:
                if sink is not subprocess.DEVNULL:
                    sink.close()  # the child holds its own copy
            self._groups.append((first, count))

    def stop(self) -> None:
        deadline = time.monotonic() + STOP_GRACE
        for p in self.procs:
            try:
                p.wait(timeout=max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    def placements(self) -> dict[str, Any]:
        host = os.uname().nodename
        return {
            "engine": self.name,
            "devices_per_process": self.per_process,
            "processes": [
                {"first": first, "count": count, "pid": p.pid, "node": host}
                for (first, count), p in zip(self._groups, self.procs, strict=True)
            ],
        }
