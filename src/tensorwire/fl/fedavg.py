"""Federated averaging of numpy state dicts, weighted by each client's sample count."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

StateDict = dict[str, np.ndarray]


def fedavg(states: Sequence[StateDict], weights: Sequence[float]) -> StateDict:
    """Weighted mean of every entry (parameters and BatchNorm running statistics).

    Accumulates in float64. Integer entries (BatchNorm's ``num_batches_tracked`` counter) get
    the weighted mean rounded to the nearest integer, so the counter stays a count.
    """
    if not states or len(states) != len(weights):
        raise ValueError("fedavg needs one weight per state, and at least one state")
    w = np.asarray(weights, dtype=np.float64)
    if (w < 0).any() or w.sum() <= 0:
        raise ValueError(f"weights must be non-negative with a positive sum, got {list(weights)}")
    w = w / w.sum()
    keys = list(states[0])
    for s in states[1:]:
        if list(s) != keys:
            raise ValueError("states hold different entries; all clients must train the same model")
    out: StateDict = {}
    for k in keys:
        acc = sum(wi * s[k].astype(np.float64) for wi, s in zip(w, states, strict=True))
        dtype = states[0][k].dtype
        out[k] = np.rint(acc).astype(dtype) if dtype.kind in "iub" else acc.astype(dtype)
    return out


def apply_update(global_state: StateDict, update: StateDict) -> StateDict:
    """``global + update`` for float entries; integer entries (counters) are taken as sent."""
    return {
        k: (global_state[k] + update[k]).astype(global_state[k].dtype)
        if global_state[k].dtype.kind == "f"
        else update[k]
        for k in global_state
    }


def model_update(local: StateDict, global_state: StateDict) -> StateDict:
    """What a client sends: ``local - global`` for float entries, integer entries as they are."""
    return {
        k: (local[k] - global_state[k]) if local[k].dtype.kind == "f" else local[k] for k in local
    }
