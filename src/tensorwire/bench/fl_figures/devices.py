"""Per-device links: each device's communication time, and what the slowest one costs."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; no display needed
import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.patches import Patch

from tensorwire.bench.fl_figures.canvas import (
    PANEL_HEIGHT,
    PANEL_WIDTH,
    FigureFile,
    legend_below,
    rotate_long_ticks,
    save_figure,
    time_unit,
)
from tensorwire.bench.fl_figures.marks import grouped_bars
from tensorwire.bench.fl_figures.selection import combinations_of, in_order, reps_note, rows_where
from tensorwire.bench.fl_figures.styles import (
    Style,
    bar_style,
    bar_style_by_series,
    patch_style,
    registry_order,
    series_handles,
)


def device_figure(devices: pd.DataFrame, out_dir: Path, styles: dict) -> FigureFile | None:
    """Per-device links: each device's communication time per protocol (left), and when the
    round ended with every update against without the slowest device's (right)."""
    if devices.empty or "links" not in devices:
        return None
    devices = devices[devices["links"] != "uniform"]
    if devices.empty:
        return None
    devices = devices.assign(who=devices["device"] + "\n" + devices["link"].astype(str))
    dims = ["topology", "links", *[d for d in ("model", "loss") if d in devices]]
    combos = combinations_of(devices, dims)
    scale, unit = time_unit(devices["comm_s"], devices.get("finished_s", devices["comm_s"]))
    names = registry_order(in_order(devices["series"]))
    width = max(PANEL_WIDTH, 0.3 * len(names) * devices["device"].nunique())
    fig, grid = plt.subplots(
        len(combos), 2, figsize=(2 * width, PANEL_HEIGHT * len(combos)), squeeze=False
    )
    for (left, right), combo in zip(grid, combos, strict=True):
        part = rows_where(devices, dims, combo)
        grouped_bars(
            left, part, "who", "series", "comm_s", bar_style_by_series(styles), scale=scale
        )
        left.set_ylabel(f"communication per round ({unit})")
        named = dict(zip(dims, combo, strict=True))
        where = [
            *([str(named["topology"])] if named["topology"] != "star" else []),
            str(named["links"]),
            *([str(named["model"])] if "model" in named and devices["model"].nunique() > 1 else []),
            *([f"loss {named['loss'] * 100:g}%"] if named.get("loss") else []),
        ]
        left.set_title(f"each device ({', '.join(where)})")
        ends = _round_ends(part)
        grouped_bars(
            right,
            ends,
            "series",
            "case",
            "end_s",
            lambda series, case: bar_style(styles[series], second=case != "every device"),
            scale=scale,
        )
        right.set_ylabel(f"last update in, after round start ({unit})")
        right.set_title("the round's end")
        rotate_long_ticks(right)
    grey = Style("#666666", "o", "-")
    handles = [
        *series_handles(names, styles),
        Patch(**patch_style(grey)),
        Patch(**patch_style(grey, True)),
    ]
    labels = [*map(str, names), "every device", "without the slowest device"]
    legend_below(fig, list(grid.flat), handles, labels)
    return save_figure(
        fig,
        out_dir,
        "device_times",
        "Per-device links: each device's time, and what the slowest one costs",
        "Left: each device's downlink and uplink time per round (its link under its name), "
        "per protocol. Right: when the server had the round's last update, after the round's "
        "first model byte went out (training included), with every device (solid) and without "
        "the device that spent longest communicating (hatched): what a deadline or quorum "
        "that went on without it would have saved. " + reps_note(devices),
    )


def _round_ends(part: pd.DataFrame) -> pd.DataFrame:
    """Per experiment and round: the last update's arrival with every device and without
    the series' slowest communicator (``case``, ``end_s``), for :func:`grouped_bars`."""
    if "finished_s" not in part or part["finished_s"].isna().all():
        return pd.DataFrame(columns=["series", "case", "end_s", "key", "rep"])
    rows = []
    for series, mine in part.groupby("series", sort=False):
        slowest = mine.groupby("device")["comm_s"].mean().idxmax()
        for (key, round_), one in mine.groupby(["key", "round"], sort=False):
            rest = one[one["device"] != slowest]["finished_s"]
            base = {"series": series, "key": key, "round": round_, "rep": one["rep"].iloc[0]}
            rows.append({**base, "case": "every device", "end_s": one["finished_s"].max()})
            rows.append({**base, "case": "without the slowest", "end_s": rest.max()})
    return pd.DataFrame(rows)
