"""The server's side of checkpoints: what it saves after every round, and takes back to resume
a stopped run (files: :mod:`tensorwire.fl.checkpoint`)."""

from __future__ import annotations

from pathlib import Path

import torch

from tensorwire.fl.checkpoint import Checkpoint, save_checkpoint
from tensorwire.fl.config import FLConfig
from tensorwire.fl.errors import CheckpointError
from tensorwire.fl.server.device_manager import DeviceManager
from tensorwire.fl.strategies import Strategy
from tensorwire.fl.train import StateDict

_RESUMABLE = {"join_timeout", "round_timeout"}  # settings a resumed run may change


def save_round(
    path: Path,
    r: int,
    cfg: FLConfig,
    model: StateDict,
    strategy: Strategy,
    devices: DeviceManager,
) -> None:
    """Checkpoint the run after round ``r`` into the results directory ``path``."""
    meta, arrays = strategy.state()
    save_checkpoint(
        path,
        Checkpoint(
            round=r,
            config=cfg.as_dict(),
            model=model,
            strategy={"name": strategy.name, "state": meta},
            strategy_arrays=arrays,
            server=devices.state() | {"torch_rng": bytes(torch.get_rng_state().tolist()).hex()},
        ),
    )


def restore(ckpt: Checkpoint, strategy: Strategy, devices: DeviceManager) -> None:
    """Give ``strategy``, ``devices`` and torch's generator back what ``ckpt`` saved."""
    strategy.load_state(ckpt.strategy.get("state", {}), ckpt.strategy_arrays)
    devices.restore(ckpt.server)
    if "torch_rng" in ckpt.server:
        torch.set_rng_state(
            torch.tensor(list(bytes.fromhex(ckpt.server["torch_rng"])), dtype=torch.uint8)
        )


def resumed_config(ckpt: Checkpoint, cfg: FLConfig | None) -> FLConfig:
    """The settings of a resumed run: the checkpoint's, or ``cfg`` if it changes only what
    a resumed run may change (its timeouts)."""
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
