"""Device processes on the nodes of a Ray cluster: ``fl run --engine ray``.

Ray places and supervises; it carries no tensor. Each device process is a Ray actor holding
``devices_per_process`` devices (:mod:`.host`), started on the cluster's alive nodes in
turn (a soft node affinity: if a node dies, Ray starts its actors on another). Its devices
start with the actor and join the server by its URL over the real transport, so an actor
that Ray restarts (up to ``max_restarts`` times) is a device process that restarted: its
devices join again and the server takes them back as new processes. What goes through Ray
is Ray's own: the actor's class by name and its arguments (the URL, device ids, numbers).

The manifest's ``placement`` says, for each device, every node and process it ran in.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any

from tensorwire.errors import MissingDependency
from tensorwire.fl.config import FLConfig, is_factory_ref
from tensorwire.fl.engines.host import device_ids, run_devices
from tensorwire.fl.errors import EngineError

PROBE_TIMEOUT = 5.0  # seconds to reach the cluster's head before Ray's own (minutes) retries
WATCH_PERIOD = 0.5  # seconds between looks at where the device processes run
INFO_TIMEOUT = 5.0  # seconds an actor gets to say where it runs
STOP_GRACE = 30.0  # seconds the device processes get to finish after the run, then killed


def _ray() -> Any:
    """Ray, imported with its usage statistics off (this machine reports nothing)."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    try:
        import ray
    except ImportError:
        raise MissingDependency("the ray engine needs Ray: pip install 'tensorwire[ray]'") from None
    return ray


class DeviceHost:
    """(A Ray actor.) Runs its devices, a thread each, from the moment it starts: when Ray
    restarts the actor, its devices start again and rejoin the server."""

    def __init__(
        self, url: str, ids: list[str], timeout: float, certs: str | None, model: str | None
    ) -> None:
        import ray

        self.where = {
            "node": ray.get_runtime_context().get_node_id(),
            "ip": ray.util.get_node_ip_address(),
            "pid": os.getpid(),
        }
        self.results: dict[str, int | str] | None = None
        args = (url, ids, timeout, certs, model)
        threading.Thread(target=self._run, args=args, daemon=True).start()

    def _run(
        self, url: str, ids: list[str], timeout: float, certs: str | None, model: str | None
    ) -> None:
        self.results = run_devices(url, ids, timeout=timeout, certs=certs, model=model)

    def info(self) -> dict[str, Any]:
        """Where this process runs, and (once its devices are done) what each did."""
        return {**self.where, "done": self.results is not None, "results": self.results}


