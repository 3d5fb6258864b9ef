"""How a round's updates become the next global model.

Every strategy works on updates (``local - global`` for float entries; integer entries such
as BatchNorm's ``num_batches_tracked`` travel as values), each with a weight (its sample
count, lowered for a late update) and, from a best-effort transport, the fraction of each
tensor that did not arrive (``Message.loss``):

- ``fedavg``: the weighted mean (McMahan et al., 2017). With ``loss_aware`` each tensor's
  weight is scaled by the fraction of it that arrived, so a tensor lost in transit counts
  for what came and not for the stale bytes that filled the gap.
- ``fedprox``: FedAvg on the server; the devices add the proximal term (Li et al., 2020).
- ``fedadam`` / ``fedyogi``: the weighted mean update is a pseudo-gradient for a server
  optimizer on the model's parameters (Reddi et al., 2021, "Adaptive Federated
  Optimization"); buffers (BatchNorm statistics) are averaged.
- ``median`` / ``trimmed-mean``: coordinate-wise median, or mean after cutting the ``trim``
  fraction at each end (Yin et al., 2018): robust to a minority of absurd updates. A tensor
  that did not arrive whole is left out of them.

As in Flower, a strategy configures each round (:meth:`Strategy.configure_round`: which
devices, the deadline, the quorum) and aggregates it (:meth:`Strategy.aggregate_round`); the
server's round loop does the rest.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from tensorwire.fl.config import FLConfig
from tensorwire.fl.train import StateDict


@dataclass
class Update:
    """One device's validated update: ``delta`` per model entry, ``weight`` (samples, times
    the staleness factor of a late update), ``loss`` per entry (fraction lost, 0.0 to 1.0)."""

    client: str
    round: int
    delta: StateDict
    samples: int
    weight: float
    loss: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class RoundPlan:
    """What a round asks: the ``devices`` sampled, the ``deadline_s`` (seconds from the
    round's start) they have, and the ``quorum`` of valid updates it needs to aggregate."""

    devices: list[str]
    deadline_s: float
    quorum: int


class DevicePool(Protocol):
    """The devices a strategy samples from (the server's device manager)."""

    def available(self) -> list[str]: ...

    def sample(self, k: int, seed: Sequence[int]) -> list[str]: ...


class Strategy:
    """FedAvg. Subclasses change :meth:`aggregate` (or the round's plan,
    :meth:`configure_round`) and keep their state with :meth:`state` / :meth:`load_state`
    (checkpointed every round)."""

    name = "fedavg"

    def __init__(self, loss_aware: bool = True) -> None:
        self.loss_aware = loss_aware

    def configure_round(self, r: int, cfg: FLConfig, devices: DevicePool) -> RoundPlan:
        """Round ``r``'s plan: ``cfg.clients_per_round`` of the available devices, or else
        ``ceil(cfg.fraction * available)``, never fewer than the quorum (``cfg.min_updates``),
        drawn by (``cfg.seed``, ``r``); the deadline is ``cfg.round_timeout``."""
        available = len(devices.available())
        k = cfg.clients_per_round or int(np.ceil(cfg.fraction * available))
        k = min(max(k, cfg.min_updates), available)
        sampled = devices.sample(k, [cfg.seed & 0xFFFFFFFF, r, 0x5A])
        return RoundPlan(sampled, cfg.round_timeout, cfg.min_updates)

    def aggregate_round(
        self,
        r: int,
        cfg: FLConfig,
        global_state: StateDict,
        updates: Sequence[Update],
        stale: Sequence[Update],
        params: Collection[str],
    ) -> StateDict:
        """The model after round ``r``, which met its quorum, from its ``updates`` and the
        ``stale`` ones of earlier rounds, weighted ``samples * (1 + age) ** -cfg.staleness``."""
        for u in stale:
            u.weight = u.samples * (1 + r - u.round) ** -cfg.staleness
        return self.aggregate(global_state, [*updates, *stale], params)

    def aggregate(
        self, global_state: StateDict, updates: Sequence[Update], params: Collection[str]
    ) -> StateDict:
        """The next global model from ``global_state`` and at least one update. ``params``
        names the trainable parameters (the other float entries are buffers)."""
        return {k: self._mean_entry(k, g, updates) for k, g in global_state.items()}

    def state(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        """JSON-able settings and counters, and arrays (a server optimizer's moments)."""
        return {}, {}

    def load_state(self, meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
        """Take back what :meth:`state` gave."""

    def _weights(self, updates: Sequence[Update], name: str) -> np.ndarray:
        w = np.array([u.weight for u in updates], np.float64)
        if self.loss_aware:
            w *= np.array([1.0 - u.loss.get(name, 0.0) for u in updates])
        return w

    def mean_delta(self, name: str, updates: Sequence[Update]) -> np.ndarray | None:
        """The weighted mean of the updates' ``name`` (float64), None if nothing arrived."""
        w = self._weights(updates, name)
        total = w.sum()
        if total <= 0:
            return None
        acc = np.zeros(updates[0].delta[name].shape, np.float64)
        for wi, u in zip(w, updates, strict=True):
            if wi > 0:
                acc += (wi / total) * u.delta[name]
        return acc

    def _mean_entry(self, name: str, g: np.ndarray, updates: Sequence[Update]) -> np.ndarray:
        d = self.mean_delta(name, updates)
        if d is None:
            return g
        if g.dtype.kind == "f":
            return (g + d).astype(g.dtype)
        return np.rint(d).astype(g.dtype)  # counters: the weighted mean of the values


class FedAvg(Strategy):
    """The weighted mean of the updates (see the module's text)."""


class FedProx(Strategy):
    """FedAvg on the server; the devices train with the proximal term (``FLConfig.mu``)."""

    name = "fedprox"


class FedAdam(Strategy):
    """Adam on the server over the pseudo-gradient (the weighted mean update):
    ``m = b1 m + (1 - b1) d``, ``v = b2 v + (1 - b2) d^2``, ``x += lr m / (sqrt(v) + tau)``
    (no bias correction, as in Reddi et al.; ``v`` starts at ``tau^2``)."""

    name = "fedadam"

    def __init__(
        self,
        lr: float = 0.01,
        beta1: float = 0.9,
        beta2: float = 0.99,
        tau: float = 1e-3,
        loss_aware: bool = True,
    ) -> None:
        super().__init__(loss_aware)
        self.lr, self.beta1, self.beta2, self.tau = lr, beta1, beta2, tau
        self.m: dict[str, np.ndarray] = {}
        self.v: dict[str, np.ndarray] = {}
        self.steps = 0

    def _second_moment(self, v: np.ndarray, d2: np.ndarray) -> np.ndarray:
        return self.beta2 * v + (1 - self.beta2) * d2

    def aggregate(
        self, global_state: StateDict, updates: Sequence[Update], params: Collection[str]
    ) -> StateDict:
        out: StateDict = {}
        for k, g in global_state.items():
            if g.dtype.kind != "f" or (params and k not in params):
                out[k] = self._mean_entry(k, g, updates)
                continue
            d = self.mean_delta(k, updates)
            if d is None:
                out[k] = g
                continue
            m = self.m.get(k, np.zeros(g.shape, np.float64))
            v = self.v.get(k, np.full(g.shape, self.tau**2, np.float64))
            m = self.beta1 * m + (1 - self.beta1) * d
            v = self._second_moment(v, d * d)
            self.m[k], self.v[k] = m, v
            out[k] = (g + self.lr * m / (np.sqrt(v) + self.tau)).astype(g.dtype)
        self.steps += 1
        return out

    def state(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        arrays = {f"m/{k}": a for k, a in self.m.items()} | {f"v/{k}": a for k, a in self.v.items()}
        return {"steps": self.steps}, arrays

    def load_state(self, meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
        self.steps = int(meta.get("steps", 0))
        self.m = {k[2:]: a for k, a in arrays.items() if k.startswith("m/")}
        self.v = {k[2:]: a for k, a in arrays.items() if k.startswith("v/")}


class FedYogi(FedAdam):
    """FedAdam with Yogi's second moment: ``v -= (1 - b2) d^2 sign(v - d^2)``."""

    name = "fedyogi"

    def _second_moment(self, v: np.ndarray, d2: np.ndarray) -> np.ndarray:
        return v - (1 - self.beta2) * d2 * np.sign(v - d2)


class Median(Strategy):
    """The coordinate-wise median of the updates (unweighted)."""

    name = "median"

    def _robust(self, stack: np.ndarray) -> np.ndarray:
        return np.median(stack, axis=0)

    def aggregate(
        self, global_state: StateDict, updates: Sequence[Update], params: Collection[str]
    ) -> StateDict:
        out: StateDict = {}
        for k, g in global_state.items():
            whole = [u.delta[k] for u in updates if u.loss.get(k, 0.0) == 0.0]
            if not whole:
                out[k] = g
                continue
            value = self._robust(np.stack(whole))
            out[k] = (
                (g + value).astype(g.dtype)
                if g.dtype.kind == "f"
                else np.rint(value).astype(g.dtype)
            )
        return out


class TrimmedMean(Median):
    """The coordinate-wise mean after cutting ``trim`` of the updates at each end."""

    name = "trimmed-mean"

    def __init__(self, trim: float = 0.1) -> None:
        super().__init__()
        self.trim = trim

    def _robust(self, stack: np.ndarray) -> np.ndarray:
        n = len(stack)
        k = min(int(self.trim * n), (n - 1) // 2)
        ordered = np.sort(stack, axis=0)
        return ordered[k : n - k].astype(np.float64).mean(axis=0)


def model_update(local: StateDict, global_state: StateDict) -> StateDict:
    """What a device sends: ``local - global`` for float entries, integer entries as they are."""
    return {
        k: (local[k] - global_state[k]) if local[k].dtype.kind == "f" else local[k] for k in local
    }


def make_strategy(cfg: FLConfig) -> Strategy:
    """The strategy ``cfg.strategy`` names, with its settings."""
    if cfg.strategy in ("fedadam", "fedyogi"):
        cls = FedAdam if cfg.strategy == "fedadam" else FedYogi
        return cls(cfg.server_lr, cfg.beta1, cfg.beta2, cfg.tau, cfg.loss_aware)
    if cfg.strategy == "median":
        return Median()
    if cfg.strategy == "trimmed-mean":
        return TrimmedMean(cfg.trim)
    return (FedProx if cfg.strategy == "fedprox" else FedAvg)(cfg.loss_aware)
