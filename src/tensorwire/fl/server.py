"""The FL server: rounds of sampled devices with a deadline and a quorum.

Each round samples devices among those available (connected, set up, not still working on an
earlier round), sends them the global model (a delta only to a device that holds the last
one), and waits until every sampled device has answered or left, or the deadline passes.
Each update is validated as it arrives (rejected ones are recorded and the device is told);
if at least the quorum of valid updates came, the strategy aggregates them, otherwise the
model stays as it was. A late update is recorded and dropped, or kept for the next
aggregation with a staleness weight. Results and a checkpoint are written after every round;
the run stops only when fewer devices than the quorum remain, with :class:`QuorumLost`
naming each missing device and why.

The server talks to devices only through a tensorwire URL, so it runs unchanged over every
transport. Everything that changes its state happens on the calling thread: transport
threads and senders only put events on a queue.
"""

from __future__ import annotations

import logging
import queue
import re
import threading
import time
import uuid
from collections.abc import Callable, Collection
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

import tensorwire
from tensorwire.errors import TransportError, TransportTimeout
from tensorwire.fl.checkpoint import Checkpoint, load_checkpoint, save_checkpoint
from tensorwire.fl.compression import downlink_codec, xor_delta
from tensorwire.fl.config import CUSTOM, FLConfig
from tensorwire.fl.data import load_dataset, split_indices
from tensorwire.fl.errors import (
    CheckpointError,
    FLError,
    QuorumLost,
    UpdateRejected,
)
from tensorwire.fl.records import RunResult, transfer_rows
from tensorwire.fl.results import RunDirectory
from tensorwire.fl.strategies import Strategy, Update, make_strategy
from tensorwire.fl.task import ModelFactory, build, check_same_model, model_factory
from tensorwire.fl.train import (
    ArrayData,
    LossFn,
    StateDict,
    TrainingData,
    as_data,
    evaluate_model,
    load_numpy_state,
    state_to_numpy,
)
from tensorwire.fl.validation import check_update
from tensorwire.transports.base import BroadcastResult, MembershipEvent
from tensorwire.transports.security import credentials_from_dir

__all__ = ["FLError", "FLServer", "QuorumLost", "RunResult", "ServerTask", "run_server"]

log = logging.getLogger("tensorwire.fl")

CONTROL_TIMEOUT = 10.0  # seconds for a small control message (setup, verdict, done)
RECORDS_TIMEOUT = 30.0  # seconds the devices get to send their transfer records at the end
SENDERS = 16  # threads sending models and control messages
MAX_REASON = 500  # characters of a device's error message kept
MAX_DEVICE_RECORDS = 10_000  # transfer rows taken from one device at the end
LEFT_GRACE = 1.0  # seconds a device's last messages may trail the news that it left
MAX_EVENT_ROWS = 10_000  # events recorded per run (the rest are counted by kind)
_DEVICE_N = re.compile(r"device-(\d+)")
_RESUMABLE = {"join_timeout", "round_timeout"}  # settings a resumed run may change


@dataclass
class ServerTask:
    """What the server trains and evaluates: the model ``factory``, the ``test`` data (or
    None: no evaluation), the ``loss_fn`` (cross-entropy if None) and, for a built-in data
    set, the size of each device's shard (an update may not claim more samples)."""

    factory: ModelFactory
    test: TrainingData | None = None
    loss_fn: LossFn | None = None
    shard_sizes: list[int] | None = None


def builtin_task(cfg: FLConfig, factory: ModelFactory | None = None) -> ServerTask:
    """The task of a built-in data set (``cfg.dataset``), split in ``cfg.clients`` shards."""
    data = load_dataset(cfg.dataset, root=cfg.data_root, seed=cfg.seed)
    shards = split_indices(data.train_y, cfg.clients, cfg.split, alpha=cfg.alpha, seed=cfg.seed)
    return ServerTask(
        factory=factory or model_factory(cfg.model, data.num_classes),
        test=ArrayData(data.test_x, data.test_y),
        shard_sizes=[len(s) for s in shards],
    )


@dataclass
class _Device:
    """The server's view of one device."""

    id: str
    connected: bool = False
    ready: bool = False  # answered the setup since it (re)joined
    nonce: str | None = None  # its process's, from its last ready: a new one is a restart
    shard: int | None = None
    holds: tuple[str, int] | None = None  # (run token, round) of the global model it has
    busy: int | None = None  # a round it was sampled in and has not answered yet
    asked: int | None = None  # the last round it was sent the model for
    answered: int | None = None  # the last round an update of it was taken for (or late)
    failed: str | None = None  # the error it reported
    why: str = "never joined"  # why it is not connected
    dropped: int | None = None  # a round whose update was not applied (it rolls back)
    told: int | None = None  # the round in which it was last told of a rejection
    junk: int = 0  # messages from it that were not FL messages

    def available(self) -> bool:
        return self.connected and self.ready and self.busy is None and self.failed is None


