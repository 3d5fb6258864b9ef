"""An FL device: set up from the server's settings, then in each round it is sampled for:
the global model in, local training, the update out.

The device trains its own model (a factory, or the built-in one the server names) on its own
data (a Dataset, a DataLoader, arrays, or its shard of a built-in data set). Its randomness in
a round depends on (seed, device, round) only. Before each update it keeps its compressor's
error-feedback memory, and puts it back when the server says the update was not applied (or
asks for that round again after a restart), so the residual only carries what applied
rounds computed and did not send. When the server goes away without saying the run is done,
the device reconnects (a resumed server finds it again).
"""

from __future__ import annotations

import contextlib
import logging
import time
import traceback
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import torch

import tensorwire
from tensorwire.errors import DeliveryUncertain, PeerGone, TransportError, TransportTimeout
from tensorwire.fl.compression import (
    apply_xor_delta,
    feedback_state,
    restore_feedback,
    uplink_codec,
)
from tensorwire.fl.config import CUSTOM, FLConfig, is_builtin_model
from tensorwire.fl.data import load_dataset, split_indices
from tensorwire.fl.errors import FLError
from tensorwire.fl.models import build_model
from tensorwire.fl.records import transfer_rows
from tensorwire.fl.strategies import model_update
from tensorwire.fl.task import ModelFactory, build, check_same_model
from tensorwire.fl.train import (
    ArrayData,
    LossFn,
    StateDict,
    TrainingData,
    as_data,
    load_numpy_state,
    round_seed,
    state_to_numpy,
    train_model,
)
from tensorwire.transports import Credentials

log = logging.getLogger("tensorwire.fl")

MAX_VERDICTS = 1_000  # verdicts kept by a device (the server's word on its updates)


class FLDevice:
    """What a device keeps between messages: settings, data, model, the last global model
    and the error-feedback memory of its last update until the server's word on it."""

    def __init__(
        self,
        client_id: str,
        *,
        model: ModelFactory | None = None,
        train_data: Any = None,
        loss_fn: LossFn | None = None,
    ) -> None:
        self.client_id = client_id
        self.factory = model
        self.own_data = as_data(train_data, "train_data") if train_data is not None else None
        self.loss_fn = loss_fn
        self.nonce = uuid.uuid4().hex  # tells the server this process from a restarted one
        self.cfg: FLConfig | None = None
        self._setup_key: tuple[Any, ...] | None = None
        self.data: TrainingData | None = None
        self.model: torch.nn.Module | None = None
        self.template: StateDict = {}
        self.selector: Any = None
        self.global_state: StateDict | None = None
        self.holds: tuple[Any, Any] | None = None  # (run token, round) of global_state
        self.pending: tuple[int, Any] | None = None  # (round, feedback memory before it)
        self.verdicts: list[dict[str, Any]] = []
        self.rows: list[dict[str, Any]] = []
        self.rounds = 0

    # -- setting up -------------------------------------------------------------------------

    def setup(self, config: dict[str, Any], shard: Any) -> None:
        """Build the data and model the run's ``config`` asks for (again only if it changed)."""
        key = (tuple(sorted(config.items())), shard)
        if key == self._setup_key:
            return
        cfg = FLConfig.from_dict(config)
        self.data = self._data(cfg, shard)
        self.model = build(self._factory(cfg))
        self.template = state_to_numpy(self.model)
        self.selector = uplink_codec(cfg)
        self.cfg, self._setup_key = cfg, key
        _warm_up()

    def _data(self, cfg: FLConfig, shard: Any) -> TrainingData:
        if self.own_data is not None:
            return self.own_data
        if cfg.dataset == CUSTOM:
            raise FLError(
                "this run trains on each device's own data: join with train_data= (this device "
                "has none)"
            )
        if isinstance(shard, bool) or not isinstance(shard, int) or not 0 <= shard < cfg.clients:
            raise FLError(f"the server gave no valid data shard ({shard!r}) for {cfg.dataset}")
        data = load_dataset(cfg.dataset, root=cfg.data_root, seed=cfg.seed, clients=cfg.clients)
        shards = split_indices(data.train_y, cfg.clients, cfg.split, alpha=cfg.alpha, seed=cfg.seed)
        return ArrayData(data.train_x[shards[shard]], data.train_y[shards[shard]])

    def _factory(self, cfg: FLConfig) -> ModelFactory:
        if self.factory is not None:
            return self.factory
        if is_builtin_model(cfg.model):
            num_classes = 10

            def builtin() -> torch.nn.Module:
                return build_model(cfg.model, num_classes)

            return builtin
        # never import what the server names: the device's owner says which code runs here
        raise FLError(
            f"the server trains the model {cfg.model!r}: give this device the same model "
            f"(tensorwire fl client --model {cfg.model}, or join(..., model=...))"
        )

    # -- a round ----------------------------------------------------------------------------

    def receive_model(self, msg: tensorwire.Message) -> StateDict | None:
        """The global model a round's message carries (rebuilt from a delta), or None when it
        is a delta this device cannot apply: against a model it does not hold, or partly lost
        on a best-effort transport. (A whole model partly lost is taken: its gaps hold the
        last model's values.)"""
        meta = msg.meta
        weights = msg.tensors["weights"]
        if meta.get("delta"):
            if self.global_state is None or self.holds != (meta.get("run"), meta.get("base")):
                return None
            if any(getattr(msg, "loss", {}).values()):  # best effort lost part of it: a
                return None  # delta's gap holds the last delta's bits, not this one's
            received = apply_xor_delta(self.global_state, weights)
        else:
            received = {k: np.array(v, copy=True) for k, v in weights.items()}
        check_same_model(self.template, received, "the server's")
        return received

    def roll_back(self, r: int, meta: dict[str, Any]) -> None:
        """Put the feedback memory back to before the last update if the server did not
        apply it (it says so) or asks for its round again (it was restarted)."""
        if self.pending is None:
            return
        pending_round, memory = self.pending
        dropped = (meta.get("dropped") or {}).get(self.client_id)
        if dropped == pending_round or r <= pending_round:
            restore_feedback(self.selector, memory)
        self.pending = None

    def train(self, received: StateDict, r: int) -> tuple[StateDict, Any]:
        """Train round ``r`` from ``received``; return ``(update, result)``."""
        assert self.cfg is not None and self.model is not None and self.data is not None
        cfg = self.cfg
        load_numpy_state(self.model, received)
        result = train_model(
            self.model,
            self.data,
            epochs=cfg.epochs,
            batch_size=cfg.batch_size,
            lr=cfg.lr,
            momentum=cfg.momentum,
            seed=round_seed(cfg.seed, self.client_id, r),
            mu=cfg.mu if cfg.strategy == "fedprox" else 0.0,
            loss_fn=self.loss_fn,
        )
        return model_update(state_to_numpy(self.model), received), result


