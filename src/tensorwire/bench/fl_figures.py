"""Figures of ``bench fl`` results, the FedComm paper's kinds and more, as PNG and SVG.

Each takes the per-round table of :mod:`tensorwire.bench.fl_results` with a ``series`` column
(the protocol, or ``run: protocol`` in a comparison) and is skipped when the matrix lacks its
data: communication time per protocol per profile and model, under CPU stress, under network
stress, against loss; accuracy per round; bytes on the wire; TCP retransmissions; the
encode / wire / decode split; communication time per uplink codec. Every time figure draws
the lower bound (message bytes / link rate) as a black bar over each bar, or a dashed line.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; no display needed
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import ScalarFormatter

BOUND_LABEL = "lower bound: bytes / link rate"
COMM_LABEL = "communication time per round (s)\n(sum over devices, downlink + uplink)"


@dataclasses.dataclass(frozen=True)
class FigureFile:
    """A figure written as ``png`` and ``svg``, with a ``title`` and a ``caption``."""

    name: str
    title: str
    caption: str
    png: Path
    svg: Path


def _order(values: pd.Series) -> list:
    return list(dict.fromkeys(values.tolist()))


def base_rows(frame: pd.DataFrame, keep: set[str]) -> pd.DataFrame:
    """``frame`` narrowed to the baseline of every setting not in ``keep``: no stress, the
    lowest loss, no uplink compression (else the first codec), the first profile and model."""
    rows = frame
    for dim in ("stress", "loss", "codec", "profile", "model"):
        if dim in keep or dim not in rows or rows.empty:
            continue
        values = _order(rows[dim])
        if dim == "loss":
            base = min(values)
        elif dim in ("stress", "codec") and "none" in values:
            base = "none"
        else:
            base = values[0]
        rows = rows[rows[dim] == base]
    return rows


def _panels(count: int, width: float = 5.5, height: float = 4.0) -> tuple[Figure, list[Axes]]:
    cols = min(count, 3)
    rows = -(-count // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(width * cols, height * rows), squeeze=False)
    flat = list(axes.flat)
    for ax in flat[count:]:
        ax.set_visible(False)
    return fig, flat[:count]


def _colors(series: list[str]) -> dict[str, tuple]:
    cmap = plt.get_cmap("tab10" if len(series) <= 10 else "tab20")
    return {s: cmap(i % cmap.N) for i, s in enumerate(series)}


def _mean_std(rows: pd.DataFrame, by: list[str], value: str) -> pd.DataFrame:
    """Mean of ``value`` per ``by``, and its std over repetitions: each experiment's rounds
    are averaged first, so rounds that differ by design (a delta downlink's first, full
    model) do not read as noise."""
    experiment = [c for c in ("run", "key") if c in rows]
    if experiment:
        rows = rows.groupby(by + experiment, sort=False)[value].mean().reset_index()
    return (
        rows.groupby(by, sort=False)[value]
        .agg(["mean", "std"])
        .reset_index()
        .rename(columns={"mean": value, "std": f"{value}_std"})
    )


def grouped_bars(
    ax: Axes,
    rows: pd.DataFrame,
    group: str,
    series: str,
    value: str,
    bound: str | None = None,
    colors: dict[str, tuple] | None = None,
) -> None:
    """Bars of ``value`` (mean, std as error bar) per ``group`` on the x axis, one per
    ``series`` side by side; ``bound`` (mean) as a black bar across each bar."""
    groups, names = _order(rows[group]), _order(rows[series])
    stats = _mean_std(rows, [group, series], value)
    if bound:
        stats = stats.merge(
            rows.groupby([group, series], sort=False)[bound].mean().reset_index(),
            on=[group, series],
        )
    colors = colors or _colors(names)
    width = 0.8 / len(names)
    bound_drawn = False
    for j, name in enumerate(names):
        part = stats[stats[series] == name].set_index(group).reindex(groups)
        x = np.arange(len(groups)) - 0.4 + width * (j + 0.5)
        ax.bar(
            x,
            part[value],
            width,
            yerr=part[f"{value}_std"].fillna(0),
            label=str(name),
            color=colors[name],
            capsize=2,
        )
        if bound and part[bound].notna().any():
            ax.hlines(
                part[bound],
                x - width / 2,
                x + width / 2,
                colors="black",
                linewidth=2,
                label=None if bound_drawn else BOUND_LABEL,
            )
            bound_drawn = True
    ax.set_xticks(np.arange(len(groups)), [str(g).replace(" / ", "\n") for g in groups])
    if len(groups) > 3:
        ax.tick_params(axis="x", labelsize=8)
    ax.grid(True, axis="y", alpha=0.3)


def _save(fig: Figure, out_dir: Path, name: str, title: str, caption: str) -> FigureFile:
    out_dir.mkdir(parents=True, exist_ok=True)
    fig.suptitle(title)
    fig.tight_layout()
    png, svg = out_dir / f"{name}.png", out_dir / f"{name}.svg"
    fig.savefig(png, dpi=110)
    fig.savefig(svg)
    plt.close(fig)
    return FigureFile(name, title, caption, png, svg)


def _legend(axes: list[Axes]) -> None:
    axes[-1].legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.02, 1.0))


def _combos(rows: pd.DataFrame, dims: list[str]) -> list[tuple]:
    return list(dict.fromkeys(map(tuple, rows[dims].itertuples(index=False))))


def _where(rows: pd.DataFrame, dims: list[str], values: tuple) -> pd.DataFrame:
    mask = np.ones(len(rows), bool)
    for dim, value in zip(dims, values, strict=True):
        mask &= (rows[dim] == value).to_numpy()
    return rows[mask]


def _title(values: tuple) -> str:
    return ", ".join(map(str, values))


def _comm_bars_per_model(rows: pd.DataFrame, group: str, xlabel: str, colors: dict) -> Figure:
    """Communication time per ``group`` on the x axis, a bar per series, its lower bound
    across each bar; a panel per model."""
    models = _order(rows["model"])
    fig, axes = _panels(len(models))
    for ax, model in zip(axes, models, strict=True):
        grouped_bars(
            ax, rows[rows["model"] == model], group, "series", "comm_s", "lower_bound_s", colors
        )
        ax.set_title(str(model))
        ax.set_xlabel(xlabel)
        ax.set_ylabel(COMM_LABEL)
    _legend(axes)
    return fig


# --- the figures ---------------------------------------------------------------------------


def comm_time_figure(frame: pd.DataFrame, out_dir: Path, colors: dict) -> FigureFile | None:
    """Communication time per protocol, bars grouped by profile, a panel per model."""
    rows = base_rows(frame, {"profile", "model"})
    if rows.empty:
        return None
    fig = _comm_bars_per_model(rows, "profile", "network profile", colors)
    return _save(
        fig,
        out_dir,
        "comm_time",
        "Communication time per protocol, network profile and model",
        "Mean per round (error bar: std over repetitions); black: the lower bound.",
    )


def stress_figure(frame: pd.DataFrame, out_dir: Path, colors: dict, kind: str) -> FigureFile | None:
    """Communication time per protocol without and with ``kind`` stress."""
    if kind not in set(frame["stress"]):
        return None
    rows = base_rows(frame, {"stress", "profile", "model"})
    rows = rows[rows["stress"].isin(["none", kind])]
    combos = _combos(rows, ["model", "profile"])
    fig, axes = _panels(len(combos))
    stress_colors = {"none": "#9aa5b1", kind: "#d1495b"}
    for ax, combo in zip(axes, combos, strict=True):
        part = _where(rows, ["model", "profile"], combo)
        grouped_bars(ax, part, "series", "stress", "comm_s", "lower_bound_s", stress_colors)
        ax.set_title(_title(combo))
        ax.set_ylabel(COMM_LABEL)
        ax.tick_params(axis="x", labelrotation=30)
    _legend(axes)
    return _save(
        fig,
        out_dir,
        f"comm_time_{kind}_stress",
        f"Communication time under {kind} stress",
        f"Per protocol, without stress and under {kind} stress"
        + (
            " (stress-ng, one worker per device)."
            if kind == "cpu"
            else " (iperf3 flows offered to every device link; the counters include them)."
        ),
    )


def loss_figure(frame: pd.DataFrame, out_dir: Path, colors: dict) -> FigureFile | None:
    """Communication time against packet loss, a line per protocol."""
    if frame["loss"].nunique() < 2:
        return None
    rows = base_rows(frame, {"loss", "profile", "model"})
    combos = _combos(rows, ["model", "profile"])
    fig, axes = _panels(len(combos))
    for ax, combo in zip(axes, combos, strict=True):
        part = _where(rows, ["model", "profile"], combo)
        for name in _order(part["series"]):
            mine = part[part["series"] == name].groupby("loss")[["comm_s", "lower_bound_s"]].mean()
            x = mine.index.to_numpy() * 100
            ax.plot(x, mine["comm_s"], marker="o", color=colors[name], label=str(name))
            ax.plot(x, mine["lower_bound_s"], "--", color=colors[name], alpha=0.6, linewidth=1)
        ax.plot([], [], "--", color="black", label=BOUND_LABEL)
        ax.set_title(_title(combo))
        ax.set_xlabel("packet loss (%)")
        ax.set_ylabel(COMM_LABEL)
        spread = part["comm_s"].max() / max(part["lower_bound_s"].min(), 1e-9)
        if spread > 20:  # heavy loss: only a log scale shows the small times too
            ax.set_yscale("log")
            ax.yaxis.set_major_formatter(ScalarFormatter())
        else:
            ax.set_ylim(bottom=0)
        ax.grid(True, which="both", alpha=0.3)
    _legend(axes)
    return _save(
        fig,
        out_dir,
        "comm_time_loss",
        "Communication time against packet loss",
        "Mean per round; dashed, in the protocol's colour: its lower bound (lossless).",
    )


def accuracy_figure(frame: pd.DataFrame, out_dir: Path, colors: dict) -> FigureFile | None:
    """Test accuracy after each round, a line per protocol (and codec)."""
    rows = base_rows(frame, {"codec", "model"})
    if rows.empty:
        return None
    several = rows["codec"].nunique() > 1
    models = _order(rows["model"])
    fig, axes = _panels(len(models))
    for ax, model in zip(axes, models, strict=True):
        part = rows[rows["model"] == model]
        for (name, codec), mine in part.groupby(["series", "codec"], sort=False):
            curve = mine.groupby("round")["accuracy"].mean()
            style = "-" if codec == "none" else "--"
            label = f"{name}, {codec}" if several else str(name)
            ax.plot(curve.index, curve * 100, style, marker="o", color=colors[name], label=label)
        ax.set_title(str(model))
        ax.set_xlabel("round")
        ax.set_ylabel("test accuracy (%)")
        ax.grid(True, alpha=0.3)
    _legend(axes)
    return _save(
        fig,
        out_dir,
        "accuracy",
        "Accuracy per round",
        "Global model's test accuracy after each FedAvg round (mean over repetitions)"
        + ("; dashed: with compression (uplink or downlink)." if several else "."),
    )


def bytes_figure(frame: pd.DataFrame, out_dir: Path, colors: dict) -> FigureFile | None:
    """Message bytes and link bytes per round, per protocol (and codec)."""
    rows = base_rows(frame, {"codec", "model"})
    if rows.empty:
        return None
    rows = rows.assign(
        setting=rows["series"].astype(str)
        + np.where(rows["codec"] == "none", "", ", " + rows["codec"].astype(str))
    )
    kinds = {
        "payload_bytes": "messages (header + encoded tensors)",
        "wire_bytes": "frames on the links (overhead, resends, ACKs)",
    }
    long = rows.melt(
        id_vars=["model", "setting"], value_vars=list(kinds), var_name="kind", value_name="bytes"
    )
    long["kind"] = long["kind"].map(kinds)
    long["MB"] = long["bytes"] / 1e6
    models = _order(rows["model"])
    fig, axes = _panels(len(models), width=max(5.5, 0.9 * rows["setting"].nunique()))
    for ax, model in zip(axes, models, strict=True):
        grouped_bars(
            ax,
            long[long["model"] == model],
            "setting",
            "kind",
            "MB",
            colors={kinds["payload_bytes"]: "#4c78a8", kinds["wire_bytes"]: "#f58518"},
        )
        ax.set_title(str(model))
        ax.set_ylabel("MB per round, all devices, both directions")
        ax.tick_params(axis="x", labelrotation=30)
    _legend(axes)
    return _save(
        fig,
        out_dir,
        "bytes",
        "Bytes on the wire per round",
        "Message bytes as sent and received, and the bytes the device links carried.",
    )


def retransmissions_figure(frame: pd.DataFrame, out_dir: Path, colors: dict) -> FigureFile | None:
    """TCP retransmissions per round: against loss, or per profile."""
    if frame["retrans_segs"].isna().all():
        return None
    if frame["loss"].nunique() > 1:
        rows = base_rows(frame, {"loss", "profile", "model"})
        combos = _combos(rows, ["model", "profile"])
        fig, axes = _panels(len(combos))
        for ax, combo in zip(axes, combos, strict=True):
            part = _where(rows, ["model", "profile"], combo)
            for name in _order(part["series"]):
                mine = part[part["series"] == name].groupby("loss")["retrans_segs"].mean()
                ax.plot(mine.index * 100, mine, marker="o", color=colors[name], label=str(name))
            ax.set_title(_title(combo))
            ax.set_xlabel("packet loss (%)")
            ax.set_ylabel("TCP segments retransmitted per round")
            ax.grid(True, alpha=0.3)
    else:
        rows = base_rows(frame, {"profile", "model"})
        models = _order(rows["model"])
        fig, axes = _panels(len(models))
        for ax, model in zip(axes, models, strict=True):
            part = rows[rows["model"] == model]
            grouped_bars(ax, part, "profile", "series", "retrans_segs", colors=colors)
            ax.set_title(str(model))
            ax.set_xlabel("network profile")
            ax.set_ylabel("TCP segments retransmitted per round")
    _legend(axes)
    return _save(
        fig,
        out_dir,
        "retransmissions",
        "TCP retransmissions",
        "Segments retransmitted per round, summed over the server's and devices' namespaces "
        "(brokers included; udp's own resends are not TCP's).",
    )


def breakdown_figure(frame: pd.DataFrame, out_dir: Path, colors: dict) -> FigureFile | None:
    """Communication time stacked as encode / wire / decode, per protocol."""
    rows = base_rows(frame, {"codec", "model"})
    if rows.empty or rows[["encode_s", "wire_s", "decode_s"]].isna().all().all():
        return None
    rows = rows.assign(
        setting=rows["series"].astype(str)
        + np.where(rows["codec"] == "none", "", ", " + rows["codec"].astype(str))
    )
    parts = {"encode_s": "#54a24b", "wire_s": "#4c78a8", "decode_s": "#e45756"}
    models = _order(rows["model"])
    fig, axes = _panels(len(models), width=max(5.5, 0.9 * rows["setting"].nunique()))
    for ax, model in zip(axes, models, strict=True):
        means = (
            rows[rows["model"] == model]
            .groupby("setting", sort=False)[[*parts, "lower_bound_s"]]
            .mean()
        )
        x = np.arange(len(means))
        bottom = np.zeros(len(means))
        for part, color in parts.items():
            ax.bar(x, means[part], 0.6, bottom=bottom, color=color, label=part.removesuffix("_s"))
            bottom += means[part].to_numpy()
        if means["lower_bound_s"].notna().any():
            ax.hlines(
                means["lower_bound_s"],
                x - 0.3,
                x + 0.3,
                colors="black",
                linewidth=2,
                label=BOUND_LABEL,
            )
        ax.set_xticks(x, means.index, rotation=30)
        ax.set_title(str(model))
        ax.set_ylabel(COMM_LABEL)
        ax.grid(True, axis="y", alpha=0.3)
    _legend(axes)
    return _save(
        fig,
        out_dir,
        "breakdown",
        "Where the communication time goes: encode / wire / decode",
        "Senders' encoding, receivers' decoding, and the rest of each transfer's end-to-end "
        "time (on the wire and in queues), summed like the communication time.",
    )


def codec_figure(frame: pd.DataFrame, out_dir: Path, colors: dict) -> FigureFile | None:
    """Communication time per codec (uplink, and downlink where not none), bars per
    protocol."""
    if frame["codec"].nunique() < 2:
        return None
    rows = base_rows(frame, {"codec", "model"})
    fig = _comm_bars_per_model(rows, "codec", "compression (uplink / downlink)", colors)
    return _save(
        fig,
        out_dir,
        "comm_time_codecs",
        "Communication time per compression",
        "Mean per round with each uplink codec (error feedback on) and downlink mode (none "
        "unless named; delta: lossless XOR with the previous model); error bar: std over "
        "repetitions; black: the lower bound.",
    )


FIGURES: list[Callable[[pd.DataFrame, Path, dict], FigureFile | None]] = [
    comm_time_figure,
    functools.partial(stress_figure, kind="cpu"),
    functools.partial(stress_figure, kind="network"),
    loss_figure,
    accuracy_figure,
    bytes_figure,
    retransmissions_figure,
    breakdown_figure,
    codec_figure,
]


def draw_figures(frame: pd.DataFrame, out_dir: Path) -> list[FigureFile]:
    """Every figure the data of ``frame`` (with a ``series`` column) allows, into ``out_dir``."""
    if frame.empty:
        return []
    colors = _colors(_order(frame["series"]))
    return [f for draw in FIGURES if (f := draw(frame, out_dir, colors)) is not None]