@dataclass
class _Round:
    number: int
    started: float
    deadline: float
    sampled: list[str]
    waiting: set[str]
    available: int  # devices available when the round sampled
    waited: float = 0.0  # seconds the round waited for a quorum of devices before it began
    accepted: dict[str, Update] = field(default_factory=dict)
    status: dict[str, tuple[str, str]] = field(default_factory=dict)  # device: (status, why)
    info: dict[str, dict[str, Any]] = field(default_factory=dict)  # device: its row's values
    sent: dict[str, str] = field(default_factory=dict)  # device: "full" / "delta"
    downlink: list[Any] = field(default_factory=list)  # transfer records
    uplink: list[Any] = field(default_factory=list)
    late_arrivals: list[str] = field(default_factory=list)


class FLServer:
    """One run of rounds at ``url``; :meth:`run` serves it and returns the result.

    ``task``: the model and test data (default: the built-in ones ``cfg`` names).
    ``strategy``: a :class:`~tensorwire.fl.strategies.Strategy` (default: ``cfg.strategy``).
    ``out_dir``: the results directory, written round by round, with checkpoints.
    ``resume``: a results directory to go on from (its last checkpoint); ``cfg`` may then be
    None (the checkpoint's is used) and results go on being written there.
    ``on_ready(hub_url)`` is called once the hub listens, ``on_round(row)`` after each round.
    ``certs``: a directory from ``tensorwire certs``; only the devices enrolled there may join.
    ``hub_options``: more keywords for :func:`tensorwire.serve` (e.g. ``fanout``).
    """

    def __init__(
        self,
        url: str,
        cfg: FLConfig | None = None,
        *,
        task: ServerTask | None = None,
        strategy: Strategy | None = None,
        out_dir: str | Path | None = None,
        resume: str | Path | None = None,
        on_round: Callable[[dict[str, Any]], None] | None = None,
        on_ready: Callable[[str], None] | None = None,
        certs: str | Path | None = None,
        hub_options: dict[str, Any] | None = None,
    ) -> None:
        checkpoint = load_checkpoint(Path(resume)) if resume is not None else None
        if checkpoint is not None:
            cfg = _resumed_config(checkpoint, cfg)
        if cfg is None:
            raise FLError("run_server needs a config (or resume= a run directory)")
        self.url = url
        self.cfg = cfg
        self.on_round = on_round
        self.on_ready = on_ready
        self.certs = certs
        self.hub_options = dict(hub_options or {})
        self.task = task or builtin_task(cfg)
        torch.manual_seed(cfg.seed)
        self.model = build(self.task.factory)
        self.params = frozenset(name for name, _ in self.model.named_parameters())
        self.global_state = state_to_numpy(self.model)
        self.previous: StateDict | None = None  # the model sent in the last round
        self.strategy = strategy or make_strategy(cfg)
        self.token = uuid.uuid4().hex  # this server process: a model held from another is stale
        self.devices: dict[str, _Device] = {}
        self.stale: dict[str, Update] = {}
        self.round_number = 0
        self.first_round = 1
        self.current: _Round | None = None
        self.finishing = False
        self.final_records: dict[str, list[dict[str, Any]]] = {}
        self.left_at: dict[str, float] = {}
        self.events_not_kept: dict[str, int] = {}
        where = resume if resume is not None else out_dir
        self.run_dir = RunDirectory(Path(where)) if where is not None else None
        self.result = RunResult(cfg)
        if checkpoint is not None:
            self._restore(checkpoint)
        self._queue: queue.Queue[tuple[Any, ...]] = queue.Queue()
        self._closing = threading.Event()
        self._senders = ThreadPoolExecutor(SENDERS, thread_name_prefix="tensorwire-fl-send")
        self.hub: tensorwire.Hub | None = None

    # -- resume -----------------------------------------------------------------------------

    def _restore(self, ckpt: Checkpoint) -> None:
        check_same_model(self.global_state, ckpt.model, "the checkpoint's")
        self.global_state = ckpt.model
        self.strategy.load_state(ckpt.strategy.get("state", {}), ckpt.strategy_arrays)
        server = ckpt.server
        for cid, shard in server.get("shards", {}).items():
            self._device(cid).shard = shard
        for cid, r in server.get("dropped", {}).items():
            self._device(cid).dropped = r
        if "torch_rng" in server:
            torch.set_rng_state(
                torch.tensor(list(bytes.fromhex(server["torch_rng"])), dtype=torch.uint8)
            )
        self.round_number = ckpt.round
        self.first_round = ckpt.round + 1
        if self.run_dir is not None:
            self.result = self.run_dir.load(self.cfg)
            self.result.keep_until(ckpt.round)
        log.info("fl: resuming after round %d of %d", ckpt.round, self.cfg.rounds)

    def _checkpoint(self) -> None:
        if self.run_dir is None:
            return
        meta, arrays = self.strategy.state()
        save_checkpoint(
            self.run_dir.path,
            Checkpoint(
                round=self.round_number,
                config=self.cfg.as_dict(),
                model=self.global_state,
                strategy={"name": self.strategy.name, "state": meta},
                strategy_arrays=arrays,
                server={
                    "shards": {d.id: d.shard for d in self.devices.values() if d.shard is not None},
                    "dropped": {
                        d.id: d.dropped for d in self.devices.values() if d.dropped is not None
                    },
                    "torch_rng": bytes(torch.get_rng_state().tolist()).hex(),
                },
            ),
        )

    # -- the run ----------------------------------------------------------------------------

    def run(self) -> RunResult:
        """Serve every round (from the checkpoint's next when resuming); return the result.

        Raises :class:`QuorumLost` when fewer devices than the quorum remain (the rounds
        done so far are written), :class:`FLError` for a model that does not fit."""
        started = time.time()
        security = credentials_from_dir(self.certs, "hub") if self.certs else {}
        if self.run_dir is not None:
            self.run_dir.start(
                self.cfg,
                {"url": self.url, "secured": self.certs is not None},
                resumed_from=self.first_round - 1,
            )
        outcome = "done"
        try:
            with tensorwire.serve(
                self.url,
                codec=downlink_codec(self.cfg),
                on_event=self._on_hub_event,
                **security,
                **self.hub_options,
            ) as hub:
                self.hub = hub
                receiver = threading.Thread(
                    target=self._receive, name="tensorwire-fl-receive", daemon=True
                )
                receiver.start()
                try:
                    if self.on_ready:
                        self.on_ready(hub.url)
                    self._serve_rounds()
                    self._finish()
                except BaseException as exc:
                    outcome = f"{type(exc).__name__}: {exc}"
                    self._say_done(error=outcome)
                    raise
                finally:
                    self._closing.set()
                    self._senders.shutdown(wait=False, cancel_futures=True)
            receiver.join(timeout=5)
        finally:
            self._closing.set()
            self._senders.shutdown(wait=True)  # the hub is closed: sends end at once
            if self.run_dir is not None:
                extra = {"seconds": time.time() - started, "outcome": outcome}
                self.run_dir.finish(self.result, extra | {"events_not_kept": self.events_not_kept})
        return self.result

    def _serve_rounds(self) -> None:
        if self.first_round > self.cfg.rounds:
            log.info("fl: all %d rounds were done before", self.cfg.rounds)
            return
        self._wait_for_devices(self.cfg.clients, self.cfg.join_timeout, "to start")
        for r in range(self.first_round, self.cfg.rounds + 1):
            started = time.monotonic()
            if self._available_count() < self.cfg.min_updates:
                self._wait_for_devices(self.cfg.min_updates, self.cfg.join_timeout, f"round {r}")
            self._round(r, waited=time.monotonic() - started)

    def _receive(self) -> None:
        assert self.hub is not None
        while not self._closing.is_set():
            try:
                cid, msg = self.hub.recv(timeout=0.5)
            except TransportTimeout:
                continue
            self._queue.put(("msg", cid, msg))

    def _on_hub_event(self, event: MembershipEvent) -> None:
        self._queue.put(("event", event))

    def _pump(self, until: float | None) -> bool:
        """Handle one queued item, waiting until ``until`` (monotonic) at most; False if none."""
        left = None if until is None else max(until - time.monotonic(), 0.0)
        try:
            item = self._queue.get(timeout=left)
        except queue.Empty:
            return False
        kind = item[0]
        if kind == "msg":
            self._on_message(item[1], item[2])
        elif kind == "event":
            self._on_event(item[1])
        elif kind == "sent":
            self._on_sent(*item[1:])
        return True

    def _available(self) -> list[str]:
        return sorted(d.id for d in self.devices.values() if d.available())

    def _available_count(self) -> int:
        return sum(d.available() for d in self.devices.values())

    def _wait_for_devices(self, n: int, timeout: float, purpose: str) -> None:
        """Wait until ``n`` devices are available, or ``timeout`` s; then at least the quorum
        must be, else :class:`QuorumLost`."""
        deadline = time.monotonic() + timeout
        while self._available_count() < n and time.monotonic() < deadline:
            self._pump(deadline)
        have = self._available_count()
        if have >= self.cfg.min_updates:
            if have < n:
                log.warning(
                    "fl: %d of %d devices available %s after %.0f s, going on (quorum %d); "
                    "missing: %s",
                    have,
                    n,
                    purpose,
                    timeout,
                    self.cfg.min_updates,
                    self._missing(),
                )
            return
        missing = self._missing()
        listed = "; ".join(f"{cid}: {why}" for cid, why in missing.items())
        raise QuorumLost(
            f"{purpose}: {have} device(s) available within {timeout:g} s, the quorum "
            f"(min_updates) is {self.cfg.min_updates}; missing: {listed or 'none known'}",
            missing,
        )

    def _missing(self) -> dict[str, str]:
        """Every device known or expected that is not available, and why."""
        out: dict[str, str] = {}
        if self.task.shard_sizes is not None:
            for i in range(1, self.cfg.clients + 1):
                if f"device-{i}" not in self.devices:
                    out[f"device-{i}"] = "never joined"
        for d in sorted(self.devices.values(), key=lambda d: d.id):
            if d.available():
                continue
            if not d.connected:
                out[d.id] = d.why
            elif d.failed is not None:
                out[d.id] = f"failed: {d.failed}"
            elif d.busy is not None:
                out[d.id] = f"no update since round {d.busy} (its deadline passed: hung or slow)"
            else:
                out[d.id] = "joined, not set up yet"
        return dict(sorted(out.items()))

    # -- one round --------------------------------------------------------------------------

    def _sample(self, r: int) -> list[str]:
        available = self._available()
        cfg = self.cfg
        k = cfg.clients_per_round or int(np.ceil(cfg.fraction * len(available)))
        k = min(max(k, cfg.min_updates), len(available))
        if k >= len(available):
            return available
        rng = np.random.default_rng([cfg.seed & 0xFFFFFFFF, r, 0x5A])
        return sorted(rng.choice(available, size=k, replace=False).tolist())

    def _full_participation(self) -> bool:
        return self.cfg.clients_per_round is None and self.cfg.fraction >= 1.0

    def _round(self, r: int, waited: float = 0.0) -> None:
        """Round ``r``, after ``waited`` seconds waiting for a quorum of devices."""
        self.round_number = r
        now = time.monotonic()
        available = self._available_count()
        sampled = self._sample(r)
        rd = _Round(r, now, now + self.cfg.round_timeout, list(sampled), set(sampled), available)
        rd.waited = waited
        self.current = rd
        self._send_model(rd, sampled)
        while rd.waiting and time.monotonic() < rd.deadline:
            self._pump(rd.deadline)
        ended = "all answered" if not rd.waiting else "deadline"
        for cid in rd.waiting:
            rd.status[cid] = (
                "missing",
                f"no update by the round's deadline ({self.cfg.round_timeout:g} s)",
            )
        self.current = None
        self._aggregate(rd, ended)

    def _model_meta(self, r: int, cids: list[str], delta: bool) -> dict[str, Any]:
        meta: dict[str, Any] = {
            "fl": "round",
            "round": r,
            "run": self.token,
            "config": self.cfg.as_dict(),
            "shards": {c: self.devices[c].shard for c in cids},
            "dropped": {c: self.devices[c].dropped for c in cids if self.devices[c].dropped},
            "delta": delta,
        }
        if delta:
            meta["base"] = r - 1
        return meta

    def _send_model(self, rd: _Round, cids: list[str]) -> None:
        """Send round ``rd``'s global model to ``cids``: a delta to those holding the last
        round's model (when the downlink is ``delta``), the whole model to the others."""
        r = rd.number
        use_delta = self.cfg.downlink == "delta" and self.previous is not None
        by_delta = [c for c in cids if use_delta and self.devices[c].holds == (self.token, r - 1)]
        full = [c for c in cids if c not in by_delta]
        timeout = max(rd.deadline - time.monotonic(), 0.1)
        groups = []
        if by_delta:
            assert self.previous is not None
            groups.append((by_delta, xor_delta(self.global_state, self.previous), True))
        if full:
            groups.append((full, self.global_state, False))
        for group, payload, delta in groups:
            for c in group:
                rd.sent[c] = "delta" if delta else "full"
                dev = self.devices[c]
                dev.holds, dev.busy, dev.asked = (self.token, r), r, r
            meta = self._model_meta(r, group, delta)
            self._senders.submit(self._send, r, group, {"weights": payload}, meta, timeout, True)

    def _send(
        self,
        r: int,
        cids: list[str],
        tensors: dict[str, Any] | None,
        meta: dict[str, Any],
        timeout: float,
        model: bool = False,
    ) -> None:
        """(A sender thread.) Send to ``cids``; the result goes on the queue."""
        assert self.hub is not None
        try:
            result = self.hub.broadcast(tensors, meta=meta, clients=cids, timeout=timeout)
        except TransportError as exc:  # the hub closed
            result = BroadcastResult()
            result.failed.update(dict.fromkeys(cids, exc))
        except Exception as exc:  # never lose a sender's failure in a thread
            log.exception("fl: sending %s to %s failed", meta.get("fl"), cids)
            result = BroadcastResult()
            result.failed.update(dict.fromkeys(cids, exc))
        if model:
            self._queue.put(("sent", r, result))

    def _tell(self, cid: str, meta: dict[str, Any]) -> None:
        """Send a small control message to one device, without waiting for it."""
        if not self._closing.is_set():
            self._senders.submit(self._send, self.round_number, [cid], None, meta, CONTROL_TIMEOUT)

    def _on_sent(self, r: int, result: BroadcastResult) -> None:
        self.result.transfers += _payload_rows(r, "model", result.values())
        rd = self.current
        if rd is not None and rd.number == r:
            rd.downlink += list(result.values())
        for cid, exc in result.failed.items():
            dev = self.devices.get(cid)
            if dev is not None and dev.holds == (self.token, r):
                dev.holds = None
            if rd is not None and rd.number == r:
                rd.info.setdefault(cid, {})["model_error"] = f"{type(exc).__name__}: {exc}"[
                    :MAX_REASON
                ]

    # -- devices ----------------------------------------------------------------------------

    def _device(self, cid: str) -> _Device:
        dev = self.devices.get(cid)
        if dev is None:
            dev = self.devices[cid] = _Device(cid)
        return dev

    def _event_row(
        self, kind: str, device: str | None, reason: str, at: float | None = None
    ) -> None:
        """Record an event; past :data:`MAX_EVENT_ROWS` (a stranger knocking again and again)
        they are only counted."""
        if len(self.result.events) >= MAX_EVENT_ROWS:
            self.events_not_kept[kind] = self.events_not_kept.get(kind, 0) + 1
            return
        self.result.events.append(
            {
                "round": self.round_number,
                "time": at or time.time(),
                "kind": kind,
                "device": device,
                "reason": reason[:MAX_REASON],
            }
        )

    def _on_event(self, event: MembershipEvent) -> None:
        self._event_row(event.kind, event.client_id, event.reason, event.at)
        cid = event.client_id
        if cid is None:
            return
        dev = self._device(cid)
        if event.kind in ("left", "replaced"):  # a new connection may be a new process
            self.left_at[cid] = time.monotonic()
            dev.connected, dev.ready = False, False
            dev.holds, dev.busy = None, None  # back, it owes nothing: it may not have the model
            dev.why = f"left in round {self.round_number}: {event.reason}"
            if dev.nonce is None and event.kind == "left":  # never set up: nothing to keep
                del self.devices[cid]
                self.left_at.pop(cid, None)
            rd = self.current
            if rd is not None and cid in rd.waiting:
                rd.waiting.discard(cid)
                rd.status[cid] = ("left", event.reason)
        if event.kind in ("joined", "replaced"):
            dev.connected = True
            self._setup(dev)

    def _assign_shard(self, dev: _Device) -> bool:
        """Give a device of a built-in data set its shard: ``device-N`` shard N (1-based)
        when free, others the first free one. False when none is left."""
        sizes = self.task.shard_sizes
        if sizes is None or dev.shard is not None:
            return True
        taken = {d.shard for d in self.devices.values() if d.shard is not None}
        m = _DEVICE_N.fullmatch(dev.id)
        home = int(m.group(1)) - 1 if m else -1
        if 0 <= home < len(sizes) and home not in taken:
            dev.shard = home
            return True
        free = [i for i in range(len(sizes)) if i not in taken]
        if not free:
            return False
        dev.shard = free[0]
        return True

    def _setup(self, dev: _Device) -> None:
        if not self._assign_shard(dev):
            dev.failed = (
                f"no data shard left: the run splits {self.cfg.dataset} for {self.cfg.clients} "
                "devices"
            )
            self._tell(dev.id, {"fl": "done", "error": dev.failed})
            return
        self._tell(
            dev.id,
            {"fl": "setup", "config": self.cfg.as_dict(), "shard": dev.shard, "run": self.token},
        )

    def _on_message(self, cid: str, msg: tensorwire.Message) -> None:
        dev = self._device(cid)
        kind = msg.meta.get("fl")
        if kind == "update":
            self._on_update(dev, msg)
        elif kind == "ready":
            self._on_ready(dev, msg.meta)
        elif kind == "error":
            self._on_failure(dev, msg.meta)
        elif kind == "resync":
            self._on_resync(dev, msg.meta)
        elif kind == "records" and self.finishing:
            self._on_records(dev, msg.meta)
        else:
            dev.junk += 1
            self._event_row("junk", cid, f"a message that is not an FL message ({kind!r})"[:100])
            if dev.junk in (1, 10, 100) or dev.junk % 1000 == 0:
                log.warning("fl: %s sent %d message(s) that are not FL messages", cid, dev.junk)

    def _on_ready(self, dev: _Device, meta: dict[str, Any]) -> None:
        nonce = meta.get("nonce")
        if not isinstance(nonce, str) or len(nonce) > 64:
            self._event_row("junk", dev.id, "a ready without a valid nonce")
            return
        rd = self.current
        if dev.nonce is not None and nonce != dev.nonce:  # a new process: nothing carries over
            dev.busy, dev.holds, dev.dropped = None, None, None
            if rd is not None and dev.id in rd.waiting:
                rd.waiting.discard(dev.id)
                rd.status[dev.id] = ("left", "restarted during the round")
        dev.nonce, dev.ready, dev.failed = nonce, True, None
        self._join_round_under_way(dev)

    def _join_round_under_way(self, dev: _Device) -> None:
        """Under full participation, a device that becomes available during a round (it
        joined, came back, or finished a late update) takes part in it, if it has not."""
        rd = self.current
        if (
            rd is not None
            and self._full_participation()
            and dev.available()
            and rd.status.get(dev.id, ("left",))[0] == "left"
            and dev.id not in rd.accepted
            and time.monotonic() < rd.deadline
        ):
            if dev.id not in rd.sampled:
                rd.sampled.append(dev.id)
            rd.waiting.add(dev.id)
            rd.status.pop(dev.id, None)
            self._send_model(rd, [dev.id])

    def _on_failure(self, dev: _Device, meta: dict[str, Any]) -> None:
        error = str(meta.get("error", "no reason given"))[:MAX_REASON]
        dev.failed, dev.ready = error, False
        self._event_row("failed", dev.id, error)
        log.warning("fl: device %s failed: %s", dev.id, error)
        rd = self.current
        if rd is not None and (dev.id in rd.waiting or rd.status.get(dev.id, ("",))[0] == "left"):
            rd.waiting.discard(dev.id)  # its leaving may have been seen first: this says why
            rd.status[dev.id] = ("failed", error)

    def _on_resync(self, dev: _Device, meta: dict[str, Any]) -> None:
        """The device cannot apply a delta (it does not hold the base): send it the model."""
        rd = self.current
        dev.holds = None
        self._event_row("resync", dev.id, f"could not apply a delta in round {meta.get('round')}")
        if (
            rd is not None
            and meta.get("round") == rd.number
            and dev.id in rd.waiting
            and rd.sent.get(dev.id) == "delta"  # once: it asks again only to make us resend
        ):
            self._send_model(rd, [dev.id])

    def _reject(self, dev: _Device, r: Any, reason: str) -> None:
        """Tell the device why its update was rejected: once per round (a device sending
        update after update gets no answer to each)."""
        if dev.told == self.round_number:
            return
        dev.told = self.round_number
        log.warning("fl: rejected an update of %s for round %s: %s", dev.id, r, reason)
        self._tell(dev.id, {"fl": "verdict", "round": r, "status": "rejected", "reason": reason})

    def _max_samples(self, dev: _Device) -> int:
        sizes = self.task.shard_sizes
        if sizes is not None and dev.shard is not None:
            return sizes[dev.shard]
        return self.cfg.max_samples

    def _on_update(self, dev: _Device, msg: tensorwire.Message) -> None:
        meta = msg.meta
        r = meta.get("round")
        if isinstance(r, bool) or not isinstance(r, int):
            self._reject(dev, None, "an update must name its round")
            return
        rd = self.current
        if r == dev.answered:  # sent again (a reconnecting device does): the first one counts
            self._reject(dev, r, "a second update for the round")
        elif rd is not None and r == rd.number and dev.asked == r:
            came_back = rd.status.get(dev.id, ("",))[0] == "left"
            if dev.id in rd.waiting or came_back:
                self._take_update(rd, dev, msg)
            else:
                self._reject(dev, r, "a second update for the round")
        elif dev.asked == r and r <= self.round_number:
            self._late_update(dev, msg, r)
        else:  # e.g. a broker's broadcast reached a device that joined as it went out
            dev.dropped = r  # it rolls its error feedback back when next sampled
            self._reject(dev, r, f"this device was not asked for an update in round {r}")

    def _check(self, dev: _Device, msg: tensorwire.Message) -> tuple[Update, float]:
        checked = check_update(
            msg.tensors,
            msg.meta,
            self.global_state,
            max_samples=self._max_samples(dev),
            clip_norm=self.cfg.clip_norm,
            loss=getattr(msg, "loss", None),
        )
        return Update(
            dev.id,
            int(msg.meta["round"]),
            checked.delta,
            checked.samples,
            float(checked.samples),
            checked.loss,
        ), checked.norm

    def _take_update(self, rd: _Round, dev: _Device, msg: tensorwire.Message) -> None:
        rd.waiting.discard(dev.id)
        rd.status.pop(dev.id, None)
        dev.busy, dev.answered = None, rd.number
        meta = msg.meta
        info = rd.info.setdefault(dev.id, {})
        info.update(
            arrived_s=time.monotonic() - rd.started,
            train_s=_number(meta.get("train_s")),
            train_loss=_number(meta.get("train_loss")),
            downlink_wall_s=_number(meta.get("downlink_wall_s")),
        )
        if msg.record is not None:
            rd.uplink.append(msg.record)
            self.result.transfers += _payload_rows(rd.number, "update", [msg.record])
        try:
            update, norm = self._check(dev, msg)
        except UpdateRejected as exc:
            rd.status[dev.id] = ("rejected", exc.reason)
            dev.dropped = rd.number
            self._reject(dev, rd.number, exc.reason)
            return
        info.update(
            samples=update.samples, norm=norm, lost_max=max(update.loss.values(), default=0.0)
        )
        rd.accepted[dev.id] = update

    def _late_update(self, dev: _Device, msg: tensorwire.Message, r: int) -> None:
        dev.answered = r
        if dev.busy == r:
            dev.busy = None
        age = self.round_number - r
        row = {
            "round": r,
            "device": dev.id,
            "status": "late",
            "arrived_in_round": self.round_number,
        }
        if msg.record is not None:
            self.result.transfers += _payload_rows(r, "update", [msg.record])
        if self.current is not None:
            self.current.late_arrivals.append(dev.id)
        reason = "arrived after the round's deadline" + (f", {age} round(s) later" if age else "")
        if self.cfg.late == "stale":
            try:
                update, _ = self._check(dev, msg)
            except UpdateRejected as exc:
                row |= {"status": "rejected", "reason": exc.reason}
                dev.dropped = r
                self._reject(dev, r, exc.reason)
            else:
                self.stale[dev.id] = update
                row["reason"] = reason + ": kept for the next aggregation, weighted by its age"
                dev.dropped = None
        else:
            row["reason"] = reason + ": dropped"
            dev.dropped = r
            self._tell(
                dev.id, {"fl": "verdict", "round": r, "status": "late", "reason": row["reason"]}
            )
        self.result.updates.append(row)
        log.info("fl: %s's update for round %d %s", dev.id, r, row.get("reason"))
        self._join_round_under_way(dev)

    # -- the end of a round -----------------------------------------------------------------

    def _aggregate(self, rd: _Round, ended: str) -> None:
        cfg = self.cfg
        accepted = [rd.accepted[c] for c in sorted(rd.accepted)]
        quorum = len(accepted) >= cfg.min_updates
        stale = [self.stale.pop(c) for c in sorted(self.stale)] if quorum else []
        for u in stale:
            u.weight = u.samples * (1 + rd.number - u.round) ** -cfg.staleness
        sent = self.global_state
        if quorum:
            self.global_state = self.strategy.aggregate(sent, accepted + stale, self.params)
        self.previous = sent
        for u in accepted:
            why = (
                ""
                if quorum
                else f"the round got {len(accepted)} of the {cfg.min_updates} updates it needs"
            )
            rd.status[u.client] = ("applied" if quorum else "dropped", why)
            self.devices[u.client].dropped = None if quorum else rd.number
            self._tell(
                u.client,
                {
                    "fl": "verdict",
                    "round": rd.number,
                    "status": rd.status[u.client][0],
                    "reason": why,
                },
            )
        for u in stale:
            self._tell(
                u.client,
                {
                    "fl": "verdict",
                    "round": u.round,
                    "status": "applied",
                    "reason": f"late, in round {rd.number}",
                },
            )
        load_numpy_state(self.model, self.global_state)
        if self.task.test is not None:
            test_loss, accuracy = evaluate_model(self.model, self.task.test, self.task.loss_fn)
        else:
            test_loss, accuracy = float("nan"), float("nan")
        row = self._round_row(rd, ended, quorum, accepted, stale, test_loss, accuracy)
        self.result.rounds.append(row)
        for cid in rd.sampled:
            status, why = rd.status.get(cid, ("missing", "no update"))
            self.result.updates.append(
                {
                    "round": rd.number,
                    "device": cid,
                    "status": status,
                    "reason": why,
                    "model_sent": rd.sent.get(cid),
                    **rd.info.get(cid, {}),
                }
            )
        if self.run_dir is not None:
            self.run_dir.save(self.result)
        self._checkpoint()
        log.info(
            "fl: round %d %s: %d update(s) of %d sampled, accuracy %.4f",
            rd.number,
            row["status"],
            len(accepted),
            len(rd.sampled),
            accuracy,
        )
        if self.on_round:
            self.on_round(row)

    def _round_row(
        self,
        rd: _Round,
        ended: str,
        quorum: bool,
        accepted: list[Update],
        stale: list[Update],
        test_loss: float,
        accuracy: float,
    ) -> dict[str, Any]:
        infos = [rd.info[u.client] for u in accepted]
        train_s = [i["train_s"] for i in infos]
        by = {s: sorted(c for c, (st, _) in rd.status.items() if st == s) for s in _STATUSES}
        return {
            "round": rd.number,
            "status": "aggregated" if quorum else "no-quorum",
            "accuracy": accuracy,
            "test_loss": test_loss,
            "train_loss": float(np.mean([i["train_loss"] for i in infos]))
            if infos
            else float("nan"),
            "train_s_max": max(train_s) if train_s else float("nan"),
            "train_s_mean": float(np.mean(train_s)) if train_s else float("nan"),
            "uplink_bytes": sum(rec.bytes_encoded for rec in rd.uplink),
            "uplink_bytes_raw": sum(rec.bytes_raw for rec in rd.uplink),
            "downlink_bytes": sum(rec.bytes_encoded for rec in rd.downlink),
            # device-reported downlink wall (first encoded byte to last tensor decoded) + uplink
            "comm_s": sum(i.get("downlink_wall_s", 0.0) for i in infos)
            + sum(rec.e2e_s or rec.wall_s for rec in rd.uplink),
            "round_s": time.monotonic() - rd.started,
            "waited_s": rd.waited,
            "ended": ended,
            "deadline_s": self.cfg.round_timeout,
            "quorum": self.cfg.min_updates,
            "updates": len(accepted),
            "stale_applied": [u.client for u in stale],
            "available": rd.available,
            "sampled": list(rd.sampled),
            "applied": by["applied"] if quorum else [],
            "dropped": by["dropped"],
            "rejected": by["rejected"],
            "missing": by["missing"],
            "left": by["left"],
            "failed": by["failed"],
            "late_arrivals": rd.late_arrivals,
        }

    # -- the end of the run -----------------------------------------------------------------

    def _say_done(self, error: str | None = None) -> None:
        if self.hub is None or self._closing.is_set():
            return
        connected = [d.id for d in self.devices.values() if d.connected]
        meta = {"fl": "done"} | ({"error": error} if error else {})
        try:
            self.hub.broadcast(None, meta=meta, clients=connected, timeout=CONTROL_TIMEOUT)
        except TransportError as exc:
            log.warning("fl: could not tell the devices the run ended: %s", exc)

    def _finish(self) -> None:
        """Tell every device the run is over; take the transfer records of those that answer."""
        self.finishing = True
        self._say_done()
        waiting = {d.id for d in self.devices.values() if d.available()}
        deadline = time.monotonic() + RECORDS_TIMEOUT
        while waiting - self.final_records.keys() and time.monotonic() < deadline:
            self._pump(min(deadline, time.monotonic() + LEFT_GRACE))
            # a device's leaving can be seen before its last message: give that a moment
            now = time.monotonic()
            waiting = {
                c
                for c in waiting
                if self.devices[c].connected or now - self.left_at[c] < LEFT_GRACE
            }
        late = sorted(waiting - self.final_records.keys())
        if late:
            log.warning("fl: no final records from %s", late)
        for rows in self.final_records.values():
            self.result.transfers += rows

    def _on_records(self, dev: _Device, meta: dict[str, Any]) -> None:
        rows = meta.get("records")
        if not isinstance(rows, list):
            return
        keep = [
            row
            for row in rows[:MAX_DEVICE_RECORDS]
            if isinstance(row, dict)
            and isinstance(row.get("round"), int)
            and all(isinstance(v, str | int | float | bool | None) for v in row.values())
        ]
        for row in keep:
            row["device"] = dev.id  # a device speaks for itself only
            row["side"] = "device"
        self.final_records[dev.id] = keep


