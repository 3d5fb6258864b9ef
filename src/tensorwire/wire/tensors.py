"""Adapters between user tensors (numpy, torch) and the numpy arrays the wire format encodes.

torch is never imported here unless the caller hands us a torch tensor or asks for one.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, Literal

import ml_dtypes
import numpy as np

TensorPath = tuple[str, ...]

Order = Literal["C", "F"]
"""A tensor's memory order on the wire: row-major ("C") or column-major ("F")."""


def _is_torch_tensor(obj: object) -> bool:
    return type(obj).__module__.startswith("torch") and hasattr(obj, "detach")


def to_numpy(obj: Any, path: TensorPath = ()) -> np.ndarray:
    """Return a numpy view of a numpy array, numpy scalar or CPU/GPU torch tensor."""
    if isinstance(obj, np.ndarray):
        return obj
    if isinstance(obj, np.generic):
        return np.asarray(obj)
    if _is_torch_tensor(obj):
        import torch

        t = obj.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        if t.dtype == torch.bfloat16:
            # numpy has no bfloat16: reinterpret the bits as ml_dtypes' bfloat16, no copy.
            return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
        return t.numpy()
    where = "/".join(path) or "<root>"
    raise TypeError(
        f"tensor {where!r} is a {type(obj).__name__}; a message carries numpy arrays and "
        "torch tensors (put scalars and strings in meta=)"
    )


def to_torch(arr: np.ndarray) -> Any:
    """Return a torch tensor sharing memory with ``arr`` where torch allows it."""
    import torch

    if not arr.flags.writeable:
        arr = arr.copy()  # torch.from_numpy refuses read-only memory
    if arr.dtype == np.dtype(ml_dtypes.bfloat16):
        return torch.from_numpy(arr.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(arr)


def flatten(
    tensors: Mapping[str, Any], prefix: TensorPath = ()
) -> Iterator[tuple[TensorPath, Any]]:
    """Yield ``(path, leaf)`` for every leaf of a nested mapping of names to tensors."""
    if type(tensors) is not dict and not isinstance(tensors, Mapping):
        raise TypeError(
            f"tensors must be a mapping of names to tensors, not {type(tensors).__name__}"
        )
    for key, value in tensors.items():
        if not isinstance(key, str) or not key:  # the decoder rejects empty names
            raise TypeError(
                f"tensor names must be non-empty str, got {key!r} in {'/'.join(prefix) or '<root>'}"
            )
        path = (*prefix, key)
        # An array is no mapping: say so before the (slower) abstract-class check.
        if type(value) is not np.ndarray and isinstance(value, Mapping):
            yield from flatten(value, path)
        else:
            yield path, value


def unflatten(
    items: Iterator[tuple[TensorPath, Any]] | list[tuple[TensorPath, Any]],
) -> dict[str, Any]:
    """Rebuild the nested dict that :func:`flatten` walked; paths must not collide."""
    root: dict[str, Any] = {}
    for path, value in items:
        node = root
        for key in path[:-1]:
            node = node.setdefault(key, {})
            if not isinstance(node, dict):
                raise ValueError(f"path {'/'.join(path)!r} runs through a tensor")
        if path[-1] in node:
            raise ValueError(f"path {'/'.join(path)!r} appears twice")
        node[path[-1]] = value
    return root


def map_leaves(tree: dict[str, Any], fn: Any) -> dict[str, Any]:
    """Return a copy of a nested dict with ``fn`` applied to every leaf."""
    return {k: map_leaves(v, fn) if isinstance(v, dict) else fn(v) for k, v in tree.items()}