def _warm_up() -> None:
    """Pay torch's one-time costs now, not in round 1's deadline: the first optimizer step
    imports its compiler stack (seconds on a busy host)."""
    p = torch.zeros(1, requires_grad=True)
    p.sum().backward()
    torch.optim.SGD([p], lr=0.0, momentum=0.9).step()


class _Uplink:
    """The device's channel, reconnected when the server goes away without saying done."""

    def __init__(self, url: str, client_id: str, timeout: float, security: dict[str, Any]):
        self.url, self.client_id, self.timeout = url, client_id, timeout
        self.ch = tensorwire.connect(
            url, client_id=client_id, codec=None, timeout=timeout, **security
        )

    def reopen(self) -> bool:
        """Reconnect, same channel and codecs (for up to ``timeout`` s); False if the server
        did not come back."""
        log.warning("fl: %s lost the server at %s, reconnecting", self.client_id, self.url)
        try:
            self.ch.reconnect(self.timeout)
        except TransportTimeout:
            return False
        return True

    def send(self, tensors: Any, meta: dict[str, Any]) -> Any:
        """Send, reconnecting once if the server went away meanwhile, and sending once more
        if the medium may have lost the message (a broker restarted without its state)."""
        try:
            return self.ch.send(tensors, meta)
        except PeerGone:
            if not self.reopen():
                raise
            return self.ch.send(tensors, meta)
        except DeliveryUncertain as exc:
            log.warning("fl: %s sends %s again: %s", self.client_id, meta.get("fl"), exc)
            return self.ch.send(tensors, meta)


