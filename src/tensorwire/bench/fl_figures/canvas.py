"""The page a figure is drawn on: panels, units, the legend below them, log axes in plain
numbers, and the PNG + SVG files it is saved as."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only; no display needed
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.artist import Artist
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FuncFormatter

DPI = 300

PANEL_WIDTH, PANEL_HEIGHT = 4.6, 3.3  # inches per panel

BOUND_LABEL = "lower bound: bytes / link rate"

COMM_SUM = "the sum over devices of each round's downlink and uplink transfer times"


@dataclasses.dataclass(frozen=True)
class FigureFile:
    """A figure written as ``png`` and ``svg``, with a ``title`` and a ``caption``."""

    name: str
    title: str
    caption: str
    png: Path
    svg: Path


def time_unit(*values: Any) -> tuple[float, str]:
    """``(scale, unit)`` for seconds: milliseconds when every value is under a second."""
    finite = [np.nanmax(np.asarray(v, float)) for v in values if np.isfinite(v).any()]
    return (1e3, "ms") if finite and max(finite) < 1.0 else (1.0, "s")


def panel_grid(count: int, width: float = PANEL_WIDTH) -> tuple[Figure, list[Axes]]:
    cols = min(count, 3)
    rows = -(-count // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(width * cols, PANEL_HEIGHT * rows), squeeze=False)
    flat = list(axes.flat)
    for ax in flat[count:]:
        ax.set_visible(False)
    return fig, flat[:count]


def legend_below(fig: Figure, axes: list[Axes], handles: list[Artist], labels: list[str]) -> None:
    """The figure's legend below its panels, in as many columns as fit their width."""
    fig.tight_layout()
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]
    boxes = [ax.get_window_extent(renderer) for ax in axes]
    left, right = min(b.x0 for b in boxes), max(b.x1 for b in boxes)
    bottom = min((ax.get_tightbbox(renderer) or ax.bbox).y0 for ax in axes)
    centre = fig.transFigure.inverted().transform(((left + right) / 2, bottom))
    for ncol in range(len(labels), 0, -1):
        legend = fig.legend(
            handles,
            labels,
            loc="upper center",
            bbox_to_anchor=(centre[0], centre[1]),
            ncol=ncol,
            fontsize="small",
            frameon=False,
        )
        if legend.get_window_extent(renderer).width <= right - left or ncol == 1:
            return
        legend.remove()


def save_figure(fig: Figure, out_dir: Path, name: str, title: str, caption: str) -> FigureFile:
    out_dir.mkdir(parents=True, exist_ok=True)
    png, svg = out_dir / f"{name}.png", out_dir / f"{name}.svg"
    fig.savefig(png, dpi=DPI, bbox_inches="tight")
    fig.savefig(svg, bbox_inches="tight")
    plt.close(fig)
    return FigureFile(name, title, caption, png, svg)


def bound_handle() -> Line2D:
    return Line2D([], [], color="black", linewidth=2)


def rotate_long_ticks(ax: Axes) -> None:
    """Tilt the x tick labels only when they would not fit side by side."""
    labels = [t.get_text() for t in ax.get_xticklabels()]
    if sum(max(len(line) for line in (t or " ").split("\n")) for t in labels) > 40:
        ax.tick_params(axis="x", labelrotation=30)
        for t in ax.get_xticklabels():
            t.set_horizontalalignment("right")


def plain_log_labels(axis: Any) -> None:
    """A log axis labelled in plain numbers (``20``, not ``2 x 10^1``): every decade, and
    2 and 5 between them."""

    def label(value: float, _: Any) -> str:
        if value <= 0:
            return ""
        lead = round(value / 10 ** np.floor(np.log10(value) + 1e-9), 6)
        return f"{value:g}" if lead in (1.0, 2.0, 5.0) else ""

    axis.set_major_formatter(FuncFormatter(label))
    axis.set_minor_formatter(FuncFormatter(label))
