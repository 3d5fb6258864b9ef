"""What goes on a panel: bars grouped per setting with their confidence intervals and lower
bound, and lines that stay apart where series coincide."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.axes import Axes

from tensorwire.bench.confidence import mean_ci
from tensorwire.bench.fl_figures.selection import in_order
from tensorwire.bench.fl_figures.styles import Style

DODGE = 0.04  # sideways shift between line series, a fraction of the x spacing


def grouped_bars(
    ax: Axes,
    rows: pd.DataFrame,
    group: str,
    series: str,
    value: str,
    style: Callable[[Any, Any], dict[str, Any]],
    bound: str | None = None,
    scale: float = 1.0,
) -> None:
    """Bars of ``value`` (mean over repetitions, times ``scale``) per ``group`` on the x axis,
    one per ``series`` side by side, drawn as ``style(group, series)`` says; a 95 % CI error
    bar where there are two or more repetitions; ``bound`` (mean) as a black bar across."""
    groups, names = in_order(rows[group]), in_order(rows[series])
    stats = mean_ci(rows, [group, series], value)
    if bound:
        stats = stats.merge(
            rows.groupby([group, series], sort=False)[bound].mean().reset_index(),
            on=[group, series],
        )
    width = 0.8 / len(names)
    for j, name in enumerate(names):
        part = stats[stats[series] == name].set_index(group).reindex(groups)
        x = np.arange(len(groups)) - 0.4 + width * (j + 0.5)
        for i, g in enumerate(groups):
            if pd.isna(part[value].iloc[i]):
                continue
            ci = part[f"{value}_ci"].iloc[i]
            ax.bar(
                x[i],
                part[value].iloc[i] * scale,
                width,
                yerr=None if pd.isna(ci) else ci * scale,
                capsize=3,
                error_kw={"elinewidth": 1, "ecolor": "#333333"},
                **style(g, name),
            )
        if bound and part[bound].notna().any():
            ax.hlines(part[bound] * scale, x - width / 2, x + width / 2, colors="black", lw=2)
    if (stats[value].dropna() >= 0).all():  # a CI of few repetitions can reach below zero
        ax.set_ylim(bottom=0)
    ax.set_xticks(np.arange(len(groups)), [str(g).replace(" / ", "\n") for g in groups])
    if len(groups) > 3:
        ax.tick_params(axis="x", labelsize=8)
    ax.grid(True, axis="y", alpha=0.3)
    ax.set_axisbelow(True)


def plot_line(
    ax: Axes,
    x: np.ndarray,
    y: np.ndarray,
    style: Style,
    rank: int,
    count: int,
    label: str,
    err: np.ndarray | None = None,
    linestyle: Any = None,
    dodge: bool = False,
) -> None:
    """Series ``rank`` of ``count`` as a line in its colour, marker and line style, with
    hollow markers a little smaller than the series' before, so that coinciding curves all
    stay visible; with ``dodge`` (an x axis of steps, such as rounds), also shifted sideways
    by a few percent of the x spacing."""
    xs = np.unique(x)
    spacing = float(np.min(np.diff(xs))) if len(xs) > 1 else 1.0
    step = min(DODGE, 0.3 / max(count - 1, 1)) * spacing  # all within 30 % of a step
    shift = step * (rank - (count - 1) / 2) if dodge else 0.0
    kwargs: dict[str, Any] = {
        "color": style.color,
        "marker": style.marker,
        "linestyle": style.linestyle if linestyle is None else linestyle,
        "markersize": max(9.0 - 0.8 * rank, 4.0),
        "markerfacecolor": "none" if style.hollow or rank > 0 else style.color,
        "markeredgewidth": 1.4,
        "linewidth": 1.4,
        "label": label,
    }
    ax.plot(x + shift, y, **kwargs)
    if err is not None and (finite := np.isfinite(err)).any():  # only where there is a CI
        ax.errorbar(
            x[finite] + shift,
            y[finite],
            yerr=err[finite],
            fmt="none",
            ecolor=style.color,
            capsize=3,
            elinewidth=1,
        )
