"""Local training and evaluation (PyTorch, CPU); models travel as numpy state dicts.

Data is numpy arrays ``(x, y)`` (the built-in data sets: shuffled by index, the fast path),
a ``torch.utils.data.Dataset`` (batched and shuffled here, with this round's seed) or a
``DataLoader`` (used as given). A device's randomness in a round comes from
:func:`round_seed` of (run seed, device, round) alone, so a restarted device trains a round
exactly as it did before.
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from tensorwire.fl.errors import FLError

StateDict = dict[str, np.ndarray]
LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def state_to_numpy(model: nn.Module) -> StateDict:
    """A copy of the model's state (parameters and buffers) as numpy arrays."""
    return {k: v.detach().cpu().numpy().copy() for k, v in model.state_dict().items()}


def load_numpy_state(model: nn.Module, state: StateDict) -> None:
    """Load numpy arrays (any nesting flattened by name) into the model."""
    model.load_state_dict({k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in state.items()})


def round_seed(seed: int, client_id: str, round_: int) -> int:
    """The seed of ``client_id``'s training in ``round_`` of a run seeded ``seed``."""
    words = [seed & 0xFFFFFFFF, zlib.crc32(client_id.encode()), round_ & 0xFFFFFFFF]
    return int(np.random.SeedSequence(words).generate_state(1)[0])


@dataclass
class ArrayData:
    """Samples as arrays: ``x`` (N, ...) float32 and ``y`` (N,) int64."""

    x: np.ndarray
    y: np.ndarray

    def __len__(self) -> int:
        return len(self.x)


TrainingData = ArrayData | Dataset | DataLoader


def as_data(data: Any, what: str = "data") -> TrainingData:
    """``data`` as :class:`ArrayData` (from a pair of arrays or tensors), a Dataset or a
    DataLoader; :class:`FLError` names what else was given."""
    if isinstance(data, ArrayData | DataLoader):
        return data
    if isinstance(data, tuple | list) and len(data) == 2:
        x, y = (v.detach().cpu().numpy() if isinstance(v, torch.Tensor) else v for v in data)
        if isinstance(x, np.ndarray) and isinstance(y, np.ndarray) and len(x) == len(y):
            return ArrayData(x, y)
        raise FLError(f"{what}: a pair (x, y) must be two arrays of the same length")
    if isinstance(data, Dataset) or (hasattr(data, "__getitem__") and hasattr(data, "__len__")):
        return data
    raise FLError(
        f"{what}: expected a torch Dataset, a DataLoader or a pair of arrays (x, y), "
        f"got {type(data).__name__}"
    )


def sample_count(data: TrainingData) -> int:
    """How many samples one epoch over ``data`` sees (a DataLoader's dataset's length)."""
    if isinstance(data, DataLoader):
        try:
            return len(data.dataset)  # type: ignore[arg-type]
        except TypeError:
            return sum(len(batch[1]) for batch in data)
    return len(data)  # type: ignore[arg-type]


@dataclass
class TrainResult:
    loss: float  # mean training loss over the local epochs
    seconds: float
    samples: int


def _has_batchnorm(model: nn.Module) -> bool:
    return any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())


def _batches(
    data: TrainingData, batch_size: int, gen: torch.Generator
) -> Iterator[tuple[Any, Any]]:
    """One epoch of ``(inputs, targets)`` batches, shuffled with ``gen`` unless a DataLoader."""
    if isinstance(data, ArrayData):
        xs, ys = torch.from_numpy(data.x), torch.from_numpy(data.y)
        order = torch.randperm(len(xs), generator=gen)
        for i in range(0, len(xs), batch_size):
            idx = order[i : i + batch_size]
            yield xs[idx], ys[idx]
        return
    loader = (
        data
        if isinstance(data, DataLoader)
        else DataLoader(data, batch_size=batch_size, shuffle=True, generator=gen)
    )
    for batch in loader:
        yield batch[0], batch[1]


