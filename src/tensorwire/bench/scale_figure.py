"""The figure of ``tensorwire bench scale``: time per client against the client count, log-log,
one line per transport (flat where nothing grows faster than the clients)."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

from tensorwire.bench.fl_figures.canvas import (
    legend_below,
    panel_grid,
    plain_log_labels,
    save_figure,
)

DECADE = 10.0


def scale_figure(rows: list[dict[str, Any]], out_dir: Path, name: str = "scale") -> list[Path]:
    """Join ms per client and (broadcast + gather) ms per client, against clients."""
    lines: dict[str, list[tuple[int, float, float]]] = defaultdict(list)
    for r in rows:
        if "error" not in r:
            lines[r["transport"]].append(
                (r["clients"], r["join_ms_per_client"], r["per_client_ms"])
            )
    fig, (join_ax, round_ax) = panel_grid(2)
    for label, points in sorted(lines.items()):
        points.sort()
        counts = [p[0] for p in points]
        (line,) = join_ax.plot(counts, [p[1] for p in points], marker="o", label=label)
        round_ax.plot(counts, [p[2] for p in points], marker="o", color=line.get_color())
    for ax, ylabel, column in (
        (join_ax, "join: wall ms per client", 1),
        (round_ax, "broadcast + gather: wall ms per client", 2),
    ):
        ax.set_xscale("log")
        ax.set_yscale("log")
        _at_least_a_decade(ax, [p[column] for points in lines.values() for p in points])
        plain_log_labels(ax.xaxis)
        plain_log_labels(ax.yaxis)
        ax.set_xlabel("clients of one hub")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
    handles, labels = join_ax.get_legend_handles_labels()
    legend_below(fig, [join_ax, round_ax], handles, labels)
    caption = "wall time of the whole step / clients: a flat line scales linearly"
    saved = save_figure(fig, out_dir, name, "one hub, many clients, loopback", caption)
    return [saved.png, saved.svg]


def _at_least_a_decade(ax: Any, values: list[float]) -> None:
    """Show at least a decade around ``values``: a line that grows 1.3x must not look like
    one that grows 10x because the axis zoomed in on it."""
    shown = [v for v in values if v > 0]
    if not shown:
        return
    low, high = min(shown), max(shown)
    if high / low < DECADE:
        middle = (low * high) ** 0.5
        ax.set_ylim(middle / DECADE**0.5, middle * DECADE**0.5)