class RayEngine:
    """``cfg.clients`` devices in Ray actors of ``devices_per_process`` devices each.

    ``address``: the cluster's head (``HOST:PORT``); None: ``$RAY_ADDRESS``, else Ray starts
    a cluster of one node here (without its dashboard). ``nodes``: wait (up to
    ``cfg.join_timeout`` s) until that many nodes are alive. ``max_restarts``: how often Ray
    restarts a device process that died. ``certs`` must be at the same path on every node.
    """

    name = "ray"

    def __init__(
        self,
        cfg: FLConfig,
        *,
        address: str | None = None,
        devices_per_process: int = 1,
        nodes: int = 1,
        max_restarts: int = 3,
        certs: Path | None = None,
    ) -> None:
        if devices_per_process < 1 or nodes < 1 or max_restarts < 0:
            raise ValueError("devices_per_process and nodes must be positive, max_restarts not < 0")
        self.cfg = cfg
        self.address = address or os.environ.get("RAY_ADDRESS") or None
        self.per_process = devices_per_process
        self.nodes = nodes
        self.max_restarts = max_restarts
        self.certs = certs
        self._ray: Any = None
        self._actors: list[tuple[list[str], Any]] = []  # (its devices, the actor)
        self._seen: list[list[dict[str, Any]]] = []  # per actor: each process it ran as
        self._alive: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._watcher: threading.Thread | None = None
        self._lock = threading.Lock()

    # -- the run ----------------------------------------------------------------------------

    def start(self, url: str) -> None:
        ray = self._ray = _ray()
        self._connect(ray)
        self._alive = self._wait_for_nodes(ray)
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        host = ray.remote(DeviceHost)
        timeout = max(self.cfg.round_timeout, self.cfg.join_timeout)
        model = self.cfg.model if is_factory_ref(self.cfg.model) else None
        certs = str(self.certs) if self.certs else None
        for k, first in enumerate(range(1, self.cfg.clients + 1, self.per_process)):
            ids = device_ids(first, min(self.per_process, self.cfg.clients + 1 - first))
            node = self._alive[k % len(self._alive)]["node"]
            actor = host.options(
                max_restarts=self.max_restarts,
                max_task_retries=0,
                num_cpus=0,  # a device process waits on the network most of the time
                scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=True),
            ).remote(url, ids, timeout, certs, model)
            self._actors.append((ids, actor))
            self._seen.append([])
        self._watcher = threading.Thread(
            target=self._watch, name="tensorwire-ray-watch", daemon=True
        )
        self._watcher.start()

    def _connect(self, ray: Any) -> None:
        if self.address is None:
            ray.init(include_dashboard=False, log_to_driver=False, configure_logging=False)
            return
        host, _, port = self.address.rpartition(":")
        try:
            with socket.create_connection((host, int(port)), timeout=PROBE_TIMEOUT):
                pass
        except (OSError, ValueError) as exc:
            raise EngineError(
                f"no Ray cluster answers at {self.address!r} ({exc}): start one there "
                "(ray start --head --node-ip-address ADDRESS --port PORT) or give the "
                "address of its head as HOST:PORT"
            ) from None
        ray.init(address=self.address, log_to_driver=False, configure_logging=False)

    def _wait_for_nodes(self, ray: Any) -> list[dict[str, Any]]:
        deadline = time.monotonic() + self.cfg.join_timeout
        while True:
            alive = [
                {"node": n["NodeID"], "ip": n["NodeManagerAddress"]}
                for n in ray.nodes()
                if n.get("Alive")
            ]
            if len(alive) >= self.nodes:
                return sorted(alive, key=lambda n: (n["ip"], n["node"]))
            if time.monotonic() > deadline:
                raise EngineError(
                    f"the Ray cluster at {self.address or 'here'} has {len(alive)} alive "
                    f"node(s) after {self.cfg.join_timeout:g} s; the run asks for {self.nodes}"
                )
            time.sleep(WATCH_PERIOD)  # polled: Ray announces no node joining to a driver

    def _watch(self) -> None:
        """Note each process every actor runs as (a new one after a restart)."""
        while not self._stop.wait(WATCH_PERIOD):
            self._look()

    def _look(self) -> list[dict[str, Any] | None]:
        """Ask every actor where it runs; None for those that did not answer in time."""
        ray = self._ray
        refs = [actor.info.remote() for _, actor in self._actors]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=INFO_TIMEOUT)
        done = set(ready)
        infos: list[dict[str, Any] | None] = []
        for k, ref in enumerate(refs):
            info = None
            if ref in done:
                try:
                    info = ray.get(ref)
                except Exception:  # restarting, or died for good: seen on a later look
                    info = None
            infos.append(info)
            if info is not None:
                self._note(k, info)
        return infos

    def _note(self, k: int, info: dict[str, Any]) -> None:
        where = {"node": info["node"], "ip": info["ip"], "pid": info["pid"]}
        with self._lock:
            if where not in self._seen[k]:
                self._seen[k].append(where)

    def stop(self) -> None:
        """Wait (up to :data:`STOP_GRACE` s) until every device process says its devices are
        done, then end them all (no restart) and leave the cluster."""
        if self._ray is None:
            return
        ray = self._ray
        self._stop.set()
        if self._watcher is not None:
            self._watcher.join(timeout=INFO_TIMEOUT + 1)
        try:
            deadline = time.monotonic() + STOP_GRACE
            while self._actors and time.monotonic() < deadline:
                infos = self._look()
                if all(i is not None and i["done"] for i in infos):
                    break
                time.sleep(WATCH_PERIOD)  # polled: a device process says nothing when done
        finally:
            for _, actor in self._actors:
                with contextlib.suppress(Exception):  # already gone for good
                    ray.kill(actor, no_restart=True)
            ray.shutdown()

    # -- where devices ran ------------------------------------------------------------------

    def placements(self) -> dict[str, Any]:
        with self._lock:
            devices = {
                cid: list(seen)
                for (ids, _), seen in zip(self._actors, self._seen, strict=True)
                for cid in ids
            }
        return {
            "engine": self.name,
            "address": self.address,
            "devices_per_process": self.per_process,
            "max_restarts": self.max_restarts,
            "nodes": self._alive,
            "devices": devices,
        }
