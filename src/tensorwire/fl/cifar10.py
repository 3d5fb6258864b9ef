"""Reading CIFAR-10 from disk: the binary batches, or the python batches without trusting them.

The python batches are pickles. They are read with an unpickler that builds only plain
containers, bytes, numbers and numpy arrays, and refuses every other global, so a tampered
file cannot run code. Nothing pickled is ever written or sent by tensorwire.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np

from tensorwire.errors import TensorwireError

_PY, _BIN = "cifar-10-batches-py", "cifar-10-batches-bin"
_ALLOWED_GLOBALS = {
    ("numpy.core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "_reconstruct"),
    ("numpy", "ndarray"),
    ("numpy", "dtype"),
}


class BadDataFile(TensorwireError, ValueError):
    """A data file is not what its name says."""


class _ArraysOnlyUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> object:
        if (module, name) in _ALLOWED_GLOBALS:
            return super().find_class(module, name)
        raise BadDataFile(f"refusing {module}.{name} in a CIFAR-10 batch: only arrays are expected")


def find_cifar10(root: Path) -> Path | None:
    """The CIFAR-10 folder in or at ``root`` (either version), or None."""
    for candidate in (root, root / _PY, root / _BIN, root / "cifar10" / _PY):
        if (candidate / "data_batch_1").is_file() or (candidate / "data_batch_1.bin").is_file():
            return candidate
    return None


def _read_py_batch(path: Path) -> tuple[np.ndarray, np.ndarray]:
    with path.open("rb") as f:
        batch = _ArraysOnlyUnpickler(f, encoding="bytes").load()
    data = np.asarray(batch[b"data"], dtype=np.uint8).reshape(-1, 3, 32, 32)
    labels = np.asarray(batch[b"labels"], dtype=np.int64)
    return data, labels


def _read_bin_batch(path: Path) -> tuple[np.ndarray, np.ndarray]:
    raw = np.fromfile(path, dtype=np.uint8)
    if raw.size % 3073:
        raise BadDataFile(f"{path} is not a CIFAR-10 binary batch (size {raw.size} % 3073 != 0)")
    rows = raw.reshape(-1, 3073)
    return rows[:, 1:].reshape(-1, 3, 32, 32), rows[:, 0].astype(np.int64)


def read_cifar10(
    folder: Path,
) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """``((train_x, train_y), (test_x, test_y))`` as uint8 (N, 3, 32, 32) and int64 labels."""
    binary = (folder / "data_batch_1.bin").is_file()
    read, suffix = (_read_bin_batch, ".bin") if binary else (_read_py_batch, "")
    train = [read(folder / f"data_batch_{i}{suffix}") for i in range(1, 6)]
    test = read(folder / f"test_batch{suffix}")
    train_x = np.concatenate([b[0] for b in train])
    train_y = np.concatenate([b[1] for b in train])
    return (train_x, train_y), test