def train_model(
    model: nn.Module,
    data: TrainingData,
    *,
    epochs: int = 1,
    batch_size: int = 100,
    lr: float = 0.01,
    momentum: float = 0.9,
    seed: int = 0,
    mu: float = 0.0,
    loss_fn: LossFn | None = None,
) -> TrainResult:
    """``epochs`` of SGD with momentum over ``data``, shuffled by ``seed``.

    ``mu`` > 0 adds FedProx's proximal term ``mu / 2 * |w - w_start|^2`` (``w_start``: the
    weights the round started from, the global model). ``loss_fn`` defaults to cross-entropy.
    A batch of one sample is skipped for a model with BatchNorm (it needs two).
    """
    start = time.perf_counter()
    torch.manual_seed(seed)  # the model's own randomness (dropout ...) in this round
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    loss_fn = loss_fn or nn.CrossEntropyLoss()
    anchors = [p.detach().clone() for p in model.parameters()] if mu > 0 else []
    min_batch = 2 if _has_batchnorm(model) else 1
    gen = torch.Generator().manual_seed(seed)
    total, count = 0.0, 0
    for _ in range(epochs):
        for xb, yb in _batches(data, batch_size, gen):
            if len(xb) < min_batch:
                continue
            opt.zero_grad()
            loss = loss_fn(model(xb), yb)
            objective = loss
            if anchors:
                prox = sum(
                    (p - a).pow(2).sum() for p, a in zip(model.parameters(), anchors, strict=True)
                )
                objective = loss + 0.5 * mu * prox
            objective.backward()
            opt.step()
            total += loss.item() * len(xb)
            count += len(xb)
    return TrainResult(total / max(count, 1), time.perf_counter() - start, sample_count(data))


def train_local(
    model: nn.Module,
    x: np.ndarray,
    y: np.ndarray,
    *,
    epochs: int = 1,
    batch_size: int = 100,
    lr: float = 0.01,
    momentum: float = 0.9,
    seed: int = 0,
    mu: float = 0.0,
) -> TrainResult:
    """FedComm's local update: ``epochs`` of SGD with momentum over the shuffled arrays."""
    return train_model(
        model,
        ArrayData(x, y),
        epochs=epochs,
        batch_size=batch_size,
        lr=lr,
        momentum=momentum,
        seed=seed,
        mu=mu,
    )


def _eval_batches(data: TrainingData, batch_size: int) -> Iterable[tuple[Any, Any]]:
    if isinstance(data, ArrayData):
        for i in range(0, len(data.x), batch_size):
            yield (
                torch.from_numpy(data.x[i : i + batch_size]),
                torch.from_numpy(data.y[i : i + batch_size]),
            )
        return
    loader = data if isinstance(data, DataLoader) else DataLoader(data, batch_size=batch_size)
    for batch in loader:
        yield batch[0], batch[1]


@torch.no_grad()
def evaluate_model(
    model: nn.Module, data: TrainingData, loss_fn: LossFn | None = None, batch_size: int = 500
) -> tuple[float, float]:
    """``(mean loss, accuracy)`` on ``data``; accuracy is NaN where the outputs are not one
    score per class (2-d) for integer targets."""
    model.eval()
    loss_fn = loss_fn or nn.CrossEntropyLoss()
    total, correct, count, classified = 0.0, 0, 0, True
    for xb, yb in _eval_batches(data, batch_size):
        out = model(xb)
        total += float(loss_fn(out, yb)) * len(xb)
        count += len(xb)
        if out.ndim == 2 and not torch.is_floating_point(yb):
            correct += int((out.argmax(1) == yb).sum())
        else:
            classified = False
    if count == 0:
        return float("nan"), float("nan")
    return total / count, (correct / count if classified else float("nan"))


def evaluate(
    model: nn.Module, x: np.ndarray, y: np.ndarray, batch_size: int = 500
) -> tuple[float, float]:
    """``(mean loss, accuracy)`` on a test set of arrays."""
    return evaluate_model(model, ArrayData(x, y), batch_size=batch_size)