_STATUSES = ("applied", "dropped", "rejected", "missing", "left", "failed")


def _number(value: Any) -> float:
    return (
        float(value)
        if isinstance(value, int | float) and not isinstance(value, bool)
        else float("nan")
    )


def _payload_rows(r: int, payload: str, records: Collection[Any]) -> list[dict[str, Any]]:
    """The server's transfer rows of round ``r``'s models or updates."""
    rows = transfer_rows(r, "server", records)
    for row in rows:
        row["payload"] = payload
    return rows


def _resumed_config(ckpt: Checkpoint, cfg: FLConfig | None) -> FLConfig:
    saved = FLConfig.from_dict(ckpt.config)
    if cfg is None:
        return saved
    differ = sorted(
        k for k, v in cfg.as_dict().items() if k not in _RESUMABLE and saved.as_dict().get(k) != v
    )
    if differ:
        raise CheckpointError(
            f"the run to resume was made with other settings ({', '.join(differ)}): resume it "
            "with its own (pass no config)"
        )
    return cfg


def run_server(
    url: str,
    cfg: FLConfig | None = None,
    *,
    on_round: Callable[[dict[str, Any]], None] | None = None,
    on_ready: Callable[[str], None] | None = None,
    certs: str | Path | None = None,
    out_dir: str | Path | None = None,
    resume: str | Path | None = None,
    model: ModelFactory | None = None,
    test_data: Any = None,
    loss_fn: LossFn | None = None,
    strategy: Strategy | None = None,
    hub_options: dict[str, Any] | None = None,
) -> RunResult:
    """Serve ``cfg.rounds`` rounds at ``url`` (see :class:`FLServer`); return the result.

    ``model`` (a factory) and ``test_data`` replace the built-in ones; without ``model`` the
    model is ``cfg.model`` and the data ``cfg.dataset``, split into ``cfg.clients`` shards.
    """
    task = None
    if model is not None:
        test = as_data(test_data, "test_data") if test_data is not None else None
        if cfg is not None and cfg.dataset != CUSTOM:
            base = builtin_task(cfg, model)
            task = ServerTask(model, test or base.test, loss_fn, base.shard_sizes)
        else:
            task = ServerTask(model, test, loss_fn)
    elif test_data is not None:
        raise FLError("test_data needs its model: run_server(..., model=make_model)")
    return FLServer(
        url,
        cfg,
        task=task,
        strategy=strategy,
        out_dir=out_dir,
        resume=resume,
        on_round=on_round,
        on_ready=on_ready,
        certs=certs,
        hub_options=hub_options,
    ).run()
