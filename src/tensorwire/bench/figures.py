"""Figures of benchmark results (matplotlib, written as 300 dpi PNG and SVG), in the styles of
:mod:`tensorwire.bench.fl_figures`: a transport has its protocol's colour and marker."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only; no display needed
import matplotlib.pyplot as plt

from tensorwire.bench.fl_figures import DPI, protocol_style
from tensorwire.bench.fl_figures.styles import SPARE_COLORS, SPARE_MARKERS, Style


def distinct_styles(labels: list[str]) -> dict[str, Style]:
    """Each label's protocol style (a baseline is drawn dashed with hollow markers, so it
    may share its colour and marker with a transport), but never two labels drawn alike: a
    label whose colour and marker another of its kind already has takes the next spare pair."""
    taken: set[tuple[str, str, bool]] = set()
    out: dict[str, Style] = {}
    for k, label in enumerate(labels):
        ours = label.startswith("tensorwire-")
        style = protocol_style(label.removeprefix("tensorwire-"))
        tries = 0
        while (style.color, style.marker, ours) in taken and tries < len(SPARE_COLORS) ** 2:
            tries += 1
            style = replace(
                style,
                color=SPARE_COLORS[(k + tries) % len(SPARE_COLORS)],
                marker=SPARE_MARKERS[(k + 2 * tries) % len(SPARE_MARKERS)],
            )
        taken.add((style.color, style.marker, ours))
        out[label] = style
    return out


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
        styles = distinct_styles(sorted(lines))
        for label, points in sorted(lines.items()):
            points.sort()
            ours = label.startswith("tensorwire-")
            style = styles[label]
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
