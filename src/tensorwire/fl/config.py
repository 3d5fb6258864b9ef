"""The settings of one federated-learning run (FedComm's defaults), sent to every device."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

UPLINK_COMPRESSORS = ("none", "fp16", "bf16", "int8", "qsgd", "topk", "randomk", "dgc", "signsgd")
DOWNLINK_MODES = ("none", "fp16", "delta")


@dataclass
class FLConfig:
    """One run. Defaults follow FedComm: VGG-8, 4 devices, 5 rounds, 1 local epoch, batch 100,
    SGD lr 0.01 momentum 0.9, equal contiguous shards."""

    dataset: str = "digits"
    data_root: str | None = None
    model: str = "vgg8"
    clients: int = 4
    rounds: int = 5
    epochs: int = 1
    batch_size: int = 100
    lr: float = 0.01
    momentum: float = 0.9
    split: str = "equal"
    alpha: float = 0.5  # Dirichlet concentration for split="dirichlet"
    seed: int = 0
    uplink: str = "none"  # one of UPLINK_COMPRESSORS
    ratio: float = 0.01  # fraction kept by top-k / random-k / DGC
    error_feedback: bool = True
    downlink: str = "none"  # one of DOWNLINK_MODES
    join_timeout: float = 120.0  # seconds the server waits for all devices
    round_timeout: float = 600.0  # seconds the server waits for a round's updates

    def __post_init__(self) -> None:
        if self.uplink not in UPLINK_COMPRESSORS:
            raise ValueError(
                f"uplink {self.uplink!r}: choose one of {', '.join(UPLINK_COMPRESSORS)}"
            )
        if self.downlink not in DOWNLINK_MODES:
            raise ValueError(
                f"downlink {self.downlink!r}: choose one of {', '.join(DOWNLINK_MODES)}"
            )
        if self.clients < 1 or self.rounds < 1 or self.epochs < 1 or self.batch_size < 1:
            raise ValueError("clients, rounds, epochs and batch_size must be positive")

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> FLConfig:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})
