"""An FL device: receives the global model, trains on its shard, sends its update back."""

from __future__ import annotations

import logging
import traceback
from pathlib import Path
from typing import Any

import torch

import tensorwire
from tensorwire.errors import PeerGone
from tensorwire.fl.compression import apply_xor_delta, uplink_codec
from tensorwire.fl.config import FLConfig
from tensorwire.fl.data import Dataset, load_dataset, split_indices
from tensorwire.fl.fedavg import StateDict, model_update
from tensorwire.fl.models import build_model
from tensorwire.fl.records import transfer_rows
from tensorwire.fl.train import load_numpy_state, state_to_numpy, train_local
from tensorwire.transports.security import credentials_from_dir

log = logging.getLogger("tensorwire.fl")


class _Device:
    """What a device keeps between rounds: its settings, shard, model and last global model."""

    def __init__(self, client_id: str) -> None:
        self.client_id = client_id
        self.cfg: FLConfig | None = None
        self.data: Dataset | None = None
        self.shard: Any = None
        self.model: Any = None
        self.global_state: StateDict | None = None

    def setup(self, meta: dict[str, Any]) -> FLConfig:
        cfg = FLConfig.from_dict(meta["config"])
        self.data = load_dataset(cfg.dataset, root=cfg.data_root, seed=cfg.seed)
        shards = split_indices(
            self.data.train_y, cfg.clients, cfg.split, alpha=cfg.alpha, seed=cfg.seed
        )
        self.shard = shards[meta["shards"][self.client_id]]
        self.model = build_model(cfg.model, self.data.num_classes)
        self.cfg = cfg
        return cfg

    def train_round(self, msg: tensorwire.Message, r: int) -> tuple[StateDict, Any]:
        """Load the global model the message carries, train, return ``(update, result)``."""
        assert self.cfg is not None and self.data is not None
        received = msg.tensors["weights"]
        if msg.meta.get("delta"):
            if self.global_state is None:
                raise ValueError("the server sent a delta before any full model")
            received = apply_xor_delta(self.global_state, received)
        self.global_state = {k: v.copy() for k, v in received.items()}
        load_numpy_state(self.model, self.global_state)
        cfg = self.cfg
        result = train_local(
            self.model,
            self.data.train_x[self.shard],
            self.data.train_y[self.shard],
            epochs=cfg.epochs,
            batch_size=cfg.batch_size,
            lr=cfg.lr,
            momentum=cfg.momentum,
            seed=cfg.seed * 1000 + r,
        )
        return model_update(state_to_numpy(self.model), self.global_state), result


def run_client(
    url: str,
    client_id: str,
    *,
    timeout: float = 600.0,
    threads: int = 1,
    certs: str | Path | None = None,
) -> int:
    """Take part in rounds until the server says done; return the number of rounds trained.

    The run's settings (data set, model, compressor ...) come from the server with the first
    global model, so every device trains the same way. ``threads`` caps torch's CPU threads.
    ``certs``: a directory holding this device's files from ``tensorwire certs``.
    A failure is reported to the server (so its error names this device), then raised.
    """
    torch.set_num_threads(threads)
    device = _Device(client_id)
    rows: list[dict[str, Any]] = []
    rounds = 0
    security = credentials_from_dir(certs, "channel", client_id) if certs else {}
    ch = tensorwire.connect(url, client_id=client_id, codec=None, timeout=timeout, **security)
    try:
        while True:
            try:
                msg = ch.recv(timeout=timeout)
            except PeerGone:
                return rounds
            if msg.meta.get("done"):
                ch.send(None, {"records": rows})
                return rounds
            r = msg.meta["round"]
            rows += transfer_rows(r, "device", [msg.record], client_id)
            try:
                if device.cfg is None:
                    ch.set_codec(uplink_codec(device.setup(msg.meta)))
                update, result = device.train_round(msg, r)
            except Exception as exc:  # tell the server why, instead of vanishing
                log.exception("fl: device %s failed in round %d", client_id, r)
                error = {
                    "round": r,
                    "error": f"{type(exc).__name__}: {exc}",
                    "traceback": traceback.format_exc(),
                }
                ch.send(None, error)
                raise
            sent = ch.send(
                {"update": update},
                meta={
                    "round": r,
                    "samples": result.samples,
                    "train_s": result.seconds,
                    "train_loss": result.loss,
                    "downlink_wall_s": msg.record.e2e_s,
                },
            )
            rows += transfer_rows(r, "device", [sent], client_id)
            rounds = r
    finally:
        ch.close()
