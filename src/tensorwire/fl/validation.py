"""Checking an update before it is aggregated: what it claims, what it holds, its size.

An update must carry exactly the global model's entries with their shapes and dtypes, only
finite numbers, and a sample count from 1 to what the run allows the device (its shard's
size for a built-in data set, else ``FLConfig.max_samples``). Any other update is rejected
with the reason, which the device is told. ``clip_norm`` then scales an update whose L2
norm (over its float entries) is larger down to it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from tensorwire.fl.errors import UpdateRejected
from tensorwire.fl.train import StateDict

UPDATE = "update"  # the name an update's tensors travel under: {"update": {entry: delta}}
_SHOWN = 5  # entries named in a reason


@dataclass(frozen=True)
class Checked:
    """A valid update: its entries (copies), sample count, L2 norm before clipping, and the
    fraction of each entry that did not arrive."""

    delta: StateDict
    samples: int
    norm: float
    loss: dict[str, float]


def _names(names: list[str]) -> str:
    more = f" (and {len(names) - _SHOWN} more)" if len(names) > _SHOWN else ""
    return ", ".join(repr(n) for n in names[:_SHOWN]) + more


def check_update(
    tensors: Mapping[str, Any],
    meta: Mapping[str, Any],
    model: StateDict,
    *,
    max_samples: int,
    clip_norm: float | None = None,
    loss: Mapping[str, float] | None = None,
) -> Checked:
    """Check an update message's ``tensors`` and ``meta`` against the global ``model``;
    :class:`UpdateRejected` says the first check it fails. ``loss`` is the transport's
    report (``Message.loss``: wire path -> fraction lost)."""
    samples = meta.get("samples")
    if isinstance(samples, bool) or not isinstance(samples, int):
        raise UpdateRejected(f"samples must be an integer, got {type(samples).__name__}")
    if not 1 <= samples <= max_samples:
        raise UpdateRejected(
            f"samples {samples} is outside 1..{max_samples}, what this run allows the device"
        )
    if set(tensors) != {UPDATE} or not isinstance(tensors[UPDATE], Mapping):
        raise UpdateRejected(f"an update holds one mapping {UPDATE!r}, got {_names(list(tensors))}")
    entries = tensors[UPDATE]
    missing = [k for k in model if k not in entries]
    extra = [str(k) for k in entries if k not in model]
    if missing or extra:
        parts = ([f"missing {_names(missing)}"] if missing else []) + (
            [f"unexpected {_names(extra)}"] if extra else []
        )
        raise UpdateRejected(f"entries do not match the model: {'; '.join(parts)}")
    out: StateDict = {}
    squares = 0.0
    for k, g in model.items():
        a = entries[k]
        if not isinstance(a, np.ndarray) or a.dtype != g.dtype or a.shape != g.shape:
            got = f"{a.dtype}{list(a.shape)}" if isinstance(a, np.ndarray) else type(a).__name__
            raise UpdateRejected(f"{k!r} is {got}, the model's is {g.dtype}{list(g.shape)}")
        if a.dtype.kind == "f":
            if not np.isfinite(a).all():
                raise UpdateRejected(f"{k!r} holds NaN or infinite values")
            squares += float(np.square(a, dtype=np.float64).sum())
        out[k] = np.array(a, copy=True)  # a transport may decode its next message into `a`
    norm = float(np.sqrt(squares))
    if clip_norm is not None and norm > clip_norm:
        scale = clip_norm / norm
        for a in out.values():
            if a.dtype.kind == "f":
                a *= a.dtype.type(scale)
    lost = {}
    for path, fraction in (loss or {}).items():
        name = path.removeprefix(f"{UPDATE}/")
        if name in out and isinstance(fraction, float) and 0.0 < fraction <= 1.0:
            lost[name] = fraction
    return Checked(out, samples, norm, lost)
