"""The array an operation works in, and how its result reaches the caller's tensor.

Operations take numpy arrays and torch CPU tensors (torch is never imported here: a torch
tensor is viewed through numpy, sharing its memory). An operation works in place on one
flat, contiguous, writeable array: the caller's own when it is one, else a copy that is
written back at the end.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tensorwire.wire.tensors import to_numpy


def as_array(x: Any, what: str) -> np.ndarray:
    """A numpy view of a numpy array or torch CPU tensor."""
    device = getattr(x, "device", None)
    if not isinstance(x, np.ndarray) and getattr(device, "type", "cpu") != "cpu":
        raise TypeError(f"{what} is on {device}: collectives take CPU tensors (for now)")
    try:
        return to_numpy(x, (what,))
    except TypeError:
        raise TypeError(
            f"{what} is a {type(x).__name__}: collectives take numpy arrays and torch tensors"
        ) from None


class WorkArray:
    """``flat``: the 1-D array an operation writes its result into; :meth:`result` puts it
    in ``target`` (the caller's array) when ``flat`` is not a view of it."""

    def __init__(self, target: Any, what: str) -> None:
        self.target = target
        self.array = as_array(target, what)
        arr = self.array
        if not arr.flags.writeable:
            raise ValueError(f"{what} is read-only: the result is written into it")
        self._direct = arr.flags.c_contiguous and arr.flags.writeable
        self.flat = arr.reshape(-1) if self._direct else np.ascontiguousarray(arr).reshape(-1)

    def result(self) -> Any:
        """The caller's tensor, holding the result."""
        if not self._direct:
            self.array[...] = self.flat.reshape(self.array.shape)
        return self.target
