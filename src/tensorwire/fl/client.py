"""An FL device: receives the global model, trains on its shard, sends its update back."""

from __future__ import annotations

import logging
import traceback
from typing import Any

import torch

import tensorwire
from tensorwire.errors import PeerGone
from tensorwire.fl.compression import uplink_codec
from tensorwire.fl.config import FLConfig
from tensorwire.fl.data import Dataset, load_dataset, split_indices
from tensorwire.fl.fedavg import StateDict, apply_update, model_update
from tensorwire.fl.models import build_model
from tensorwire.fl.records import transfer_rows
from tensorwire.fl.train import load_numpy_state, state_to_numpy, train_local

log = logging.getLogger("tensorwire.fl")


def run_client(url: str, client_id: str, *, timeout: float = 600.0, threads: int = 1) -> int:
    """Take part in rounds until the server says done; return the number of rounds trained.

    The run's settings (data set, model, compressor ...) come from the server with the first
    global model, so every device trains the same way. ``threads`` caps torch's CPU threads.
    """
    torch.set_num_threads(threads)
    cfg: FLConfig | None = None
    rows: list[dict[str, Any]] = []
    rounds = 0
    ch = tensorwire.connect(url, client_id=client_id, codec=None, timeout=timeout)
    try:
        data: Dataset | None = None
        shard = None
        model = None
        global_state: StateDict | None = None
        while True:
            try:
                msg = ch.recv(timeout=timeout)
            except PeerGone:
                return rounds
            if msg.meta.get("done"):
                ch.send(None, {"records": rows})
                return rounds
            r = msg.meta["round"]
            if cfg is None:
                cfg = FLConfig.from_dict(msg.meta["config"])
                ch.set_codec(uplink_codec(cfg))
                data = load_dataset(cfg.dataset, root=cfg.data_root, seed=cfg.seed)
                index = msg.meta["shards"][client_id]
                shard = split_indices(
                    data.train_y, cfg.clients, cfg.split, alpha=cfg.alpha, seed=cfg.seed
                )[index]
                model = build_model(cfg.model, data.num_classes)
            assert data is not None and shard is not None and model is not None
            received = msg.tensors["weights"]
            if msg.meta.get("delta"):
                assert global_state is not None
                received = apply_update(global_state, received)
            global_state = {k: v.copy() for k, v in received.items()}
            rows += transfer_rows(r, "device", [msg.record], client_id)
            try:
                load_numpy_state(model, global_state)
                result = train_local(
                    model,
                    data.train_x[shard],
                    data.train_y[shard],
                    epochs=cfg.epochs,
                    batch_size=cfg.batch_size,
                    lr=cfg.lr,
                    momentum=cfg.momentum,
                    seed=cfg.seed * 1000 + r,
                )
            except Exception as exc:  # tell the server why, instead of vanishing
                log.exception("fl: device %s failed in round %d", client_id, r)
                ch.send(
                    None,
                    {
                        "round": r,
                        "error": f"{type(exc).__name__}: {exc}",
                        "traceback": traceback.format_exc(),
                    },
                )
                raise
            update = model_update(state_to_numpy(model), global_state)
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
