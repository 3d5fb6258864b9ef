"""Communication time against its lower bound: over the bound per condition, and against the
update's size."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; no display needed
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.lines import Line2D

from tensorwire.bench.confidence import mean_ci
from tensorwire.bench.fl_figures.canvas import (
    BOUND_LABEL,
    COMM_SUM,
    PANEL_HEIGHT,
    PANEL_WIDTH,
    FigureFile,
    legend_below,
    plain_log_labels,
    save_figure,
    time_unit,
)
from tensorwire.bench.fl_figures.marks import plot_line
from tensorwire.bench.fl_figures.selection import (
    base_rows,
    combinations_of,
    in_order,
    is_payload,
    rate_of,
    reps_note,
    rows_where,
)
from tensorwire.bench.fl_figures.styles import registry_order
from tensorwire.bench.fl_ranking import experiment_table
from tensorwire.fl.config import payload_bytes


def payload_figure(frame: pd.DataFrame, out_dir: Path, styles: dict) -> FigureFile | None:
    """Communication time against the update's size (``--payload``), a column per profile
    (and loss): on top log-log, a line per protocol and the lower bound dashed; below, the
    same over the bound, where gaps of a few percent show."""
    rows = frame[frame["model"].map(is_payload)]
    if rows["model"].nunique() < 2:
        return None
    rows = base_rows(rows, {"model", "profile", "loss"})
    rows = rows.assign(
        payload_mb=rows["model"].map(lambda m: (payload_bytes(str(m)) or 0) / 1e6),
        over_bound=rows["comm_s"] / rows["lower_bound_s"],
    )
    combos = sorted(combinations_of(rows, ["profile", "loss"]), key=lambda c: (rate_of(c[0]), c[1]))
    scale, unit = time_unit(rows["comm_s"], rows["lower_bound_s"])
    fig, grid = plt.subplots(
        2,
        len(combos),
        figsize=(PANEL_WIDTH * len(combos), PANEL_HEIGHT * 1.7),
        squeeze=False,
        sharex="col",
        gridspec_kw={"height_ratios": [1.6, 1]},
    )
    for (top, below), combo in zip(grid.T, combos, strict=True):
        part = rows_where(rows, ["profile", "loss"], combo)
        sizes = sorted(set(part["payload_mb"]))
        names = registry_order(in_order(part["series"]))
        for rank, name in enumerate(names):
            mine = part[part["series"] == name]
            time = mean_ci(mine, ["payload_mb"], "comm_s").sort_values("payload_mb")
            ratio = mean_ci(mine, ["payload_mb"], "over_bound").sort_values("payload_mb")
            for ax, stats, value, factor in (
                (top, time, "comm_s", scale),
                (below, ratio, "over_bound", 1.0),
            ):
                plot_line(
                    ax,
                    stats["payload_mb"].to_numpy(),
                    stats[value].to_numpy() * factor,
                    styles[name],
                    rank,
                    len(names),
                    str(name),
                    stats[f"{value}_ci"].to_numpy() * factor,
                )
        bound = part.groupby("payload_mb")["lower_bound_s"].mean().sort_index()
        top.plot(bound.index, bound * scale, "--", color="black", linewidth=1)
        below.axhline(1.0, linestyle="--", color="black", linewidth=1)
        profile, loss = combo
        top.set_title(f"{profile}" + (f", loss {loss * 100:g}%" if loss else ""))
        top.set_yscale("log")
        plain_log_labels(top.yaxis)
        below.set_xscale("log")
        plain_log_labels(below.xaxis)
        below.set_xticks(sizes)
        below.set_xlabel("update size (MB, each way, per device)")
        top.set_ylabel(f"comm. time per round ({unit})")
        below.set_ylabel("over the bound")
        low = min(1.0, float(np.nanmin(part["over_bound"])))
        below.set_ylim(low - 0.02, max(float(np.nanmax(part["over_bound"])) * 1.03, 1.1))
        for ax in (top, below):
            ax.grid(True, which="both", alpha=0.3)
    handles, labels = grid[0][0].get_legend_handles_labels()
    dashed = Line2D([], [], color="black", linestyle="--", linewidth=1)
    legend_below(fig, list(grid.flat), [*handles, dashed], [*labels, BOUND_LABEL])
    return save_figure(
        fig,
        out_dir,
        "comm_time_payload",
        "Communication time against update size",
        f"Mean per round of {COMM_SUM}, with synthetic updates of each size and no training "
        "(--payload). Top: the time, both axes logarithmic, dashed: the lower bound. Below: "
        "the time over the bound (1, dashed), on an axis that starts near the data: where a "
        "protocol rises above the others, its chunking, a broker's limits or per-message "
        "costs start to matter. " + reps_note(rows),
    )


def ratio_figure(frame: pd.DataFrame, out_dir: Path, styles: dict) -> FigureFile | None:
    """Communication time over its lower bound per condition, a marker per protocol with its
    95 % CI, on an axis that starts near the data (not at zero), the bound at 1."""
    each = experiment_table(frame)
    if each.empty or each["ratio"].isna().all() or each["series"].nunique() < 2:
        return None  # one protocol alone: nothing to compare (an experiment's own report)
    each = each[each["ratio"].notna()]
    conditions, names = in_order(each["condition"]), registry_order(in_order(each["series"]))
    stats = mean_ci(each, ["condition", "series"], "ratio")
    width = max(PANEL_WIDTH * 1.4, 0.22 * len(conditions) * len(names) + 1.5)
    fig, ax = plt.subplots(figsize=(width, PANEL_HEIGHT + 0.4))
    spread = 0.7 / max(len(names), 1)
    for j, name in enumerate(names):
        mine = stats[stats["series"] == name].set_index("condition").reindex(conditions)
        x = np.arange(len(conditions)) - 0.35 + spread * (j + 0.5)
        style = styles[name]
        ax.plot(
            x,
            mine["ratio"],
            linestyle="none",
            marker=style.marker,
            color=style.color,
            markerfacecolor="none" if style.hollow else style.color,
            markersize=7,
            label=str(name),
        )
        err = mine["ratio_ci"].to_numpy()
        if np.isfinite(err).any():
            ok = np.isfinite(err)
            ax.errorbar(
                x[ok],
                mine["ratio"].to_numpy()[ok],
                yerr=err[ok],
                fmt="none",
                ecolor=style.color,
                capsize=3,
                elinewidth=1,
            )
    ax.axhline(1.0, color="black", linestyle="--", linewidth=1)
    low = max(np.nanmin(stats["ratio"] - stats["ratio_ci"].fillna(0.0)), 0.0)
    high = np.nanmax(stats["ratio"] + stats["ratio_ci"].fillna(0.0))
    if stats["ratio"].max() / min(stats["ratio"].min(), 1.0) > 5:  # heavy loss: many-fold
        ax.set_yscale("log")
        plain_log_labels(ax.yaxis)
    else:
        pad = 0.06 * (high - min(low, 1.0)) or 0.02
        ax.set_ylim(max(min(low, 1.0) - pad, 0.0), high + pad)
    ax.set_xticks(np.arange(len(conditions)), [str(c).replace(", ", "\n") for c in conditions])
    if len(conditions) > 4:
        ax.tick_params(axis="x", labelsize=8)
    for k in range(1, len(conditions)):
        ax.axvline(k - 0.5, color="#dddddd", linewidth=0.8)
    ax.set_xlim(-0.5, len(conditions) - 0.5)
    ax.set_ylabel("communication time / lower bound")
    ax.grid(True, axis="y", alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
    dashed = Line2D([], [], color="black", linestyle="--", linewidth=1)
    legend_below(fig, [ax], [*handles, dashed], [*labels, "the lower bound (1)"])
    rows = frame[frame["key"].isin(each["key"])] if "key" in frame else frame
    return save_figure(
        fig,
        out_dir,
        "comm_over_bound",
        "Communication time over its lower bound, per condition",
        "Each experiment's communication time summed over its rounds over its lower bound "
        "(message bytes / link rate), mean over repetitions; 1 is the bound. The axis "
        "starts near the data, not at zero, so that gaps of a few percent show. " + reps_note(rows),
    )
