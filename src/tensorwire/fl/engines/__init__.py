"""Engines: what places a run's device processes and keeps them running.

The server never learns how its devices were started: each joins it by URL over the real
transport. An engine only starts device processes, says where each device ran, and stops
them when the run is over.

- :mod:`.host`: many devices in one process, a thread each (as a simulation needs);
- :mod:`.local`: device processes on this machine (``fl run``'s default);
- :mod:`.ray`: device processes on the nodes of a Ray cluster, restarted by Ray if they die.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from tensorwire.fl.config import FLConfig
from tensorwire.fl.engines.host import device_ids, run_devices

ENGINES = ("local", "ray")


class DeviceEngine(Protocol):
    """Starts the devices of a run once its server listens; stops them when it is over."""

    name: str

    def start(self, url: str) -> None:
        """Start every device, joining the server at ``url``."""

    def stop(self) -> None:
        """Stop what still runs (the devices were told the run is done: give them a moment)."""

    def placements(self) -> dict[str, Any]:
        """Where each device ran, for the run's manifest (JSON)."""


def make_engine(
    name: str,
    cfg: FLConfig,
    *,
    devices_per_process: int = 1,
    log_dir: Path | None = None,
    certs: Path | None = None,
    ray_address: str | None = None,
    ray_nodes: int = 1,
    max_restarts: int = 3,
) -> DeviceEngine:
    """The engine ``name`` (one of :data:`ENGINES`) for the devices of ``cfg``; the ``ray_``
    settings and ``max_restarts`` are the Ray engine's (see
    :class:`~tensorwire.fl.engines.ray.RayEngine`)."""
    if name == "local":
        from tensorwire.fl.engines.local import LocalEngine

        return LocalEngine(
            cfg, devices_per_process=devices_per_process, log_dir=log_dir, certs=certs
        )
    if name == "ray":
        from tensorwire.fl.engines.ray import RayEngine

        return RayEngine(
            cfg,
            address=ray_address,
            devices_per_process=devices_per_process,
            nodes=ray_nodes,
            max_restarts=max_restarts,
            certs=certs,
        )
    raise ValueError(f"engine {name!r}: choose one of {', '.join(ENGINES)}")


__all__ = ["ENGINES", "DeviceEngine", "device_ids", "make_engine", "run_devices"]
