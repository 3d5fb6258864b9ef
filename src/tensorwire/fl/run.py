"""``tensorwire fl run``: a server here and N device processes on this machine, one URL."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tensorwire.fl.config import FLConfig, is_factory_ref
from tensorwire.fl.records import RunResult
from tensorwire.fl.server import run_server
from tensorwire.transports import local_hub_url


def device_command(
    url: str,
    device: int | str,
    timeout: float,
    certs: Path | None = None,
    model: str | None = None,
) -> list[str]:
    """The command line of one device process (``model``: a ``package.module:function`` the
    device builds its model with, as the server does)."""
    secured = ["--certs", str(certs)] if certs else []
    own_model = ["--model", model] if model and is_factory_ref(model) else []
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
        *own_model,
    ]


def run_local(
    cfg: FLConfig,
    protocol: str = "tcp",
    *,
    out_dir: Path | None = None,
    on_round: Any = None,
    log_dir: Path | None = None,
    certs: Path | None = None,
    resume: Path | None = None,
) -> tuple[RunResult, Path | None]:
    """Run the server in this process and ``cfg.clients`` devices as subprocesses.

    Results go into ``out_dir`` as rounds finish (with checkpoints). Device output goes to
    ``log_dir/device-N.log`` (default: ``out_dir/logs``). Devices are stopped, whatever
    happens. ``certs``: run secured with the files of ``tensorwire certs`` there (the devices
    are ``device-1`` ...). ``resume``: go on from that results directory's last checkpoint
    (``out_dir`` should be the same directory). Returns the result and the results directory
    (if ``out_dir``).
    """
    procs: list[subprocess.Popen[bytes]] = []
    logs = log_dir or (out_dir / "logs" if out_dir else None)
    if logs:
        logs.mkdir(parents=True, exist_ok=True)

    def spawn(hub_url: str) -> None:
        timeout = max(cfg.round_timeout, cfg.join_timeout)
        for i in range(1, cfg.clients + 1):
            sink = (logs / f"device-{i}.log").open("wb") if logs else subprocess.DEVNULL
            procs.append(
                subprocess.Popen(
                    device_command(hub_url, i, timeout, certs, cfg.model),
                    stdout=sink,
                    stderr=subprocess.STDOUT,
                )
            )

    started = time.time()
    try:
        with local_hub_url(protocol, devices=cfg.clients) as url:
            result = run_server(
                url,
                cfg,
                on_round=on_round,
                on_ready=spawn,
                certs=certs,
                out_dir=out_dir,
                resume=resume,
            )
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
    from tensorwire.fl.results import RunDirectory

    RunDirectory(out_dir).finish(
        result, {"protocol": protocol, "seconds": time.time() - started, "secured": bool(certs)}
    )
    return result, out_dir
