"""The figure of ``tensorwire bench collective``: allreduce time and bus bandwidth against
the tensor's size, one line per contender (tensorwire's solid, the baselines' dashed)."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

from tensorwire.bench.fl_figures.canvas import legend_below, panel_grid, save_figure


def collective_figure(
    rows: list[dict[str, Any]], out_dir: Path, name: str = "collective"
) -> list[Path]:
    """Median ms per allreduce and bus GB/s (ring bound bytes / time) against bytes."""
    lines: dict[str, list[tuple[int, float, float]]] = defaultdict(list)
    for r in rows:
        lines[r["contender"]].append((r["bytes"], r["median_ms"], r["bus_gb_per_s"]))
    fig, (time_ax, bus_ax) = panel_grid(2)
    for label, points in lines.items():
        points.sort()
        style = "-" if label.startswith("tensorwire") else "--"
        sizes = [p[0] for p in points]
        (line,) = time_ax.plot(sizes, [p[1] for p in points], style, marker="o", label=label)
        bus_ax.plot(sizes, [p[2] for p in points], style, marker="o", color=line.get_color())
    ranks = rows[0]["ranks"] if rows else 0
    for ax, ylabel in ((time_ax, "median ms per allreduce"), (bus_ax, "bus GB/s (ring bound)")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("float32 bytes per rank")
        ax.set_ylabel(ylabel)
        ax.set_title(f"{ranks} ranks, loopback")
        ax.grid(True, which="both", alpha=0.3)
    handles, labels = time_ax.get_legend_handles_labels()
    legend_below(fig, [time_ax, bus_ax], handles, labels)
    caption = "bus GB/s: 2 (N - 1) / N x bytes, the least each rank sends, / the median time"
    saved = save_figure(fig, out_dir, name, "allreduce on loopback", caption)
    return [saved.png, saved.svg]
