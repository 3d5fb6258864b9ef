"""Communication time per protocol: per profile and model, under CPU or network stress, per
compression, and against packet loss."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import ScalarFormatter

from tensorwire.bench.confidence import mean_ci
from tensorwire.bench.fl_figures.canvas import (
    BOUND_LABEL,
    COMM_SUM,
    FigureFile,
    bound_handle,
    legend_below,
    panel_grid,
    rotate_long_ticks,
    save_figure,
    time_unit,
)
from tensorwire.bench.fl_figures.marks import grouped_bars, plot_line
from tensorwire.bench.fl_figures.selection import (
    base_rows,
    combinations_of,
    in_order,
    model_note,
    reps_note,
    rows_where,
    title_of,
)
from tensorwire.bench.fl_figures.styles import (
    Style,
    bar_style,
    bar_style_by_series,
    patch_style,
    series_handles,
)


def _comm_bars_per_model(
    rows: pd.DataFrame, group: str, xlabel: str, styles: dict[str, Style]
) -> Figure:
    """Communication time per ``group`` on the x axis, a bar per series, its lower bound
    across each bar; a panel per model."""
    models = in_order(rows["model"])
    scale, unit = time_unit(rows["comm_s"], rows["lower_bound_s"])
    fig, axes = panel_grid(len(models))
    for ax, model in zip(axes, models, strict=True):
        grouped_bars(
            ax,
            rows[rows["model"] == model],
            group,
            "series",
            "comm_s",
            bar_style_by_series(styles),
            "lower_bound_s",
            scale,
        )
        if len(models) > 1:
            ax.set_title(str(model))
        ax.set_xlabel(xlabel)
        ax.set_ylabel(f"communication time per round ({unit})")
    names = in_order(rows["series"])
    handles = series_handles(names, styles)
    labels = [str(n) for n in names]
    if rows["lower_bound_s"].notna().any():
        handles, labels = [*handles, bound_handle()], [*labels, BOUND_LABEL]
    legend_below(fig, axes, handles, labels)
    return fig


def comm_time_figure(frame: pd.DataFrame, out_dir: Path, styles: dict) -> FigureFile | None:
    """Communication time per protocol, bars grouped by profile, a panel per model."""
    rows = base_rows(frame, {"profile", "model"})
    if rows.empty:
        return None
    fig = _comm_bars_per_model(rows, "profile", "network profile", styles)
    return save_figure(
        fig,
        out_dir,
        "comm_time",
        "Communication time per protocol, network profile and model",
        f"Mean per round of {COMM_SUM}; black: the lower bound (message bytes / link rate)."
        + model_note(rows)
        + " "
        + reps_note(rows),
    )


def stress_figure(frame: pd.DataFrame, out_dir: Path, styles: dict, kind: str) -> FigureFile | None:
    """Communication time per protocol without and with ``kind`` stress."""
    if kind not in set(frame["stress"]):
        return None
    rows = base_rows(frame, {"stress", "profile", "model"})
    rows = rows[rows["stress"].isin(["none", kind])]
    combos = combinations_of(rows, ["model", "profile"])
    scale, unit = time_unit(rows["comm_s"], rows["lower_bound_s"])
    fig, axes = panel_grid(len(combos))

    def style(series: Any, stress: Any) -> dict[str, Any]:
        return bar_style(styles[series], second=stress != "none")

    for ax, combo in zip(axes, combos, strict=True):
        part = rows_where(rows, ["model", "profile"], combo)
        grouped_bars(ax, part, "series", "stress", "comm_s", style, "lower_bound_s", scale)
        ax.set_title(title_of(combo))
        ax.set_ylabel(f"communication time per round ({unit})")
        rotate_long_ticks(ax)
    grey = Style("#666666", "o", "-")
    handles = [
        Patch(**patch_style(grey)),
        Patch(**patch_style(grey, second=True)),
        bound_handle(),
    ]
    legend_below(fig, axes, handles, ["no stress", f"{kind} stress", BOUND_LABEL])
    return save_figure(
        fig,
        out_dir,
        f"comm_time_{kind}_stress",
        f"Communication time under {kind} stress",
        f"Mean per round of {COMM_SUM}, per protocol (its colour), without stress (solid) and "
        f"under {kind} stress (hatched)"
        + (
            " (stress-ng, one worker per device)."
            if kind == "cpu"
            else " (iperf3 flows offered to every device link; the counters include them)."
        )
        + " Black: the lower bound. "
        + reps_note(rows),
    )


def loss_figure(frame: pd.DataFrame, out_dir: Path, styles: dict) -> FigureFile | None:
    """Communication time against packet loss, a line per protocol."""
    if frame["loss"].nunique() < 2:
        return None
    rows = base_rows(frame, {"loss", "profile", "model"})
    combos = combinations_of(rows, ["model", "profile"])
    scale, unit = time_unit(rows["comm_s"], rows["lower_bound_s"])
    fig, axes = panel_grid(len(combos))
    for ax, combo in zip(axes, combos, strict=True):
        part = rows_where(rows, ["model", "profile"], combo)
        names = in_order(part["series"])
        for rank, name in enumerate(names):
            mine = mean_ci(part[part["series"] == name], ["loss"], "comm_s").sort_values("loss")
            x = mine["loss"].to_numpy() * 100
            plot_line(
                ax,
                x,
                mine["comm_s"].to_numpy() * scale,
                styles[name],
                rank,
                len(names),
                str(name),
                mine["comm_s_ci"].to_numpy() * scale,
            )
        bound = part.groupby("loss")["lower_bound_s"].mean()
        ax.plot(bound.index * 100, bound * scale, "--", color="black", linewidth=1)
        ax.set_title(title_of(combo))
        ax.set_xlabel("packet loss (%)")
        ax.set_ylabel(f"communication time per round ({unit})")
        spread = part["comm_s"].max() / max(part["lower_bound_s"].min(), 1e-9)
        if spread > 20:  # heavy loss: only a log scale shows the small times too
            ax.set_yscale("log")
            ax.yaxis.set_major_formatter(ScalarFormatter())
        else:
            ax.set_ylim(bottom=0)
        ax.grid(True, which="both", alpha=0.3)
    handles, labels = axes[0].get_legend_handles_labels()
    dashed = Line2D([], [], color="black", linestyle="--", linewidth=1)
    legend_below(fig, axes, [*handles, dashed], [*labels, f"{BOUND_LABEL} (lossless)"])
    return save_figure(
        fig,
        out_dir,
        "comm_time_loss",
        "Communication time against packet loss",
        f"Mean per round of {COMM_SUM}; dashed: the lower bound, which loss does not change. "
        + reps_note(rows),
    )


def codec_figure(frame: pd.DataFrame, out_dir: Path, styles: dict) -> FigureFile | None:
    """Communication time per codec (uplink, and downlink where not none), bars per
    protocol."""
    if frame["codec"].nunique() < 2:
        return None
    rows = base_rows(frame, {"codec", "model"})
    fig = _comm_bars_per_model(rows, "codec", "compression (uplink / downlink)", styles)
    return save_figure(
        fig,
        out_dir,
        "comm_time_codecs",
        "Communication time per compression",
        f"Mean per round of {COMM_SUM}, with each uplink codec (error feedback on) and "
        "downlink mode (none unless named; delta: lossless XOR with the previous model); "
        "black: the lower bound." + model_note(rows) + " " + reps_note(rows),
    )
