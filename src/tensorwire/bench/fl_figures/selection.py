"""Picking and naming the rows of the per-round table a figure draws: the baseline of the
settings it does not vary, the combinations it has a panel for, the captions' notes."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from tensorwire.fl.config import payload_bytes
from tensorwire.testbed.profile import as_profile


def in_order(values: pd.Series) -> list:
    return list(dict.fromkeys(values.tolist()))


def base_rows(frame: pd.DataFrame, keep: set[str]) -> pd.DataFrame:
    """``frame`` narrowed to the baseline of every setting not in ``keep``: no stress, the
    lowest loss, no uplink compression (else the first codec), the first profile and model."""
    rows = frame
    for dim in ("stress", "loss", "codec", "profile", "model"):
        if dim in keep or dim not in rows or rows.empty:
            continue
        values = in_order(rows[dim])
        if dim == "loss":
            base = min(values)
        elif dim in ("stress", "codec") and "none" in values:
            base = "none"
        else:
            base = values[0]
        rows = rows[rows[dim] == base]
    return rows


def reps_note(rows: pd.DataFrame) -> str:
    """The caption's sentence on error bars, from the repetitions each setting of ``rows`` has."""
    dims = [
        c
        for c in ("run", "protocol", "model", "profile", "loss", "stress", "codec", "epochs")
        if c in rows
    ]
    if rows.empty or "rep" not in rows:
        return ""
    reps = rows.groupby(dims, sort=False)["rep"].nunique()
    low, high = int(reps.min()), int(reps.max())
    if high < 2:
        return "One repetition per setting, so no error bars."
    span = f"{low}" if low == high else f"{low} to {high}"
    note = f"Error bars: 95 % confidence interval of the mean over {span} repetitions"
    return note + (" (none where a setting has one)." if low < 2 else ".")


def combinations_of(rows: pd.DataFrame, dims: list[str]) -> list[tuple]:
    return list(dict.fromkeys(map(tuple, rows[dims].itertuples(index=False))))


def rows_where(rows: pd.DataFrame, dims: list[str], values: tuple) -> pd.DataFrame:
    mask = np.ones(len(rows), bool)
    for dim, value in zip(dims, values, strict=True):
        mask &= (rows[dim] == value).to_numpy()
    return rows[mask]


def title_of(values: tuple) -> str:
    return ", ".join(map(str, values))


def model_note(rows: pd.DataFrame) -> str:
    models = in_order(rows["model"])
    return f" Model: {models[0]}." if len(models) == 1 else ""


def is_payload(model: Any) -> bool:
    """Whether ``model`` names synthetic updates (``payload:10MB``), which learn nothing."""
    try:
        return payload_bytes(str(model)) is not None
    except ValueError:
        return False


def with_setting(rows: pd.DataFrame) -> pd.DataFrame:
    return rows.assign(
        setting=rows["series"].astype(str)
        + np.where(rows["codec"] == "none", "", ", " + rows["codec"].astype(str))
    )


def rate_of(profile: Any) -> float:
    """A profile's rate in bits/s, to put the slowest first (unshaped or unknown: last)."""
    try:
        rate = as_profile(str(profile)).rate
    except ValueError:
        return float("inf")
    return float(rate) if rate is not None else float("inf")
