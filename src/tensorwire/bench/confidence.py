"""Means over repetitions with the half-widths of their 95 % confidence intervals (Student's t)."""

from __future__ import annotations

import numpy as np
import pandas as pd

_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228)
"""Student's t, two-sided 95 %, for 1..10 degrees of freedom (then :func:`t95` interpolates)."""


def t95(n: int) -> float:
    """Student's t quantile for a two-sided 95 % interval of a mean of ``n`` >= 2 values."""
    df = n - 1
    if df <= len(_T975):
        return _T975[df - 1]
    return 1.960 + 2.4 / df  # within 0.5 % of the exact quantile above 10 degrees of freedom


def _experiment_means(rows: pd.DataFrame, by: list[str], values: list[str]) -> pd.DataFrame:
    """Each experiment's mean of ``values`` over its rounds, per ``by``: rounds that differ by
    design (a delta downlink's first, full model) are not repetitions."""
    experiment = [c for c in ("run", "key") if c in rows and c not in by]
    return rows.groupby(by + experiment, sort=False)[values].mean().reset_index()


def mean_ci(rows: pd.DataFrame, by: list[str], value: str) -> pd.DataFrame:
    """Per ``by``: the mean of ``value`` over repetitions (``value``), the half-width of its
    95 % confidence interval (``value_ci``; NaN with fewer than two repetitions) and the
    number of repetitions (``value_n``). With ``by`` holding ``round``, per round."""
    each = _experiment_means(rows, by, [value]) if "round" not in by else rows
    stats = each.groupby(by, sort=False)[value].agg(["mean", "std", "count"]).reset_index()
    half = [
        t95(int(n)) * s / np.sqrt(n) if n >= 2 and pd.notna(s) else np.nan
        for s, n in zip(stats["std"], stats["count"], strict=True)
    ]
    return stats.assign(**{f"{value}_ci": half}).rename(
        columns={"mean": value, "count": f"{value}_n"}
    )[[*by, value, f"{value}_ci", f"{value}_n"]]
