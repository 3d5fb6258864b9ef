"""The FedAvg server: broadcasts the global model, gathers updates, averages, evaluates.

It talks to devices only through a tensorwire URL, so it runs unchanged over every transport.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

import tensorwire
from tensorwire.errors import GatherTimeout, TensorwireError, TransportTimeout
from tensorwire.fl.compression import downlink_codec, xor_delta
from tensorwire.fl.config import FLConfig
from tensorwire.fl.data import load_dataset
from tensorwire.fl.fedavg import StateDict, apply_update, fedavg
from tensorwire.fl.models import build_model
from tensorwire.fl.records import transfer_rows
from tensorwire.fl.train import evaluate, load_numpy_state, state_to_numpy
from tensorwire.transports.security import credentials_from_dir

log = logging.getLogger("tensorwire.fl")


class FLError(TensorwireError, RuntimeError):
    """A federated run could not go on (a device crashed, left or timed out)."""


@dataclass
class RunResult:
    """What a run produced: one row per round and one per transfer (both sides' records)."""

    config: FLConfig
    rounds: list[dict[str, Any]] = field(default_factory=list)
    transfers: list[dict[str, Any]] = field(default_factory=list)


def run_server(
    url: str,
    cfg: FLConfig,
    *,
    on_round: Callable[[dict[str, Any]], None] | None = None,
    on_ready: Callable[[str], None] | None = None,
    certs: str | Path | None = None,
) -> RunResult:
    """Serve ``cfg.rounds`` rounds of FedAvg to ``cfg.clients`` devices at ``url``.

    ``on_ready(hub_url)`` is called once the hub listens (with the real port), ``on_round(row)``
    after each round. ``certs``: a directory from ``tensorwire certs``; only the devices
    enrolled there may join, over TLS. Raises :class:`FLError` naming the device when one
    leaves or times out.
    """
    torch.manual_seed(cfg.seed)
    data = load_dataset(cfg.dataset, root=cfg.data_root, seed=cfg.seed)
    model = build_model(cfg.model, data.num_classes)
    global_state = state_to_numpy(model)
    result = RunResult(cfg)
    departures: dict[str, str] = {}
    security = credentials_from_dir(certs, "hub") if certs else {}
    with tensorwire.serve(
        url,
        codec=downlink_codec(cfg),
        on_leave=lambda cid, reason: departures.setdefault(cid, reason),
        **security,
    ) as hub:
        if on_ready:
            on_ready(hub.url)
        try:
            devices = hub.wait_for(cfg.clients, timeout=cfg.join_timeout)[: cfg.clients]
        except TransportTimeout as exc:
            raise FLError(f"not all {cfg.clients} devices joined: {exc}") from None
        shards = {cid: i for i, cid in enumerate(devices)}
        previous: StateDict | None = None
        for r in range(1, cfg.rounds + 1):
            started = time.perf_counter()
            first = hub.records.mark()
            payload = global_state
            if cfg.downlink == "delta" and previous is not None:
                payload = xor_delta(global_state, previous)
            hub.broadcast(
                {"weights": payload},
                meta={
                    "round": r,
                    "config": cfg.as_dict(),
                    "shards": shards,
                    "delta": payload is not global_state,
                },
                clients=devices,
                timeout=cfg.round_timeout,
            )
            updates = _gather_updates(hub, devices, cfg, r, departures)
            local_states = [
                apply_update(global_state, u.tensors["update"]) for u in updates.values()
            ]
            samples = [u.meta["samples"] for u in updates.values()]
            previous, global_state = global_state, fedavg(local_states, samples)
            load_numpy_state(model, global_state)
            test_loss, accuracy = evaluate(model, data.test_x, data.test_y)
            round_records = hub.records.since(first)
            row = _round_row(r, updates, round_records, test_loss, accuracy, started)
            result.rounds.append(row)
            result.transfers += transfer_rows(r, "server", round_records)
            if on_round:
                on_round(row)
        hub.broadcast(None, meta={"done": True}, clients=devices, timeout=60)
        result.transfers += _collect_device_records(hub, devices)
    return result


def _gather_updates(
    hub: tensorwire.Hub, devices: list[str], cfg: FLConfig, r: int, departures: dict[str, str]
) -> dict[str, tensorwire.Message]:
    updates: dict[str, tensorwire.Message] = {}
    try:
        for cid, msg in hub.gather(timeout=cfg.round_timeout, clients=devices):
            if msg.meta.get("error"):
                raise FLError(f"round {r}: device {cid!r} failed: {msg.meta['error']}")
            updates[cid] = msg
    except GatherTimeout as exc:
        raise FLError(
            f"round {r}: no update within {cfg.round_timeout} s from device(s) {exc.missing}"
        ) from None
    missing = sorted(set(devices) - updates.keys())
    if missing:
        why = "; ".join(f"{cid}: {departures.get(cid, 'left')}" for cid in missing)
        raise FLError(f"round {r}: device(s) {missing} left before sending an update ({why})")
    return dict(sorted(updates.items()))


def _round_row(
    r: int,
    updates: dict[str, tensorwire.Message],
    records: list[Any],
    test_loss: float,
    accuracy: float,
    started: float,
) -> dict[str, Any]:
    uplink = [rec for rec in records if rec.direction == "recv"]
    return {
        "round": r,
        "accuracy": accuracy,
        "test_loss": test_loss,
        "train_loss": float(np.mean([u.meta["train_loss"] for u in updates.values()])),
        "train_s_max": max(u.meta["train_s"] for u in updates.values()),
        "train_s_mean": float(np.mean([u.meta["train_s"] for u in updates.values()])),
        "uplink_bytes": sum(rec.bytes_encoded for rec in uplink),
        "uplink_bytes_raw": sum(rec.bytes_raw for rec in uplink),
        "downlink_bytes": sum(rec.bytes_encoded for rec in records if rec.direction == "send"),
        # device-reported downlink wall (first encoded byte to last tensor decoded) + uplink
        "comm_s": sum(u.meta.get("downlink_wall_s", 0.0) for u in updates.values())
        + sum(rec.e2e_s or rec.wall_s for rec in uplink),
        "round_s": time.perf_counter() - started,
    }


def _collect_device_records(hub: tensorwire.Hub, devices: list[str]) -> list[dict[str, Any]]:
    """Each device answers "done" with its own transfer records (encode times live there)."""
    rows: list[dict[str, Any]] = []
    try:
        for _, msg in hub.gather(timeout=60, clients=devices):
            rows += msg.meta.get("records", [])
    except GatherTimeout as exc:
        log.warning("fl: no final records from %s", exc.missing)
    return rows
