"""``tensorwire fl run``: a server here and N device processes on this machine, one URL."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tensorwire.fl.config import FLConfig
from tensorwire.fl.results import write_run
from tensorwire.fl.server import RunResult, run_server
from tensorwire.transports.local import local_hub_url


def device_command(url: str, device: int, timeout: float, certs: Path | None = None) -> list[str]:
    """The command line of one device process."""
    secured = ["--certs", str(certs)] if certs else []
    return [
        sys.executable,
        "-m",
        "tensorwire",
        "fl",
        "client",
        "--url",
        url,
        "--id",
        str(device),
        "--timeout",
        str(timeout),
        *secured,
    ]


def run_local(
    cfg: FLConfig,
    protocol: str = "tcp",
    *,
    out_dir: Path | None = None,
    on_round: Any = None,
    log_dir: Path | None = None,
    certs: Path | None = None,
) -> tuple[RunResult, Path | None]:
    """Run the server in this process and ``cfg.clients`` devices as subprocesses.

    Device output goes to ``log_dir/device-N.log`` (default: ``out_dir/logs``). Devices are
    stopped, whatever happens. ``certs``: run secured with the files of ``tensorwire certs``
    there (the devices are ``device-1`` ...). Returns the result and the results directory
    (if ``out_dir``).
    """
    procs: list[subprocess.Popen[bytes]] = []
    logs = log_dir or (out_dir / "logs" if out_dir else None)
    if logs:
        logs.mkdir(parents=True, exist_ok=True)

    def spawn(hub_url: str) -> None:
        for i in range(1, cfg.clients + 1):
            sink = (logs / f"device-{i}.log").open("wb") if logs else subprocess.DEVNULL
            procs.append(
                subprocess.Popen(
                    device_command(hub_url, i, cfg.round_timeout, certs),
                    stdout=sink,
                    stderr=subprocess.STDOUT,
                )
            )

    started = time.time()
    try:
        with local_hub_url(protocol) as url:
            result = run_server(url, cfg, on_round=on_round, on_ready=spawn, certs=certs)
            served_at = url
    finally:
        deadline = time.monotonic() + 30
        for p in procs:
            try:
                p.wait(timeout=max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
    if out_dir is None:
        return result, None
    extra = {
        "protocol": protocol,
        "url": served_at,
        "seconds": time.time() - started,
        "secured": certs is not None,
    }
    return result, write_run(result, out_dir, extra)
