"""What the wire carried and where the time went: bytes per round, TCP retransmissions, and
the encode / wait / wire / decode split."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only; no display needed
import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.patches import Patch
from matplotlib.ticker import MaxNLocator

from tensorwire.bench.confidence import mean_ci
from tensorwire.bench.fl_figures.canvas import (
    BOUND_LABEL,
    PANEL_HEIGHT,
    PANEL_WIDTH,
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
    with_setting,
)
from tensorwire.bench.fl_figures.styles import (
    Style,
    bar_style,
    bar_style_by_series,
    patch_style,
    series_handles,
)


def bytes_figure(frame: pd.DataFrame, out_dir: Path, styles: dict) -> FigureFile | None:
    """Message bytes and link bytes per round, per protocol (and codec)."""
    rows = base_rows(frame, {"codec", "model"})
    if rows.empty:
        return None
    rows = with_setting(rows)
    kinds = {
        "payload_bytes": "messages (header + encoded tensors)",
        "wire_bytes": "frames on the links (overhead, resends, ACKs)",
    }
    long = rows.melt(
        id_vars=[c for c in ("model", "setting", "series", "run", "key", "round") if c in rows],
        value_vars=list(kinds),
        var_name="kind",
        value_name="bytes",
    )
    long["kind"] = long["kind"].map(kinds)
    long["MB"] = long["bytes"] / 1e6
    series_of = dict(zip(rows["setting"], rows["series"], strict=False))

    def style(setting: Any, kind: Any) -> dict[str, Any]:
        return bar_style(styles[series_of[setting]], second=kind == kinds["wire_bytes"])

    models = in_order(rows["model"])
    fig, axes = panel_grid(len(models), width=max(PANEL_WIDTH, 0.75 * rows["setting"].nunique()))
    for ax, model in zip(axes, models, strict=True):
        grouped_bars(ax, long[long["model"] == model], "setting", "kind", "MB", style)
        if len(models) > 1:
            ax.set_title(str(model))
        ax.set_ylabel("MB per round")
        rotate_long_ticks(ax)
    grey = Style("#666666", "o", "-")
    legend_below(
        fig,
        axes,
        [Patch(**patch_style(grey)), Patch(**patch_style(grey, True))],
        list(kinds.values()),
    )
    return save_figure(
        fig,
        out_dir,
        "bytes",
        "Bytes on the wire per round",
        "Per round, all devices, both directions: the message bytes as sent and received "
        "(solid), and the bytes the device links carried (hatched), per protocol (its colour)."
        + model_note(rows)
        + " "
        + reps_note(rows),
    )


def retransmissions_figure(frame: pd.DataFrame, out_dir: Path, styles: dict) -> FigureFile | None:
    """TCP retransmissions per round: against loss, or per profile."""
    if frame["retrans_segs"].isna().all():
        return None
    if frame["loss"].nunique() > 1:
        rows = base_rows(frame, {"loss", "profile", "model"})
        combos = combinations_of(rows, ["model", "profile"])
        fig, axes = panel_grid(len(combos))
        for ax, combo in zip(axes, combos, strict=True):
            part = rows_where(rows, ["model", "profile"], combo)
            names = in_order(part["series"])
            for rank, name in enumerate(names):
                mine = mean_ci(part[part["series"] == name], ["loss"], "retrans_segs")
                mine = mine.sort_values("loss")
                plot_line(
                    ax,
                    mine["loss"].to_numpy() * 100,
                    mine["retrans_segs"].to_numpy(),
                    styles[name],
                    rank,
                    len(names),
                    str(name),
                    mine["retrans_segs_ci"].to_numpy(),
                )
            ax.set_title(title_of(combo))
            ax.set_xlabel("packet loss (%)")
            ax.set_ylabel("TCP segments retransmitted per round")
            ax.grid(True, alpha=0.3)
        handles, labels = axes[0].get_legend_handles_labels()
    else:
        rows = base_rows(frame, {"profile", "model"})
        models = in_order(rows["model"])
        fig, axes = panel_grid(len(models))
        for ax, model in zip(axes, models, strict=True):
            part = rows[rows["model"] == model]
            grouped_bars(ax, part, "profile", "series", "retrans_segs", bar_style_by_series(styles))
            if len(models) > 1:
                ax.set_title(str(model))
            ax.set_xlabel("network profile")
            ax.set_ylabel("TCP segments retransmitted per round")
        names = in_order(rows["series"])
        handles, labels = series_handles(names, styles), [str(n) for n in names]
    for ax in axes:
        whole_segments(ax)
    legend_below(fig, axes, handles, labels)
    return save_figure(
        fig,
        out_dir,
        "retransmissions",
        "TCP retransmissions",
        "Segments retransmitted per round, summed over the server's and devices' namespaces "
        "(brokers included); none shown for a protocol whose data is not TCP's (udp, quic "
        "resend by themselves)." + model_note(rows) + " " + reps_note(rows),
    )


def whole_segments(ax: Any) -> None:
    """A count's axis: from zero, whole numbers on the ticks, at least up to one (a single
    segment in three rounds is a third per round, not a scale of thirds)."""
    low, high = ax.get_ylim()
    ax.set_ylim(bottom=min(0.0, low), top=max(1.0, high))
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))


def breakdown_figure(frame: pd.DataFrame, out_dir: Path, styles: dict) -> FigureFile | None:
    """Communication time split into wire and wait (seconds) and encode / decode (milliseconds
    where they are small), per protocol."""
    rows = base_rows(frame, {"codec", "model"})
    parts = ["encode_s", "wait_s", "wire_s", "decode_s"]
    rows = rows.assign(**{p: float("nan") for p in parts if p not in rows})  # older tables
    if rows.empty or rows[parts].isna().all().all():
        return None
    rows = with_setting(rows)
    series_of = dict(zip(rows["setting"], rows["series"], strict=False))
    models = in_order(rows["model"])
    width = max(PANEL_WIDTH, 0.6 * rows["setting"].nunique())
    fig, grid = plt.subplots(
        len(models), 2, figsize=(2 * width, PANEL_HEIGHT * len(models)), squeeze=False
    )
    wire_scale, wire_unit = time_unit(rows["wire_s"], rows["wait_s"], rows["lower_bound_s"])
    cpu_scale, cpu_unit = time_unit(rows["encode_s"], rows["decode_s"])
    ids = [c for c in ("model", "setting", "run", "key", "round") if c in rows]

    def long(values: list[str]) -> pd.DataFrame:
        melted = rows.melt(
            id_vars=[*ids, "lower_bound_s"],
            value_vars=values,
            var_name="part",
            value_name="seconds",
        )
        melted["part"] = melted["part"].str.removesuffix("_s")
        # the bound is the wire's: no bar across the wait
        melted.loc[melted["part"] != "wire", "lower_bound_s"] = float("nan")
        return melted

    link, cpu = long(["wire_s", "wait_s"]), long(["encode_s", "decode_s"])

    def by_part(setting: Any, part: Any) -> dict[str, Any]:
        return bar_style(styles[series_of[setting]], second=part in ("wait", "decode"))

    for (ax_wire, ax_cpu), model in zip(grid, models, strict=True):
        grouped_bars(
            ax_wire,
            link[link["model"] == model],
            "setting",
            "part",
            "seconds",
            by_part,
            "lower_bound_s",
            wire_scale,
        )
        ax_wire.set_ylabel(f"wire and wait ({wire_unit})")
        ax_wire.set_title("wire" + (f", {model}" if len(models) > 1 else ""))
        ax_cpu.set_title("encode and decode" + (f", {model}" if len(models) > 1 else ""))
        part = cpu[cpu["model"] == model]
        grouped_bars(ax_cpu, part, "setting", "part", "seconds", by_part, scale=cpu_scale)
        ax_cpu.set_ylabel(f"encode and decode ({cpu_unit})")
        for ax in (ax_wire, ax_cpu):
            rotate_long_ticks(ax)
    grey = Style("#666666", "o", "-")
    handles = [Patch(**patch_style(grey)), Patch(**patch_style(grey, True)), bound_handle()]
    labels = ["left: wire, right: encode", "left: wait, right: decode", BOUND_LABEL]
    legend_below(fig, list(grid.flat), handles, labels)
    return save_figure(
        fig,
        out_dir,
        "breakdown",
        "Where the communication time goes: encode / wait / wire / decode",
        "Per round, summed like the communication time, per protocol (its colour). Left: "
        "wire (solid), a message's first byte arriving to its last, decoding left out; "
        "black: its lower bound; wait (hatched), the end of encoding to the first byte "
        "arriving (queues, fan-out, broker, delay). Right, "
        f"in {'milliseconds' if cpu_unit == 'ms' else 'seconds'}: the senders' CPU encoding "
        "(solid) and the receivers' CPU decoding (hatched), waiting for bytes left out."
        + model_note(rows)
        + " "
        + reps_note(rows),
    )
