"""``tensorwire fl run``: a server here and N devices, placed by an engine (processes on this
machine, or on a Ray cluster's nodes), one URL."""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tensorwire.fl.config import FLConfig, is_factory_ref
from tensorwire.fl.engines import DeviceEngine
from tensorwire.fl.records import RunResult
from tensorwire.fl.server import run_server
from tensorwire.transports import local_hub_url


def device_command(
    url: str,
    device: int | str,
    timeout: float,
    certs: Path | None = None,
    model: str | None = None,
    count: int = 1,
) -> list[str]:
    """The command line of one device process (``model``: a ``package.module:function`` the
    device builds its model with, as the server does; ``count``: devices it holds, numbered
    from ``device``)."""
    secured = ["--certs", str(certs)] if certs else []
    own_model = ["--model", model] if model and is_factory_ref(model) else []
    many = ["--count", str(count)] if count > 1 else []
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
        *many,
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
    engine: DeviceEngine | None = None,
    url: str | None = None,
) -> tuple[RunResult, Path | None]:
    """Run the server in this process and ``cfg.clients`` devices placed by ``engine``
    (default: a process each on this machine).

    ``url``: serve there (e.g. an address the engine's nodes reach) instead of a local URL
    of ``protocol``. Results go into ``out_dir`` as rounds finish (with checkpoints), with
    where each device ran in its manifest. Device output goes to ``log_dir/device-N.log``
    (default: ``out_dir/logs``). Devices are stopped, whatever happens. ``certs``: run
    secured with the files of ``tensorwire certs`` there (the devices are ``device-1`` ...).
    ``resume``: go on from that results directory's last checkpoint (``out_dir`` should be
    the same directory). Returns the result and the results directory (if ``out_dir``)."""
    from tensorwire.fl.engines.local import LocalEngine

    logs = log_dir or (out_dir / "logs" if out_dir else None)
    engine = engine or LocalEngine(cfg, log_dir=logs, certs=certs)
    started = time.time()
    try:
        with _serving_url(protocol, url, cfg.clients) as where:
            result = run_server(
                where,
                cfg,
                on_round=on_round,
                on_ready=engine.start,
                certs=certs,
                out_dir=out_dir,
                resume=resume,
            )
    finally:
        engine.stop()
    if out_dir is None:
        return result, None
    from tensorwire.fl.results import RunDirectory

    extra = {"protocol": protocol, "seconds": time.time() - started, "secured": bool(certs)}
    RunDirectory(out_dir).finish(result, extra | {"placement": engine.placements()})
    return result, out_dir


@contextlib.contextmanager
def _serving_url(protocol: str, url: str | None, devices: int) -> Iterator[str]:
    if url is not None:
        yield url
        return
    with local_hub_url(protocol, devices=devices) as here:
        yield here
