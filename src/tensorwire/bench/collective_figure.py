"""The figure of ``tensorwire bench collective``: allreduce time against the tensor's size,
one line per contender (tensorwire's solid, the baselines' dashed). On loopback a second
panel has the bus bandwidth; on the testbed there is a panel per link profile instead, with
the ring bound at the link's rate (the least time, black)."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

from matplotlib.axes import Axes

from tensorwire.bench.fl_figures.canvas import (
    bound_handle,
    legend_below,
    panel_grid,
    save_figure,
)

TIME_LABEL = "wall ms per allreduce (median)"
SIZE_LABEL = "float32 bytes per rank"
RING_BOUND_LABEL = "ring bound: 2 (N - 1) / N x bytes / link rate"


def collective_figure(
    rows: list[dict[str, Any]], out_dir: Path, name: str = "collective"
) -> list[Path]:
    """Median ms per allreduce (and, on loopback, bus GB/s: ring bound bytes / time)
    against bytes; a panel per link on the testbed."""
    links = list(dict.fromkeys(r.get("link", "loopback") for r in rows)) or ["loopback"]
    ranks = rows[0]["ranks"] if rows else 0
    if links == ["loopback"]:
        fig, (time_ax, bus_ax) = panel_grid(2)
        _lines(time_ax, rows, "median_ms", bus_ax)
        for ax, ylabel in ((time_ax, TIME_LABEL), (bus_ax, "bus GB/s (ring bound)")):
            _axes(ax, ylabel, f"{ranks} ranks, loopback")
        axes = [time_ax, bus_ax]
        handles, labels = time_ax.get_legend_handles_labels()
        caption = "bus GB/s: 2 (N - 1) / N x bytes, the least each rank sends, / the median time"
        title = "allreduce on loopback"
    else:
        fig, axes = panel_grid(len(links))
        for ax, link in zip(axes, links, strict=False):
            mine = [r for r in rows if r.get("link") == link]
            _lines(ax, mine, "median_ms")
            bound = sorted({(r["bytes"], r["ring_bound_ms"]) for r in mine})
            ax.plot(
                [b[0] for b in bound],
                [b[1] for b in bound],
                color="black",
                linewidth=2,
                marker="_",  # one size is a point: a bar shows where
                markersize=24,
                markeredgewidth=2,
            )
            _axes(ax, TIME_LABEL, f"{ranks} ranks, each behind {link}")
        handles, labels = axes[0].get_legend_handles_labels()
        handles, labels = [*handles, bound_handle()], [*labels, RING_BOUND_LABEL]
        caption = (
            "every rank in its own network namespace behind its own link shaped at the "
            "profile's rate both ways; bound: 2 (N - 1) / N x bytes / link rate"
        )
        title = "allreduce behind shaped links"
    legend_below(fig, axes, handles, labels)
    saved = save_figure(fig, out_dir, name, title, caption)
    return [saved.png, saved.svg]


def _lines(ax: Axes, rows: list[dict[str, Any]], key: str, bus_ax: Axes | None = None) -> None:
    lines: dict[str, list[tuple[int, float, float]]] = defaultdict(list)
    for r in rows:
        lines[r["contender"]].append((r["bytes"], r[key], r["bus_gb_per_s"]))
    for label, points in lines.items():
        points.sort()
        style = "-" if label.startswith("tensorwire") else "--"
        sizes = [p[0] for p in points]
        (line,) = ax.plot(sizes, [p[1] for p in points], style, marker="o", label=label)
        if bus_ax is not None:
            bus_ax.plot(sizes, [p[2] for p in points], style, marker="o", color=line.get_color())


def _axes(ax: Axes, ylabel: str, title: str) -> None:
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel(SIZE_LABEL)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
