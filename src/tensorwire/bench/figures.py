"""Figures of benchmark results (matplotlib, written as PNG and SVG)."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only; no display needed
import matplotlib.pyplot as plt


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
            style = "-" if label.startswith("tensorwire") else "--"
            ax.plot([p[0] for p in points], [p[1] for p in points], style, marker="o", label=label)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_title(f"{dtype}, loopback, median")
        ax.set_xlabel("message size (bytes)")
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].set_ylabel("throughput (GB/s), send + ack")
    axes[0][-1].legend(fontsize="small")
    fig.tight_layout()
    paths = [out_dir / f"{name}.png", out_dir / f"{name}.svg"]
    for p in paths:
        fig.savefig(p, dpi=120)
    plt.close(fig)
    return paths