def run_client(
    url: str,
    client_id: str,
    *,
    model: ModelFactory | None = None,
    train_data: Any = None,
    loss_fn: LossFn | None = None,
    timeout: float = 600.0,
    threads: int = 1,
    certs: str | Path | None = None,
) -> int:
    """Take part in rounds until the server says the run is done; return the rounds trained.

    ``model`` (a factory) and ``train_data`` are this device's own; without them it trains
    the built-in model on its shard of the built-in data set the server names. ``timeout``:
    seconds to wait for the server to answer (to connect, and to come back after it went
    away); while connected the device waits for work as long as it takes. ``threads``
    caps torch's CPU threads. ``certs``: a directory holding this device's files from
    ``tensorwire certs``. A failure is reported to the server (so it can say which device
    failed and why), then raised.
    """
    torch.set_num_threads(threads)
    device = FLDevice(client_id, model=model, train_data=train_data, loss_fn=loss_fn)
    security = {"credentials": Credentials.from_dir(certs, "channel", client_id)} if certs else {}
    uplink = _Uplink(url, client_id, timeout, security)
    try:
        while True:
            try:
                # a device waits for work as long as its server is there (sampled or not)
                msg = uplink.ch.recv(timeout=None)
            except PeerGone:
                if uplink.reopen():
                    continue
                log.warning("fl: %s: the server at %s is gone", client_id, url)
                return device.rounds
            if _handle(device, uplink, msg):
                return device.rounds
    finally:
        uplink.ch.close()


def _handle(device: FLDevice, uplink: _Uplink, msg: tensorwire.Message) -> bool:
    """Act on one message from the server; True when the run is over."""
    meta = msg.meta
    kind = meta.get("fl")
    if kind == "done":
        if meta.get("error"):
            log.warning("fl: %s: the run ended: %s", device.client_id, meta["error"])
        try:
            uplink.ch.send(None, {"fl": "records", "records": device.rows})
        except TransportError as exc:
            log.warning("fl: %s could not send its records: %s", device.client_id, exc)
        return True
    if kind == "verdict":
        if len(device.verdicts) < MAX_VERDICTS:
            device.verdicts.append(dict(meta))
        level = logging.WARNING if meta.get("status") in ("rejected", "late") else logging.INFO
        log.log(
            level,
            "fl: %s: round %s update %s %s",
            device.client_id,
            meta.get("round"),
            meta.get("status"),
            meta.get("reason") or "",
        )
        return False
    r = meta.get("round")
    try:
        if kind == "setup":
            started = time.perf_counter()
            device.setup(meta["config"], meta.get("shard"))
            log.info("fl: %s set up in %.1f s", device.client_id, time.perf_counter() - started)
            uplink.ch.set_codec(device.selector)
            uplink.send(None, {"fl": "ready", "nonce": device.nonce})
            return False
        if kind != "round" or isinstance(r, bool) or not isinstance(r, int):
            log.warning("fl: %s: ignoring a message of kind %r", device.client_id, kind)
            return False
        device.setup(meta["config"], (meta.get("shards") or {}).get(device.client_id))
        uplink.ch.set_codec(device.selector)
        device.rows += _rows(r, "model", [msg.record], device.client_id)
        received = device.receive_model(msg)
        if received is None:  # a delta it cannot apply: ask for the whole model
            uplink.send(None, {"fl": "resync", "round": r})
            return False
        device.roll_back(r, meta)
        device.global_state, device.holds = received, (meta.get("run"), r)
        update, result = device.train(received, r)
    except Exception as exc:  # tell the server why, instead of vanishing
        log.exception("fl: device %s failed in round %s", device.client_id, r)
        error = {
            "fl": "error",
            "round": r,
            "error": f"{type(exc).__name__}: {exc}",
            "traceback": traceback.format_exc(),
        }
        with contextlib.suppress(TransportError):
            uplink.ch.send(None, error)
        raise
    device.pending = (r, feedback_state(device.selector))
    sent = uplink.send(
        {"update": update},
        {
            "fl": "update",
            "round": r,
            "samples": result.samples,
            "train_s": result.seconds,
            "train_loss": result.loss,
            "downlink_wall_s": msg.record.e2e_s if msg.record is not None else None,
        },
    )
    device.rows += _rows(r, "update", [sent], device.client_id)
    device.rounds += 1
    return False


def _rows(r: Any, payload: str, records: list[Any], client_id: str) -> list[dict[str, Any]]:
    rows = transfer_rows(r, "device", [rec for rec in records if rec is not None], client_id)
    for row in rows:
        row["payload"] = payload
    return rows
