"""Figures of benchmark results (matplotlib, written as 300 dpi PNG and SVG), in the styles of
:mod:`tensorwire.bench.fl_figures`: a transport has its protocol's colour and marker."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only; no display needed
import matplotlib.pyplot as plt

from tensorwire.bench.fl_figures import DPI, protocol_style


def transfer_figure(
    rows: list[dict[str, Any]], out_dir: Path, name: str = "transfer"
) -> list[Path]:
    """Throughput (GB/s) against message size, one line per transport and baseline, per dtype."""
    dtypes = sorted({r["dtype"] for r in rows if r["case"] == "gsoc"})
    fig, axes = plt.subplots(
        1, max(len(dtypes), 1), figsize=(5 * max(len(dtypes), 1), 4), sharey=True, squeeze=False
    )
    for ax, dtype in zip(axes[0], dtypes, strict=False):
        lines: dict[str, list[tuple[int, float]]] = defaultdict(list)
        for r in rows:
            if r["case"] == "gsoc" and r["dtype"] == dtype:
                lines[r["transport"]].append((r["bytes"], r["gb_per_s"]))
        for label, points in sorted(lines.items()):
            points.sort()
            ours = label.startswith("tensorwire-")
            style = protocol_style(label.removeprefix("tensorwire-"))
            ax.plot(
                [p[0] for p in points],
                [p[1] for p in points],
                "-" if ours else "--",
                marker=style.marker,
                color=style.color,
                markerfacecolor=style.color if ours else "none",
                label=label,
            )
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_title(f"{dtype}, loopback, median")
        ax.set_xlabel("message size (bytes)")
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].set_ylabel("throughput (GB/s), send + ack")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.tight_layout()
    fig.legend(
        handles,
        labels,
        loc="upper center",
        bbox_to_anchor=(0.5, 0.0),
        ncol=min(len(labels), 2 * max(len(dtypes), 1)),
        fontsize="small",
        frameon=False,
    )
    paths = [out_dir / f"{name}.png", out_dir / f"{name}.svg"]
    for p in paths:
        fig.savefig(p, dpi=DPI, bbox_inches="tight")
    plt.close(fig)
    return paths
