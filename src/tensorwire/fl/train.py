"""Local training and evaluation (PyTorch, CPU); models travel as numpy state dicts."""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

StateDict = dict[str, np.ndarray]


def state_to_numpy(model: nn.Module) -> StateDict:
    """A copy of the model's state (parameters and buffers) as numpy arrays."""
    return {k: v.detach().cpu().numpy().copy() for k, v in model.state_dict().items()}


def load_numpy_state(model: nn.Module, state: StateDict) -> None:
    """Load numpy arrays (any nesting flattened by name) into the model."""
    model.load_state_dict({k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in state.items()})


@dataclass
class TrainResult:
    loss: float  # mean training loss over the local epochs
    seconds: float
    samples: int


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
) -> TrainResult:
    """FedComm's local update: ``epochs`` of SGD with momentum over the shuffled shard."""
    start = time.perf_counter()
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    loss_fn = nn.CrossEntropyLoss()
    gen = torch.Generator().manual_seed(seed)
    xs, ys = torch.from_numpy(x), torch.from_numpy(y)
    total, count = 0.0, 0
    for _ in range(epochs):
        order = torch.randperm(len(xs), generator=gen)
        for i in range(0, len(xs), batch_size):
            idx = order[i : i + batch_size]
            if len(idx) < 2:  # BatchNorm needs two samples
                continue
            opt.zero_grad()
            loss = loss_fn(model(xs[idx]), ys[idx])
            loss.backward()
            opt.step()
            total += loss.item() * len(idx)
            count += len(idx)
    return TrainResult(total / max(count, 1), time.perf_counter() - start, len(xs))


@torch.no_grad()
def evaluate(
    model: nn.Module, x: np.ndarray, y: np.ndarray, batch_size: int = 500
) -> tuple[float, float]:
    """``(mean loss, accuracy)`` on a test set."""
    model.eval()
    loss_fn = nn.CrossEntropyLoss(reduction="sum")
    total, correct = 0.0, 0
    for i in range(0, len(x), batch_size):
        xb, yb = torch.from_numpy(x[i : i + batch_size]), torch.from_numpy(y[i : i + batch_size])
        out = model(xb)
        total += loss_fn(out, yb).item()
        correct += int((out.argmax(1) == yb).sum())
    return total / len(x), correct / len(x)
