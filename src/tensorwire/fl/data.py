"""Data sets for the FL runtime, all as 3x32x32 float32 images, and how they are split.

- ``digits``: scikit-learn's handwritten digits (1,797 real 8x8 images, shipped with the
  package, so it works offline), upsampled to 32x32 and repeated over 3 channels: the default.
- ``cifar10``: read from a local directory (``cifar-10-batches-py``, as torchvision lays it
  out, or ``cifar-10-batches-bin``); tensorwire never downloads anything.
- ``synthetic``: class-conditional noise, for tests and runs of many devices (at least
  :data:`SYNTHETIC_PER_DEVICE` training samples per device).

A process loads a data set once for all the devices it holds (:func:`load_dataset` keeps the
last few): treat what it returns as read-only.
"""

from __future__ import annotations

import functools
import os
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tensorwire.errors import TensorwireError

DATASETS = ("digits", "cifar10", "synthetic")
SPLITS = ("equal", "iid", "dirichlet")
SYNTHETIC_TRAIN = 400  # the synthetic data set's training samples, for up to 50 devices
SYNTHETIC_PER_DEVICE = 8  # ... and at least this many per device beyond that
_LOADING = threading.Lock()  # one load at a time: a thousand devices must not load it each


class DataNotFound(TensorwireError, FileNotFoundError):
    """A data set that must be on disk is not where it was looked for."""


@dataclass
class Dataset:
    """Images (N, 3, 32, 32) float32, normalised; labels (N,) int64."""

    name: str
    train_x: np.ndarray
    train_y: np.ndarray
    test_x: np.ndarray
    test_y: np.ndarray
    num_classes: int = 10


def default_data_root() -> Path:
    """``$TENSORWIRE_DATA``, else ``~/.cache/tensorwire/data``."""
    return Path(os.environ.get("TENSORWIRE_DATA", Path.home() / ".cache" / "tensorwire" / "data"))


def _normalise(train: np.ndarray, test: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    mean = train.mean(axis=(0, 2, 3), keepdims=True)
    std = train.std(axis=(0, 2, 3), keepdims=True) + 1e-6
    return ((train - mean) / std).astype(np.float32), ((test - mean) / std).astype(np.float32)


def load_digits_dataset(seed: int = 0, test_fraction: float = 0.2) -> Dataset:
    """scikit-learn's digits, 8x8 -> 3x32x32 (bilinear), stratified train/test split."""
    import torch
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    images = torch.from_numpy(digits.images.astype(np.float32) / 16.0).unsqueeze(1)
    big = torch.nn.functional.interpolate(
        images, size=(32, 32), mode="bilinear", align_corners=False
    )
    x = big.repeat(1, 3, 1, 1).numpy()
    y = digits.target.astype(np.int64)
    tr_x, te_x, tr_y, te_y = train_test_split(
        x, y, test_size=test_fraction, random_state=seed, stratify=y
    )
    tr_x, te_x = _normalise(tr_x, te_x)
    return Dataset("digits", tr_x, tr_y, te_x, te_y)


def load_synthetic_dataset(n_train: int = 400, n_test: int = 200, seed: int = 0) -> Dataset:
    """Ten classes, each a fixed random 3x32x32 pattern plus noise: learnable in a round."""
    rng = np.random.default_rng(seed)
    patterns = rng.standard_normal((10, 3, 32, 32)).astype(np.float32)

    def make(n: int) -> tuple[np.ndarray, np.ndarray]:
        y = rng.integers(0, 10, n)
        x = patterns[y] + 0.8 * rng.standard_normal((n, 3, 32, 32)).astype(np.float32)
        return x.astype(np.float32), y.astype(np.int64)

    tr_x, tr_y = make(n_train)
    te_x, te_y = make(n_test)
    return Dataset("synthetic", tr_x, tr_y, te_x, te_y)


def load_cifar10_dataset(root: str | Path | None = None) -> Dataset:
    """CIFAR-10 from ``root`` (python or binary batches); ``DataNotFound`` says where to put it."""
    from tensorwire.fl.cifar10 import find_cifar10, read_cifar10

    root = Path(root) if root is not None else default_data_root()
    folder = find_cifar10(root)
    if folder is None:
        raise DataNotFound(
            f"CIFAR-10 is not in {root}: put the python version (a folder cifar-10-batches-py "
            "with data_batch_1..5 and test_batch, as torchvision keeps it) or the binary version "
            "(cifar-10-batches-bin) there, or pass --data-root / set TENSORWIRE_DATA. "
            "tensorwire never downloads data; the offline default is --dataset digits."
        )
    (tr_x, tr_y), (te_x, te_y) = read_cifar10(folder)
    tr, te = _normalise(tr_x.astype(np.float32) / 255.0, te_x.astype(np.float32) / 255.0)
    return Dataset("cifar10", tr, tr_y, te, te_y)


def load_dataset(
    name: str, *, root: str | Path | None = None, seed: int = 0, clients: int = 1
) -> Dataset:
    """One of :data:`DATASETS` (``clients``: how many devices share it; the synthetic one
    grows to give each at least :data:`SYNTHETIC_PER_DEVICE` samples). The same arguments
    give the same object, loaded once per process."""
    with _LOADING:
        return _load(name, None if root is None else str(root), seed, clients)


@functools.lru_cache(maxsize=4)
def _load(name: str, root: str | None, seed: int, clients: int) -> Dataset:
    if name == "digits":
        return load_digits_dataset(seed)
    if name == "synthetic":
        n_train = max(SYNTHETIC_TRAIN, SYNTHETIC_PER_DEVICE * clients)
        return load_synthetic_dataset(n_train=n_train, seed=seed)
    if name == "cifar10":
        return load_cifar10_dataset(root)
    raise ValueError(f"unknown dataset {name!r}; choose one of {', '.join(DATASETS)}")


def split_indices(
    labels: np.ndarray,
    num_clients: int,
    method: str = "equal",
    *,
    alpha: float = 0.5,
    seed: int = 0,
) -> list[np.ndarray]:
    """Indices of each client's shard.

    ``equal``: FedComm's equal contiguous shards, in data order; ``iid``: the same after a
    shuffle; ``dirichlet``: non-IID, each class's samples divided by Dirichlet(``alpha``)
    proportions (smaller alpha, more skew). Every sample goes to exactly one client.
    """
    n = len(labels)
    if num_clients < 1 or num_clients > n:
        raise ValueError(f"cannot split {n} samples among {num_clients} clients")
    rng = np.random.default_rng(seed)
    if method == "equal":
        return [np.asarray(s) for s in np.array_split(np.arange(n), num_clients)]
    if method == "iid":
        return [np.sort(s) for s in np.array_split(rng.permutation(n), num_clients)]
    if method == "dirichlet":
        if alpha <= 0:
            raise ValueError("dirichlet alpha must be positive")
        shards: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
        for c in np.unique(labels):
            idx = rng.permutation(np.flatnonzero(labels == c))
            cuts = (np.cumsum(rng.dirichlet([alpha] * num_clients))[:-1] * len(idx)).astype(int)
            for shard, part in zip(shards, np.split(idx, cuts), strict=True):
                shard.append(part)
        return [np.sort(np.concatenate(s)) for s in shards]
    raise ValueError(f"unknown split {method!r}; choose one of {', '.join(SPLITS)}")
