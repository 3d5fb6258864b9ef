"""The settings of one federated-learning run, sent to every device with the global model."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, fields
from typing import Any

UPLINK_COMPRESSORS = ("none", "fp16", "bf16", "int8", "qsgd", "topk", "randomk", "dgc", "signsgd")
DOWNLINK_MODES = ("none", "fp16", "delta")
LOSSLESS_DEFAULT = "auto"  # link-aware: each tensor raw or compressed, whichever is faster
STRATEGIES = ("fedavg", "fedprox", "fedadam", "fedyogi", "median", "trimmed-mean")
LATE_POLICIES = ("discard", "stale")
BUILTIN_MODELS = ("vgg5", "vgg8", "resnet18", "mlp")
# Synthetic updates of a given size, no training: ``payload:10MB`` (B, KB, MB, GB; 1000-based).
_PAYLOAD = re.compile(r"^payload:(\d+(?:\.\d+)?)(B|KB|MB|GB)$", re.IGNORECASE)
_UNITS = {"B": 1, "KB": 1_000, "MB": 1_000_000, "GB": 1_000_000_000}
BUILTIN_DATASETS = ("digits", "cifar10", "synthetic")
CUSTOM = "custom"  # a model or data set the user's code supplies (tensorwire.fl.serve / join)
_FACTORY_REF = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")  # package.module:function


def payload_bytes(name: str) -> int | None:
    """The size in bytes a ``payload:<size>`` model name asks for (``payload:10MB`` ->
    10,000,000), or None for any other name; ValueError for a size under 64 bytes."""
    match = _PAYLOAD.match(name)
    if match is None:
        return None
    size = int(float(match.group(1)) * _UNITS[match.group(2).upper()])
    if size < 64:
        raise ValueError(f"model {name!r}: a payload needs at least 64 bytes")
    return size


def is_builtin_model(name: str) -> bool:
    """Whether ``name`` is a model tensorwire builds itself: one of :data:`BUILTIN_MODELS`, or
    ``payload:<size>`` (synthetic updates of that size, no training)."""
    return name in BUILTIN_MODELS or payload_bytes(name) is not None


def is_factory_ref(name: str) -> bool:
    """Whether ``name`` reads ``package.module:function`` (a user's model factory)."""
    return bool(_FACTORY_REF.match(name))


@dataclass
class FLConfig:
    """One run. Training defaults follow FedComm (4 devices, 5 rounds, 1 local epoch, batch
    100, SGD lr 0.01 momentum 0.9, equal contiguous shards) on VGG-5.

    Rounds: each samples ``clients_per_round`` devices (else ``fraction`` of those
    available, at least ``min_updates``), waits until every sampled device answered or
    ``round_timeout`` seconds (the deadline) passed, and aggregates if at least
    ``min_updates`` valid updates arrived (the quorum); otherwise the global model stays.
    ``late``: a late update is dropped (``discard``) or added to the next aggregation with the
    weight ``samples * (1 + age) ** -staleness`` (``stale``; age in rounds).
    ``clients`` devices are waited for (``join_timeout`` s) before the first round.
    """

    dataset: str = "digits"
    data_root: str | None = None
    model: str = "vgg5"
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
    codec: str = LOSSLESS_DEFAULT  # lossless, both ways: auto, none, or a codec id (lz4 ...)
    fraction: float = 1.0  # of the available devices sampled per round
    clients_per_round: int | None = None  # overrides fraction
    min_updates: int = 1  # the quorum: valid updates a round needs to change the model
    late: str = "discard"  # one of LATE_POLICIES
    staleness: float = 0.5  # exponent of a late update's weight (1 + age) ** -staleness
    strategy: str = "fedavg"  # one of STRATEGIES
    mu: float = 0.01  # FedProx: the devices' proximal term (mu / 2) * |w - w_global|^2
    server_lr: float = 0.01  # FedAdam / FedYogi: the server optimizer's step size
    beta1: float = 0.9  # FedAdam / FedYogi: first-moment decay
    beta2: float = 0.99  # FedAdam / FedYogi: second-moment decay
    tau: float = 1e-3  # FedAdam / FedYogi: adaptivity (added to the root of the 2nd moment)
    trim: float = 0.1  # trimmed mean: the fraction cut at each end, per coordinate
    loss_aware: bool = True  # weight each tensor by the fraction of it that arrived (udp)
    max_samples: int = 1_000_000  # the most samples an update may claim (built-in: its shard)
    clip_norm: float | None = None  # scale each update down to this L2 norm (None: no clip)
    join_timeout: float = 120.0  # seconds to wait for devices (at the start, and for a quorum)
    round_timeout: float = 600.0  # a round's deadline, seconds after it starts

    def __post_init__(self) -> None:
        _choice("uplink", self.uplink, UPLINK_COMPRESSORS)
        _choice("downlink", self.downlink, DOWNLINK_MODES)
        check_lossless(self.codec)
        _choice("strategy", self.strategy, (*STRATEGIES, CUSTOM))
        _choice("late", self.late, LATE_POLICIES)
        _choice("dataset", self.dataset, (*BUILTIN_DATASETS, CUSTOM))
        if (
            not is_builtin_model(self.model)
            and self.model != CUSTOM
            and not is_factory_ref(self.model)
        ):
            raise ValueError(
                f"model {self.model!r}: choose one of {', '.join(BUILTIN_MODELS)}, "
                "payload:<size> (e.g. payload:10MB), or name a "
                "function that returns a torch.nn.Module as package.module:function"
            )
        if self.clients < 1 or self.rounds < 1 or self.epochs < 1 or self.batch_size < 1:
            raise ValueError("clients, rounds, epochs and batch_size must be positive")
        if not 0.0 < self.fraction <= 1.0:
            raise ValueError(f"fraction must be in (0, 1], got {self.fraction}")
        if self.clients_per_round is not None and self.clients_per_round < 1:
            raise ValueError(f"clients_per_round must be positive, got {self.clients_per_round}")
        if self.min_updates < 1:
            raise ValueError(f"min_updates (the quorum) must be positive, got {self.min_updates}")
        if self.clients_per_round is not None and self.min_updates > self.clients_per_round:
            raise ValueError(
                f"min_updates {self.min_updates} is more than the {self.clients_per_round} "
                "devices sampled per round (clients_per_round): no round could reach it"
            )
        if not 0.0 <= self.trim < 0.5:
            raise ValueError(f"trim must be in [0, 0.5), got {self.trim}")
        positive = {
            "server_lr": self.server_lr,
            "tau": self.tau,
            "round_timeout": self.round_timeout,
            "join_timeout": self.join_timeout,
            "max_samples": self.max_samples,
        }
        for name, value in positive.items():
            if not value > 0:
                raise ValueError(f"{name} must be positive, got {value}")
        if self.clip_norm is not None and not self.clip_norm > 0:
            raise ValueError(f"clip_norm must be positive (or None), got {self.clip_norm}")
        if self.mu < 0 or self.staleness < 0:
            raise ValueError("mu and staleness must not be negative")
        if not (0.0 <= self.beta1 < 1.0 and 0.0 <= self.beta2 < 1.0):
            raise ValueError("beta1 and beta2 must be in [0, 1)")

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> FLConfig:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


def lossless_codecs() -> tuple[str, ...]:
    """The names ``codec`` takes: ``none``, ``auto`` and every registered lossless codec
    (a plugin's included; lossy compressors are the uplink's and downlink's)."""
    from tensorwire.codecs import LOSSY_CODECS, available_codecs

    return ("none", "auto", *(c for c in available_codecs() if c not in LOSSY_CODECS))


def check_lossless(name: str) -> None:
    """ValueError unless ``name`` is one of :func:`lossless_codecs`."""
    if name not in ("none", LOSSLESS_DEFAULT):  # the common ones: no codec import
        _choice("codec", name, lossless_codecs())


def _choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{name} {value!r}: choose one of {', '.join(choices)}")
