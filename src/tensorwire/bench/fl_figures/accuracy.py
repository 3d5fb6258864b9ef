"""Test accuracy after each round, a line per protocol (and codec)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from matplotlib.ticker import MaxNLocator

from tensorwire.bench.confidence import mean_ci
from tensorwire.bench.fl_figures.canvas import FigureFile, legend_below, panel_grid, save_figure
from tensorwire.bench.fl_figures.marks import plot_line
from tensorwire.bench.fl_figures.selection import (
    base_rows,
    in_order,
    is_payload,
    model_note,
    reps_note,
)


def accuracy_figure(frame: pd.DataFrame, out_dir: Path, styles: dict) -> FigureFile | None:
    """Test accuracy after each round, a line per protocol (and codec); payloads, which
    learn nothing, left out."""
    frame = frame[~frame["model"].map(is_payload)]
    if frame.empty:
        return None
    rows = base_rows(frame, {"codec", "model"})
    if rows.empty:
        return None
    codecs = in_order(rows["codec"])
    several = len(codecs) > 1
    codec_lines = ["-", "--", ":", "-.", (0, (5, 1.5)), (0, (1, 1))]
    models = in_order(rows["model"])
    fig, axes = panel_grid(len(models))
    for ax, model in zip(axes, models, strict=True):
        part = rows[rows["model"] == model]
        groups = part.groupby(["series", "codec"], sort=False)
        count = groups.ngroups
        for rank, ((name, codec), mine) in enumerate(groups):
            curve = mean_ci(mine, ["round"], "accuracy")
            label = f"{name}, {codec}" if several else str(name)
            plot_line(
                ax,
                curve["round"].to_numpy(),
                curve["accuracy"].to_numpy() * 100,
                styles[name],
                rank,
                count,
                label,
                curve["accuracy_ci"].to_numpy() * 100,
                codec_lines[codecs.index(codec) % len(codec_lines)] if several else None,
                dodge=True,
            )
        if len(models) > 1:
            ax.set_title(str(model))
        low, high = ax.get_ylim()
        ax.set_ylim(max(low, 0.0), min(high, 100.0))  # a CI of few repetitions can pass both
        ax.set_xlabel("round")
        ax.set_ylabel("test accuracy (%)")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(True, alpha=0.3)
    handles, labels = axes[0].get_legend_handles_labels()
    legend_below(fig, axes, handles, labels)
    return save_figure(
        fig,
        out_dir,
        "accuracy",
        "Accuracy per round",
        "Global model's test accuracy after each FedAvg round (mean over repetitions)"
        + ("; line style: the compression, as labelled." if several else ".")
        + model_note(rows)
        + " Each protocol has its own marker and colour; where curves coincide (lossless"
        " transports carry the same bits, so the model learns the same), the markers nest and"
        " each series is shifted a little sideways. " + reps_note(rows),
    )
