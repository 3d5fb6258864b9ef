"""The round loop: devices in, a round planned by the strategy, updates taken until every
sampled device answered or left or the deadline passed, the round aggregated and recorded.

Everything that changes the run's state happens on the calling thread: the hub's threads,
the receiver and the senders only put events on a queue, which :meth:`FLServer._pump` takes
one at a time.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import tensorwire
from tensorwire.errors import TransportTimeout
from tensorwire.fl.checkpoint import Checkpoint, load_checkpoint
from tensorwire.fl.compression import downlink_codec
from tensorwire.fl.config import FLConfig
from tensorwire.fl.errors import FLError, QuorumLost
from tensorwire.fl.records import RunResult
from tensorwire.fl.server.checkpoints import restore, resumed_config, save_round
from tensorwire.fl.server.device_manager import Device, DeviceManager
from tensorwire.fl.server.downlink import Downlink
from tensorwire.fl.server.outbox import Outbox
from tensorwire.fl.server.recorder import MAX_REASON, Recorder, device_records
from tensorwire.fl.server.round import Round
from tensorwire.fl.server.task import ServerTask, builtin_task
from tensorwire.fl.server.updates import UpdateIntake
from tensorwire.fl.strategies import Strategy, make_strategy
from tensorwire.fl.task import build, check_same_model
from tensorwire.fl.train import evaluate_model, load_numpy_state, state_to_numpy
from tensorwire.transports import Credentials, MembershipEvent

log = logging.getLogger("tensorwire.fl")

RECORDS_TIMEOUT = 30.0  # seconds the devices get to send their transfer records at the end
LEFT_GRACE = 1.0  # seconds a device's last messages may trail the news that it left


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
            cfg = resumed_config(checkpoint, cfg)
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
        self.strategy = strategy or make_strategy(cfg)
        self.devices = DeviceManager(self.task.shard_sizes, cfg.clients)
        self.round_number = 0
        self.first_round = 1
        self.current: Round | None = None
        self.finishing = False
        self.final_records: dict[str, list[dict[str, Any]]] = {}
        where = resume if resume is not None else out_dir
        self.recorder = Recorder(cfg, Path(where) if where is not None else None)
        self._queue: queue.Queue[tuple[Any, ...]] = queue.Queue()
        self._closing = threading.Event()
        self.outbox = Outbox(self._queue, self._closing)
        self.updates = UpdateIntake(cfg, self.task.shard_sizes, self.recorder, self.outbox)
        self.downlink = Downlink(cfg, self.devices, self.outbox, self.recorder)
        if checkpoint is not None:
            self._restore(checkpoint)

    @property
    def result(self) -> RunResult:
        """The rows so far."""
        return self.recorder.result

    def _restore(self, ckpt: Checkpoint) -> None:
        check_same_model(self.global_state, ckpt.model, "the checkpoint's")
        self.global_state = ckpt.model
        restore(ckpt, self.strategy, self.devices)
        self.round_number = ckpt.round
        self.first_round = ckpt.round + 1
        self.recorder.resume(ckpt.round)
        log.info("fl: resuming after round %d of %d", ckpt.round, self.cfg.rounds)

    # -- the run ----------------------------------------------------------------------------

    def run(self) -> RunResult:
        """Serve every round (from the checkpoint's next when resuming); return the result.

        Raises :class:`QuorumLost` when fewer devices than the quorum remain (the rounds
        done so far are written), :class:`FLError` for a model that does not fit."""
        started = time.time()
        security: dict[str, Any] = (
            {"credentials": Credentials.from_dir(self.certs, "hub")} if self.certs else {}
        )
        self.recorder.start(self.url, self.certs is not None, resumed_from=self.first_round - 1)
        outcome = "done"
        try:
            with tensorwire.serve(
                self.url,
                codec=downlink_codec(self.cfg),
                on_event=self._on_hub_event,
                **security,
                **self.hub_options,
            ) as hub:
                self.outbox.hub = hub
                receiver = threading.Thread(
                    target=self._receive, args=(hub,), name="tensorwire-fl-receive", daemon=True
                )
                receiver.start()
                try:
                    if self.on_ready:
                        self.on_ready(hub.url)
                    self._serve_rounds()
                    self._finish()
                except KeyboardInterrupt:
                    outcome = f"interrupted after round {self._rounds_done()} of {self.cfg.rounds}"
                    self.outbox.say_done(self.devices.connected(), error=outcome)
                    raise
                except BaseException as exc:
                    outcome = f"{type(exc).__name__}: {exc}"
                    self.outbox.say_done(self.devices.connected(), error=outcome)
                    raise
                finally:
                    self.outbox.stop()
            receiver.join(timeout=5)
        finally:
            self.outbox.join()
            self.recorder.finish(time.time() - started, outcome)
        return self.result

    def _rounds_done(self) -> int:
        """The last round whose row is written (0 before the first)."""
        return max((int(row["round"]) for row in self.result.rounds), default=0)

    def _serve_rounds(self) -> None:
        if self.first_round > self.cfg.rounds:
            log.info("fl: all %d rounds were done before", self.cfg.rounds)
            return
        self._wait_for_devices(self.cfg.clients, self.cfg.join_timeout, "to start")
        for r in range(self.first_round, self.cfg.rounds + 1):
            started = time.monotonic()
            if self.devices.available_count() < self.cfg.min_updates:
                self._wait_for_devices(self.cfg.min_updates, self.cfg.join_timeout, f"round {r}")
            self._round(r, waited=time.monotonic() - started)

    def _receive(self, hub: tensorwire.Hub) -> None:
        while not self._closing.is_set():
            try:
                cid, msg = hub.recv(timeout=0.5)
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
            self.downlink.sent(item[1], item[2], self.current)
        return True

    def _wait_for_devices(self, n: int, timeout: float, purpose: str) -> None:
        """Wait until ``n`` devices are available, or ``timeout`` s; then at least the quorum
        must be, else :class:`QuorumLost`."""
        deadline = time.monotonic() + timeout
        while self.devices.available_count() < n and time.monotonic() < deadline:
            self._pump(deadline)
        have = self.devices.available_count()
        quorum = self.cfg.min_updates
        if have >= quorum:
            if have < n:
                log.warning(
                    "fl: %d of %d devices available %s after %.0f s, going on (quorum %d); "
                    "missing: %s",
                    have,
                    n,
                    purpose,
                    timeout,
                    quorum,
                    self.devices.missing(),
                )
            return
        missing = self.devices.missing()
        listed = "; ".join(f"{cid}: {why}" for cid, why in missing.items())
        raise QuorumLost(
            f"{purpose}: {have} device(s) available within {timeout:g} s, the quorum "
            f"(min_updates) is {quorum}; missing: {listed or 'none known'}",
            missing,
        )

    # -- one round --------------------------------------------------------------------------

    def _round(self, r: int, waited: float = 0.0) -> None:
        """Round ``r``, after ``waited`` seconds waiting for a quorum of devices."""
        self.round_number = r
        now = time.monotonic()
        available = self.devices.available_count()
        plan = self.strategy.configure_round(r, self.cfg, self.devices)
        rd = Round(r, plan, now, available, waited)
        self.current = rd
        self.downlink.send(rd, list(plan.devices), self.global_state)
        while rd.waiting and time.monotonic() < rd.deadline:
            self._pump(rd.deadline)
        ended = rd.end()
        self.current = None
        self._end_round(rd, ended)

    def _join_round_under_way(self, dev: Device) -> None:
        """Under full participation, a device that becomes available during a round (it
        joined, came back, or finished a late update) takes part in it, if it has not."""
        rd = self.current
        full = self.cfg.clients_per_round is None and self.cfg.fraction >= 1.0
        if rd is not None and full and dev.available() and rd.may_join(dev.id):
            rd.join(dev.id)
            self.downlink.send(rd, [dev.id], self.global_state)

    def _end_round(self, rd: Round, ended: str) -> None:
        """Aggregate if the quorum was met, tell each device, evaluate, record, checkpoint."""
        accepted = [rd.accepted[c] for c in sorted(rd.accepted)]
        quorum = len(accepted) >= rd.plan.quorum
        stale = self.updates.take_stale() if quorum else []
        sent = self.global_state
        if quorum:
            self.global_state = self.strategy.aggregate_round(
                rd.number, self.cfg, sent, accepted, stale, self.params
            )
        self.downlink.previous = sent
        why = (
            ""
            if quorum
            else f"the round got {len(accepted)} of the {rd.plan.quorum} updates it needs"
        )
        status = "applied" if quorum else "dropped"
        for u in accepted:
            rd.status[u.client] = (status, why)
            self.devices[u.client].dropped = None if quorum else rd.number
            verdict = {"fl": "verdict", "round": rd.number, "status": status, "reason": why}
            self.outbox.tell(u.client, verdict)
        for u in stale:
            why_late = f"late, in round {rd.number}"
            verdict = {"fl": "verdict", "round": u.round, "status": "applied", "reason": why_late}
            self.outbox.tell(u.client, verdict)
        load_numpy_state(self.model, self.global_state)
        if self.task.test is not None:
            test_loss, accuracy = evaluate_model(self.model, self.task.test, self.task.loss_fn)
        else:
            test_loss, accuracy = float("nan"), float("nan")
        row = rd.row(ended, quorum, accepted, stale, test_loss, accuracy)
        self.result.rounds.append(row)
        self.result.updates += rd.update_rows()
        self.recorder.save()
        if self.recorder.run_dir is not None:
            path = self.recorder.run_dir.path
            save_round(path, rd.number, self.cfg, self.global_state, self.strategy, self.devices)
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

    # -- what devices say -------------------------------------------------------------------

    def _on_event(self, event: MembershipEvent) -> None:
        self.recorder.event(self.round_number, event.kind, event.client_id, event.reason, event.at)
        cid = event.client_id
        if cid is None:
            return
        self.devices.device(cid)
        if event.kind in ("left", "replaced"):  # a new connection may be a new process
            self.devices.left(cid, event.kind, event.reason, self.round_number)
            if self.current is not None:
                self.current.left(cid, event.reason)
        if event.kind in ("joined", "replaced"):
            self._setup(self.devices.joined(cid))

    def _setup(self, dev: Device) -> None:
        if not self.devices.assign_shard(dev):
            dev.failed = (
                f"no data shard left: the run splits {self.cfg.dataset} for {self.cfg.clients} "
                "devices"
            )
            self.outbox.tell(dev.id, {"fl": "done", "error": dev.failed})
            return
        self.outbox.tell(
            dev.id,
            {
                "fl": "setup",
                "config": self.cfg.as_dict(),
                "shard": dev.shard,
                "run": self.downlink.token,
            },
        )

    def _on_message(self, cid: str, msg: tensorwire.Message) -> None:
        dev = self.devices.device(cid)
        kind = msg.meta.get("fl")
        if kind == "update":
            if self.updates.take(dev, msg, self.current, self.round_number, self.global_state):
                self._join_round_under_way(dev)  # late: free again
        elif kind == "ready":
            self._on_ready(dev, msg.meta)
        elif kind == "error":
            self._on_failure(dev, msg.meta)
        elif kind == "resync":
            self._on_resync(dev, msg.meta)
        elif kind == "records" and self.finishing:
            rows = device_records(dev.id, msg.meta)
            if rows is not None:
                self.final_records[dev.id] = rows
        else:
            dev.junk += 1
            why = f"a message that is not an FL message ({kind!r})"[:100]
            self.recorder.event(self.round_number, "junk", cid, why)
            if dev.junk in (1, 10, 100) or dev.junk % 1000 == 0:
                log.warning("fl: %s sent %d message(s) that are not FL messages", cid, dev.junk)

    def _on_ready(self, dev: Device, meta: dict[str, Any]) -> None:
        nonce = meta.get("nonce")
        if not isinstance(nonce, str) or len(nonce) > 64:
            self.recorder.event(self.round_number, "junk", dev.id, "a ready without a valid nonce")
            return
        if self.devices.ready(dev, nonce) and self.current is not None:
            self.current.left(dev.id, "restarted during the round")
        self._join_round_under_way(dev)

    def _on_failure(self, dev: Device, meta: dict[str, Any]) -> None:
        error = str(meta.get("error", "no reason given"))[:MAX_REASON]
        self.devices.failed(dev, error)
        self.recorder.event(self.round_number, "failed", dev.id, error)
        log.warning("fl: device %s failed: %s", dev.id, error)
        if self.current is not None:
            self.current.failed(dev.id, error)

    def _on_resync(self, dev: Device, meta: dict[str, Any]) -> None:
        """The device cannot apply a delta (it does not hold the base): send it the model."""
        rd = self.current
        dev.holds = None
        why = f"could not apply a delta in round {meta.get('round')}"
        self.recorder.event(self.round_number, "resync", dev.id, why)
        if (
            rd is not None
            and meta.get("round") == rd.number
            and dev.id in rd.waiting
            and rd.sent.get(dev.id) == "delta"  # once: it asks again only to make us resend
        ):
            self.downlink.send(rd, [dev.id], self.global_state)

    # -- the end of the run -----------------------------------------------------------------

    def _finish(self) -> None:
        """Tell every device the run is over; take the transfer records of those that answer."""
        self.finishing = True
        self.outbox.say_done(self.devices.connected())
        waiting = set(self.devices.available())
        deadline = time.monotonic() + RECORDS_TIMEOUT
        while waiting - self.final_records.keys() and time.monotonic() < deadline:
            self._pump(min(deadline, time.monotonic() + LEFT_GRACE))
            # a device's leaving can be seen before its last message: give that a moment
            waiting = {c for c in waiting if self.devices.still_there(c, LEFT_GRACE)}
        late = sorted(waiting - self.final_records.keys())
        if late:
            log.warning("fl: no final records from %s", late)
        for rows in self.final_records.values():
            self.result.transfers += rows
