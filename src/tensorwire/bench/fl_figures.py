"""Figures of ``bench fl`` results, the FedComm paper's kinds and more, as PNG and SVG.

Each takes the per-round table of :mod:`tensorwire.bench.fl_results` with a ``series`` column
(the protocol, or ``run: protocol`` in a comparison) and is skipped when the matrix lacks its
data: communication time per protocol per profile and model, under CPU stress, under network
stress, against loss; accuracy per round; bytes on the wire; TCP retransmissions; the
encode / wire / decode split; communication time per uplink codec. Every time figure draws
the lower bound (message bytes / link rate) as a black bar over each bar, or a dashed line.

Made to go into a paper unchanged: no title in the image (the report's heading and the
caption carry it), 300 dpi PNG and SVG, one colour and marker per protocol in every figure
(:func:`protocol_style`), error bars only where a setting has two or more repetitions (the
95 % confidence interval of the mean; the caption says which), milliseconds where times are
under a second, and the legend below the panels, never wider than they are.
"""

from __future__ import annotations

import dataclasses
import functools
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only; no display needed
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.artist import Artist
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter, MaxNLocator, ScalarFormatter

from tensorwire.bench.fl_matrix import protocol_schemes
from tensorwire.fl.config import payload_bytes
from tensorwire.testbed.profile import as_profile

DPI = 300
PANEL_WIDTH, PANEL_HEIGHT = 4.6, 3.3  # inches per panel
BOUND_LABEL = "lower bound: bytes / link rate"
COMM_SUM = "the sum over devices of each round's downlink and uplink transfer times"

# One colour, marker and line style per protocol, the same in every figure of every report
# (matplotlib's tab10 colours, which read in greyscale and to most colour-blind readers too),
# given out in the registry's order of the protocols, so a new transport gets the next one.
_PALETTE = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#bcbd22",
    "#e377c2",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#17becf",
    "#7f7f7f",
)
_MARKER_CYCLE = ("o", "s", "^", "v", "*", "D", "P", "X", "h", "p")
_LINE_CYCLE: tuple[Any, ...] = (
    "-",
    "--",
    "-.",
    (0, (6, 2, 1, 2)),
    (0, (1, 1)),
    ":",
    (0, (5, 1.5)),
    (0, (3, 1, 1, 1, 1, 1)),
    (0, (4, 1, 1, 1)),
    (0, (2, 2)),
)
_KNOWN = list(protocol_schemes())[: len(_PALETTE)]
PROTOCOL_COLORS = {p: _PALETTE[i] for i, p in enumerate(_KNOWN)}
PROTOCOL_MARKERS = {p: _MARKER_CYCLE[i] for i, p in enumerate(_KNOWN)}
PROTOCOL_LINES: dict[str, Any] = {p: _LINE_CYCLE[i] for i, p in enumerate(_KNOWN)}
# For protocols registered at run time: picked by a stable hash of the name.
_SPARE_COLORS = ("#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173", "#5254a3", "#8ca252")
_SPARE_MARKERS = ("<", ">", "d", "8", "H", "1", "2")
# In a comparison of runs, the runs are told apart by hatching (bars) and marker fill (lines).
_RUN_HATCHES = ("", "//", "..", "xx", "\\\\", "++")
# Two-part bars (messages and frames, none and stressed, encode and decode): the second part
# is the protocol's colour, hatched.
_SECOND_HATCH = "///"
DODGE = 0.04  # sideways shift between line series, a fraction of the x spacing
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228)
"""Student's t, two-sided 95 %, for 1..10 degrees of freedom (then :func:`t95` interpolates)."""


@dataclasses.dataclass(frozen=True)
class FigureFile:
    """A figure written as ``png`` and ``svg``, with a ``title`` and a ``caption``."""

    name: str
    title: str
    caption: str
    png: Path
    svg: Path


@dataclasses.dataclass(frozen=True)
class Style:
    """How one series is drawn: ``color``, ``marker``, ``linestyle``, bar ``hatch``, and
    whether its markers are ``hollow``."""

    color: str
    marker: str
    linestyle: Any
    hatch: str = ""
    hollow: bool = False


def protocol_style(protocol: str) -> Style:
    """The protocol's colour, marker and line style: fixed for the known ones, and for any
    other chosen by a hash of its name, so it is the same in every figure and every run."""
    spare = zlib.crc32(protocol.encode())
    return Style(
        color=PROTOCOL_COLORS.get(protocol, _SPARE_COLORS[spare % len(_SPARE_COLORS)]),
        marker=PROTOCOL_MARKERS.get(protocol, _SPARE_MARKERS[spare % len(_SPARE_MARKERS)]),
        linestyle=PROTOCOL_LINES.get(protocol, "-"),
    )


def series_styles(frame: pd.DataFrame) -> dict[str, Style]:
    """Each ``series`` of ``frame``: its protocol's style, and in a comparison of several
    runs a hatch and marker fill per run."""
    runs = _order(frame["run"]) if "run" in frame else []
    styles = {}
    for series, protocol, run in (
        frame.assign(run=frame.get("run", ""))[["series", "protocol", "run"]]
        .drop_duplicates()
        .itertuples(index=False)
    ):
        k = runs.index(run) if len(runs) > 1 else 0
        styles[series] = dataclasses.replace(
            protocol_style(str(protocol)),
            hatch=_RUN_HATCHES[k % len(_RUN_HATCHES)],
            hollow=k % 2 == 1,
        )
    return styles


def t95(n: int) -> float:
    """Student's t quantile for a two-sided 95 % interval of a mean of ``n`` >= 2 values."""
    df = n - 1
    if df <= len(_T975):
        return _T975[df - 1]
    return 1.960 + 2.4 / df  # within 0.5 % of the exact quantile above 10 degrees of freedom


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


def _experiment_means(rows: pd.DataFrame, by: list[str], values: list[str]) -> pd.DataFrame:
    """Each experiment's mean of ``values`` over its rounds, per ``by``: rounds that differ by
    design (a delta downlink's first, full model) are not repetitions."""
    experiment = [c for c in ("run", "key") if c in rows and c not in by]
    return rows.groupby(by + experiment, sort=False)[values].mean().reset_index()


def mean_ci(rows: pd.DataFrame, by: list[str], value: str) -> pd.DataFrame:
    """Per ``by``: the mean of ``value`` over repetitions (``value``), the half-width of its
    95 % confidence interval (``value_ci``; NaN with fewer than two repetitions) and the
    number of repetitions (``value_n``). With ``by`` holding ``round``, per round."""
    each = _experiment_means(rows, by, [value]) if "round" not in by else rows
    stats = each.groupby(by, sort=False)[value].agg(["mean", "std", "count"]).reset_index()
    half = [
        t95(int(n)) * s / np.sqrt(n) if n >= 2 and pd.notna(s) else np.nan
        for s, n in zip(stats["std"], stats["count"], strict=True)
    ]
    return stats.assign(**{f"{value}_ci": half}).rename(
        columns={"mean": value, "count": f"{value}_n"}
    )[[*by, value, f"{value}_ci", f"{value}_n"]]


def reps_note(rows: pd.DataFrame) -> str:
    """The caption's sentence on error bars, from the repetitions each setting of ``rows`` has."""
    dims = [
        c
        for c in ("run", "protocol", "model", "profile", "loss", "stress", "codec", "epochs")
        if c in rows
    ]
    if rows.empty or "rep" not in rows:
        return ""
    reps = rows.groupby(dims, sort=False)["rep"].nunique()
    low, high = int(reps.min()), int(reps.max())
    if high < 2:
        return "One repetition per setting, so no error bars."
    span = f"{low}" if low == high else f"{low} to {high}"
    note = f"Error bars: 95 % confidence interval of the mean over {span} repetitions"
    return note + (" (none where a setting has one)." if low < 2 else ".")


def time_unit(*values: Any) -> tuple[float, str]:
    """``(scale, unit)`` for seconds: milliseconds when every value is under a second."""
    finite = [np.nanmax(np.asarray(v, float)) for v in values if np.isfinite(v).any()]
    return (1e3, "ms") if finite and max(finite) < 1.0 else (1.0, "s")


def _panels(count: int, width: float = PANEL_WIDTH) -> tuple[Figure, list[Axes]]:
    cols = min(count, 3)
    rows = -(-count // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(width * cols, PANEL_HEIGHT * rows), squeeze=False)
    flat = list(axes.flat)
    for ax in flat[count:]:
        ax.set_visible(False)
    return fig, flat[:count]


def _bar_kwargs(style: Style, second: bool = False) -> dict[str, Any]:
    hatch = style.hatch + (_SECOND_HATCH if second else "")
    return {
        "color": style.color,
        "alpha": 0.55 if second else 1.0,
        "hatch": hatch or None,
        "edgecolor": "white" if hatch else style.color,
        "linewidth": 0.0,
    }


def grouped_bars(
    ax: Axes,
    rows: pd.DataFrame,
    group: str,
    series: str,
    value: str,
    style: Callable[[Any, Any], dict[str, Any]],
    bound: str | None = None,
    scale: float = 1.0,
) -> None:
    """Bars of ``value`` (mean over repetitions, times ``scale``) per ``group`` on the x axis,
    one per ``series`` side by side, drawn as ``style(group, series)`` says; a 95 % CI error
    bar where there are two or more repetitions; ``bound`` (mean) as a black bar across."""
    groups, names = _order(rows[group]), _order(rows[series])
    stats = mean_ci(rows, [group, series], value)
    if bound:
        stats = stats.merge(
            rows.groupby([group, series], sort=False)[bound].mean().reset_index(),
            on=[group, series],
        )
    width = 0.8 / len(names)
    for j, name in enumerate(names):
        part = stats[stats[series] == name].set_index(group).reindex(groups)
        x = np.arange(len(groups)) - 0.4 + width * (j + 0.5)
        for i, g in enumerate(groups):
            if pd.isna(part[value].iloc[i]):
                continue
            ci = part[f"{value}_ci"].iloc[i]
            ax.bar(
                x[i],
                part[value].iloc[i] * scale,
                width,
                yerr=None if pd.isna(ci) else ci * scale,
                capsize=3,
                error_kw={"elinewidth": 1, "ecolor": "#333333"},
                **style(g, name),
            )
        if bound and part[bound].notna().any():
            ax.hlines(part[bound] * scale, x - width / 2, x + width / 2, colors="black", lw=2)
    if (stats[value].dropna() >= 0).all():  # a CI of few repetitions can reach below zero
        ax.set_ylim(bottom=0)
    ax.set_xticks(np.arange(len(groups)), [str(g).replace(" / ", "\n") for g in groups])
    if len(groups) > 3:
        ax.tick_params(axis="x", labelsize=8)
    ax.grid(True, axis="y", alpha=0.3)
    ax.set_axisbelow(True)


def _legend(fig: Figure, axes: list[Axes], handles: list[Artist], labels: list[str]) -> None:
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


def _save(fig: Figure, out_dir: Path, name: str, title: str, caption: str) -> FigureFile:
    out_dir.mkdir(parents=True, exist_ok=True)
    png, svg = out_dir / f"{name}.png", out_dir / f"{name}.svg"
    fig.savefig(png, dpi=DPI, bbox_inches="tight")
    fig.savefig(svg, bbox_inches="tight")
    plt.close(fig)
    return FigureFile(name, title, caption, png, svg)


def _combos(rows: pd.DataFrame, dims: list[str]) -> list[tuple]:
    return list(dict.fromkeys(map(tuple, rows[dims].itertuples(index=False))))


def _where(rows: pd.DataFrame, dims: list[str], values: tuple) -> pd.DataFrame:
    mask = np.ones(len(rows), bool)
    for dim, value in zip(dims, values, strict=True):
        mask &= (rows[dim] == value).to_numpy()
    return rows[mask]


def _title(values: tuple) -> str:
    return ", ".join(map(str, values))


def _series_handles(names: list[str], styles: dict[str, Style]) -> list[Artist]:
    return [
        Patch(facecolor=styles[n].color, hatch=styles[n].hatch or None, edgecolor="white")
        for n in names
    ]


def _bound_handle() -> Line2D:
    return Line2D([], [], color="black", linewidth=2)


def _by_series(styles: dict[str, Style]) -> Callable[[Any, Any], dict[str, Any]]:
    return lambda group, name: _bar_kwargs(styles[name])


def _comm_bars_per_model(
    rows: pd.DataFrame, group: str, xlabel: str, styles: dict[str, Style]
) -> Figure:
    """Communication time per ``group`` on the x axis, a bar per series, its lower bound
    across each bar; a panel per model."""
    models = _order(rows["model"])
    scale, unit = time_unit(rows["comm_s"], rows["lower_bound_s"])
    fig, axes = _panels(len(models))
    for ax, model in zip(axes, models, strict=True):
        grouped_bars(
            ax,
            rows[rows["model"] == model],
            group,
            "series",
            "comm_s",
            _by_series(styles),
            "lower_bound_s",
            scale,
        )
        if len(models) > 1:
            ax.set_title(str(model))
        ax.set_xlabel(xlabel)
        ax.set_ylabel(f"communication time per round ({unit})")
    names = _order(rows["series"])
    handles = _series_handles(names, styles)
    labels = [str(n) for n in names]
    if rows["lower_bound_s"].notna().any():
        handles, labels = [*handles, _bound_handle()], [*labels, BOUND_LABEL]
    _legend(fig, axes, handles, labels)
    return fig


def _model_note(rows: pd.DataFrame) -> str:
    models = _order(rows["model"])
    return f" Model: {models[0]}." if len(models) == 1 else ""


# --- the figures ---------------------------------------------------------------------------


def comm_time_figure(frame: pd.DataFrame, out_dir: Path, styles: dict) -> FigureFile | None:
    """Communication time per protocol, bars grouped by profile, a panel per model."""
    rows = base_rows(frame, {"profile", "model"})
    if rows.empty:
        return None
    fig = _comm_bars_per_model(rows, "profile", "network profile", styles)
    return _save(
        fig,
        out_dir,
        "comm_time",
        "Communication time per protocol, network profile and model",
        f"Mean per round of {COMM_SUM}; black: the lower bound (message bytes / link rate)."
        + _model_note(rows)
        + " "
        + reps_note(rows),
    )


def stress_figure(frame: pd.DataFrame, out_dir: Path, styles: dict, kind: str) -> FigureFile | None:
    """Communication time per protocol without and with ``kind`` stress."""
    if kind not in set(frame["stress"]):
        return None
    rows = base_rows(frame, {"stress", "profile", "model"})
    rows = rows[rows["stress"].isin(["none", kind])]
    combos = _combos(rows, ["model", "profile"])
    scale, unit = time_unit(rows["comm_s"], rows["lower_bound_s"])
    fig, axes = _panels(len(combos))

    def style(series: Any, stress: Any) -> dict[str, Any]:
        return _bar_kwargs(styles[series], second=stress != "none")

    for ax, combo in zip(axes, combos, strict=True):
        part = _where(rows, ["model", "profile"], combo)
        grouped_bars(ax, part, "series", "stress", "comm_s", style, "lower_bound_s", scale)
        ax.set_title(_title(combo))
        ax.set_ylabel(f"communication time per round ({unit})")
        _rotate_long_ticks(ax)
    grey = Style("#666666", "o", "-")
    handles = [
        Patch(**_patch(grey)),
        Patch(**_patch(grey, second=True)),
        _bound_handle(),
    ]
    _legend(fig, axes, handles, ["no stress", f"{kind} stress", BOUND_LABEL])
    return _save(
        fig,
        out_dir,
        f"comm_time_{kind}_stress",
        f"Communication time under {kind} stress",
        f"Mean per round of {COMM_SUM}, per protocol (its colour), without stress (solid) and "
        f"under {kind} stress (hatched)"
        + (
            " (stress-ng, one worker per device)."
            if kind == "cpu"
            else " (iperf3 flows offered to every device link; the counters include them)."
        )
        + " Black: the lower bound. "
        + reps_note(rows),
    )


def _patch(style: Style, second: bool = False) -> dict[str, Any]:
    kwargs = _bar_kwargs(style, second)
    kwargs.pop("linewidth")
    return {"facecolor": kwargs.pop("color"), **kwargs}


def _plot_line(
    ax: Axes,
    x: np.ndarray,
    y: np.ndarray,
    style: Style,
    rank: int,
    count: int,
    label: str,
    err: np.ndarray | None = None,
    linestyle: Any = None,
    dodge: bool = False,
) -> None:
    """Series ``rank`` of ``count`` as a line in its colour, marker and line style, with
    hollow markers a little smaller than the series' before, so that coinciding curves all
    stay visible; with ``dodge`` (an x axis of steps, such as rounds), also shifted sideways
    by a few percent of the x spacing."""
    xs = np.unique(x)
    spacing = float(np.min(np.diff(xs))) if len(xs) > 1 else 1.0
    step = min(DODGE, 0.3 / max(count - 1, 1)) * spacing  # all within 30 % of a step
    shift = step * (rank - (count - 1) / 2) if dodge else 0.0
    kwargs: dict[str, Any] = {
        "color": style.color,
        "marker": style.marker,
        "linestyle": style.linestyle if linestyle is None else linestyle,
        "markersize": max(9.0 - 0.8 * rank, 4.0),
        "markerfacecolor": "none" if style.hollow or rank > 0 else style.color,
        "markeredgewidth": 1.4,
        "linewidth": 1.4,
        "label": label,
    }
    ax.plot(x + shift, y, **kwargs)
    if err is not None and (finite := np.isfinite(err)).any():  # only where there is a CI
        ax.errorbar(
            x[finite] + shift,
            y[finite],
            yerr=err[finite],
            fmt="none",
            ecolor=style.color,
            capsize=3,
            elinewidth=1,
        )


def _rotate_long_ticks(ax: Axes) -> None:
    """Tilt the x tick labels only when they would not fit side by side."""
    labels = [t.get_text() for t in ax.get_xticklabels()]
    if sum(max(len(line) for line in (t or " ").split("\n")) for t in labels) > 40:
        ax.tick_params(axis="x", labelrotation=30)
        for t in ax.get_xticklabels():
            t.set_horizontalalignment("right")


def loss_figure(frame: pd.DataFrame, out_dir: Path, styles: dict) -> FigureFile | None:
    """Communication time against packet loss, a line per protocol."""
    if frame["loss"].nunique() < 2:
        return None
    rows = base_rows(frame, {"loss", "profile", "model"})
    combos = _combos(rows, ["model", "profile"])
    scale, unit = time_unit(rows["comm_s"], rows["lower_bound_s"])
    fig, axes = _panels(len(combos))
    for ax, combo in zip(axes, combos, strict=True):
        part = _where(rows, ["model", "profile"], combo)
        names = _order(part["series"])
        for rank, name in enumerate(names):
            mine = mean_ci(part[part["series"] == name], ["loss"], "comm_s").sort_values("loss")
            x = mine["loss"].to_numpy() * 100
            _plot_line(
                ax,
                x,
                mine["comm_s"].to_numpy() * scale,
                styles[name],
                rank,
                len(names),
                str(name),
                mine["comm_s_ci"].to_numpy() * scale,
            )
        bound = part.groupby("loss")["lower_bound_s"].mean()
        ax.plot(bound.index * 100, bound * scale, "--", color="black", linewidth=1)
        ax.set_title(_title(combo))
        ax.set_xlabel("packet loss (%)")
        ax.set_ylabel(f"communication time per round ({unit})")
        spread = part["comm_s"].max() / max(part["lower_bound_s"].min(), 1e-9)
        if spread > 20:  # heavy loss: only a log scale shows the small times too
            ax.set_yscale("log")
            ax.yaxis.set_major_formatter(ScalarFormatter())
        else:
            ax.set_ylim(bottom=0)
        ax.grid(True, which="both", alpha=0.3)
    handles, labels = axes[0].get_legend_handles_labels()
    dashed = Line2D([], [], color="black", linestyle="--", linewidth=1)
    _legend(fig, axes, [*handles, dashed], [*labels, f"{BOUND_LABEL} (lossless)"])
    return _save(
        fig,
        out_dir,
        "comm_time_loss",
        "Communication time against packet loss",
        f"Mean per round of {COMM_SUM}; dashed: the lower bound, which loss does not change. "
        + reps_note(rows),
    )


def is_payload(model: Any) -> bool:
    """Whether ``model`` names synthetic updates (``payload:10MB``), which learn nothing."""
    try:
        return payload_bytes(str(model)) is not None
    except ValueError:
        return False


def accuracy_figure(frame: pd.DataFrame, out_dir: Path, styles: dict) -> FigureFile | None:
    """Test accuracy after each round, a line per protocol (and codec); payloads, which
    learn nothing, left out."""
    frame = frame[~frame["model"].map(is_payload)]
    if frame.empty:
        return None
    rows = base_rows(frame, {"codec", "model"})
    if rows.empty:
        return None
    codecs = _order(rows["codec"])
    several = len(codecs) > 1
    codec_lines = ["-", "--", ":", "-.", (0, (5, 1.5)), (0, (1, 1))]
    models = _order(rows["model"])
    fig, axes = _panels(len(models))
    for ax, model in zip(axes, models, strict=True):
        part = rows[rows["model"] == model]
        groups = part.groupby(["series", "codec"], sort=False)
        count = groups.ngroups
        for rank, ((name, codec), mine) in enumerate(groups):
            curve = mean_ci(mine, ["round"], "accuracy")
            label = f"{name}, {codec}" if several else str(name)
            _plot_line(
                ax,
                curve["round"].to_numpy(),
                curve["accuracy"].to_numpy() * 100,
                styles[name],
                rank,
                count,
                label,
                curve["accuracy_ci"].to_numpy() * 100,
                codec_lines[codecs.index(codec) % len(codec_lines)] if several else None,
                dodge=True,
            )
        if len(models) > 1:
            ax.set_title(str(model))
        low, high = ax.get_ylim()
        ax.set_ylim(max(low, 0.0), min(high, 100.0))  # a CI of few repetitions can pass both
        ax.set_xlabel("round")
        ax.set_ylabel("test accuracy (%)")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(True, alpha=0.3)
    handles, labels = axes[0].get_legend_handles_labels()
    _legend(fig, axes, handles, labels)
    return _save(
        fig,
        out_dir,
        "accuracy",
        "Accuracy per round",
        "Global model's test accuracy after each FedAvg round (mean over repetitions)"
        + ("; line style: the compression, as labelled." if several else ".")
        + _model_note(rows)
        + " Each protocol has its own marker and colour; where curves coincide (lossless"
        " transports carry the same bits, so the model learns the same), the markers nest and"
        " each series is shifted a little sideways. " + reps_note(rows),
    )


def _setting(rows: pd.DataFrame) -> pd.DataFrame:
    return rows.assign(
        setting=rows["series"].astype(str)
        + np.where(rows["codec"] == "none", "", ", " + rows["codec"].astype(str))
    )


def bytes_figure(frame: pd.DataFrame, out_dir: Path, styles: dict) -> FigureFile | None:
    """Message bytes and link bytes per round, per protocol (and codec)."""
    rows = base_rows(frame, {"codec", "model"})
    if rows.empty:
        return None
    rows = _setting(rows)
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
        return _bar_kwargs(styles[series_of[setting]], second=kind == kinds["wire_bytes"])

    models = _order(rows["model"])
    fig, axes = _panels(len(models), width=max(PANEL_WIDTH, 0.75 * rows["setting"].nunique()))
    for ax, model in zip(axes, models, strict=True):
        grouped_bars(ax, long[long["model"] == model], "setting", "kind", "MB", style)
        if len(models) > 1:
            ax.set_title(str(model))
        ax.set_ylabel("MB per round")
        _rotate_long_ticks(ax)
    grey = Style("#666666", "o", "-")
    _legend(fig, axes, [Patch(**_patch(grey)), Patch(**_patch(grey, True))], list(kinds.values()))
    return _save(
        fig,
        out_dir,
        "bytes",
        "Bytes on the wire per round",
        "Per round, all devices, both directions: the message bytes as sent and received "
        "(solid), and the bytes the device links carried (hatched), per protocol (its colour)."
        + _model_note(rows)
        + " "
        + reps_note(rows),
    )


def retransmissions_figure(frame: pd.DataFrame, out_dir: Path, styles: dict) -> FigureFile | None:
    """TCP retransmissions per round: against loss, or per profile."""
    if frame["retrans_segs"].isna().all():
        return None
    if frame["loss"].nunique() > 1:
        rows = base_rows(frame, {"loss", "profile", "model"})
        combos = _combos(rows, ["model", "profile"])
        fig, axes = _panels(len(combos))
        for ax, combo in zip(axes, combos, strict=True):
            part = _where(rows, ["model", "profile"], combo)
            names = _order(part["series"])
            for rank, name in enumerate(names):
                mine = mean_ci(part[part["series"] == name], ["loss"], "retrans_segs")
                mine = mine.sort_values("loss")
                _plot_line(
                    ax,
                    mine["loss"].to_numpy() * 100,
                    mine["retrans_segs"].to_numpy(),
                    styles[name],
                    rank,
                    len(names),
                    str(name),
                    mine["retrans_segs_ci"].to_numpy(),
                )
            ax.set_title(_title(combo))
            ax.set_xlabel("packet loss (%)")
            ax.set_ylabel("TCP segments retransmitted per round")
            ax.grid(True, alpha=0.3)
        handles, labels = axes[0].get_legend_handles_labels()
    else:
        rows = base_rows(frame, {"profile", "model"})
        models = _order(rows["model"])
        fig, axes = _panels(len(models))
        for ax, model in zip(axes, models, strict=True):
            part = rows[rows["model"] == model]
            grouped_bars(ax, part, "profile", "series", "retrans_segs", _by_series(styles))
            if len(models) > 1:
                ax.set_title(str(model))
            ax.set_xlabel("network profile")
            ax.set_ylabel("TCP segments retransmitted per round")
        names = _order(rows["series"])
        handles, labels = _series_handles(names, styles), [str(n) for n in names]
    _legend(fig, axes, handles, labels)
    return _save(
        fig,
        out_dir,
        "retransmissions",
        "TCP retransmissions",
        "Segments retransmitted per round, summed over the server's and devices' namespaces "
        "(brokers included; udp's own resends are not TCP's)."
        + _model_note(rows)
        + " "
        + reps_note(rows),
    )


def breakdown_figure(frame: pd.DataFrame, out_dir: Path, styles: dict) -> FigureFile | None:
    """Communication time split into the wire (seconds) and encode / decode (milliseconds
    where they are small), per protocol."""
    rows = base_rows(frame, {"codec", "model"})
    if rows.empty or rows[["encode_s", "wire_s", "decode_s"]].isna().all().all():
        return None
    rows = _setting(rows)
    series_of = dict(zip(rows["setting"], rows["series"], strict=False))
    models = _order(rows["model"])
    width = max(PANEL_WIDTH, 0.6 * rows["setting"].nunique())
    fig, grid = plt.subplots(
        len(models), 2, figsize=(2 * width, PANEL_HEIGHT * len(models)), squeeze=False
    )
    wire_scale, wire_unit = time_unit(rows["wire_s"], rows["lower_bound_s"])
    cpu_scale, cpu_unit = time_unit(rows["encode_s"], rows["decode_s"])
    cpu = rows.melt(
        id_vars=[c for c in ("model", "setting", "run", "key", "round") if c in rows],
        value_vars=["encode_s", "decode_s"],
        var_name="part",
        value_name="seconds",
    )
    cpu["part"] = cpu["part"].str.removesuffix("_s")

    def by_setting(setting: Any, _: Any) -> dict[str, Any]:
        return _bar_kwargs(styles[series_of[setting]])

    def by_part(setting: Any, part: Any) -> dict[str, Any]:
        return _bar_kwargs(styles[series_of[setting]], second=part == "decode")

    for (ax_wire, ax_cpu), model in zip(grid, models, strict=True):
        mine = rows[rows["model"] == model]
        mine = mine.assign(one="wire")
        grouped_bars(
            ax_wire, mine, "setting", "one", "wire_s", by_setting, "lower_bound_s", wire_scale
        )
        ax_wire.set_ylabel(f"on the wire and in queues ({wire_unit})")
        ax_wire.set_title("wire" + (f", {model}" if len(models) > 1 else ""))
        ax_cpu.set_title("encode and decode" + (f", {model}" if len(models) > 1 else ""))
        part = cpu[cpu["model"] == model]
        grouped_bars(ax_cpu, part, "setting", "part", "seconds", by_part, scale=cpu_scale)
        ax_cpu.set_ylabel(f"encode and decode ({cpu_unit})")
        for ax in (ax_wire, ax_cpu):
            _rotate_long_ticks(ax)
    grey = Style("#666666", "o", "-")
    handles = [Patch(**_patch(grey)), Patch(**_patch(grey, True)), _bound_handle()]
    labels = ["encode", "decode", BOUND_LABEL]
    _legend(fig, list(grid.flat), handles, labels)
    return _save(
        fig,
        out_dir,
        "breakdown",
        "Where the communication time goes: encode / wire / decode",
        "Per round, summed like the communication time, per protocol (its colour). Left: "
        "the time on the wire and in queues, black: the lower bound. Right, "
        f"in {'milliseconds' if cpu_unit == 'ms' else 'seconds'}: the senders' encoding "
        "(solid) and the receivers' decoding (hatched)."
        + _model_note(rows)
        + " "
        + reps_note(rows),
    )


def codec_figure(frame: pd.DataFrame, out_dir: Path, styles: dict) -> FigureFile | None:
    """Communication time per codec (uplink, and downlink where not none), bars per
    protocol."""
    if frame["codec"].nunique() < 2:
        return None
    rows = base_rows(frame, {"codec", "model"})
    fig = _comm_bars_per_model(rows, "codec", "compression (uplink / downlink)", styles)
    return _save(
        fig,
        out_dir,
        "comm_time_codecs",
        "Communication time per compression",
        f"Mean per round of {COMM_SUM}, with each uplink codec (error feedback on) and "
        "downlink mode (none unless named; delta: lossless XOR with the previous model); "
        "black: the lower bound." + _model_note(rows) + " " + reps_note(rows),
    )


def payload_figure(frame: pd.DataFrame, out_dir: Path, styles: dict) -> FigureFile | None:
    """Communication time against the update's size (``--payload``), a column per profile
    (and loss): on top log-log, a line per protocol and the lower bound dashed; below, the
    same over the bound, where gaps of a few percent show."""
    rows = frame[frame["model"].map(is_payload)]
    if rows["model"].nunique() < 2:
        return None
    rows = base_rows(rows, {"model", "profile", "loss"})
    rows = rows.assign(
        payload_mb=rows["model"].map(lambda m: (payload_bytes(str(m)) or 0) / 1e6),
        over_bound=rows["comm_s"] / rows["lower_bound_s"],
    )
    combos = sorted(_combos(rows, ["profile", "loss"]), key=lambda c: (_rate_of(c[0]), c[1]))
    scale, unit = time_unit(rows["comm_s"], rows["lower_bound_s"])
    fig, grid = plt.subplots(
        2,
        len(combos),
        figsize=(PANEL_WIDTH * len(combos), PANEL_HEIGHT * 1.7),
        squeeze=False,
        sharex="col",
        gridspec_kw={"height_ratios": [1.6, 1]},
    )
    for (top, below), combo in zip(grid.T, combos, strict=True):
        part = _where(rows, ["profile", "loss"], combo)
        sizes = sorted(set(part["payload_mb"]))
        names = registry_order(_order(part["series"]))
        for rank, name in enumerate(names):
            mine = part[part["series"] == name]
            time = mean_ci(mine, ["payload_mb"], "comm_s").sort_values("payload_mb")
            ratio = mean_ci(mine, ["payload_mb"], "over_bound").sort_values("payload_mb")
            for ax, stats, value, factor in (
                (top, time, "comm_s", scale),
                (below, ratio, "over_bound", 1.0),
            ):
                _plot_line(
                    ax,
                    stats["payload_mb"].to_numpy(),
                    stats[value].to_numpy() * factor,
                    styles[name],
                    rank,
                    len(names),
                    str(name),
                    stats[f"{value}_ci"].to_numpy() * factor,
                )
        bound = part.groupby("payload_mb")["lower_bound_s"].mean().sort_index()
        top.plot(bound.index, bound * scale, "--", color="black", linewidth=1)
        below.axhline(1.0, linestyle="--", color="black", linewidth=1)
        profile, loss = combo
        top.set_title(f"{profile}" + (f", loss {loss * 100:g}%" if loss else ""))
        top.set_yscale("log")
        _plain_log_labels(top.yaxis)
        below.set_xscale("log")
        _plain_log_labels(below.xaxis)
        below.set_xticks(sizes)
        below.set_xlabel("update size (MB, each way, per device)")
        top.set_ylabel(f"comm. time per round ({unit})")
        below.set_ylabel("over the bound")
        low = min(1.0, float(np.nanmin(part["over_bound"])))
        below.set_ylim(low - 0.02, max(float(np.nanmax(part["over_bound"])) * 1.03, 1.1))
        for ax in (top, below):
            ax.grid(True, which="both", alpha=0.3)
    handles, labels = grid[0][0].get_legend_handles_labels()
    dashed = Line2D([], [], color="black", linestyle="--", linewidth=1)
    _legend(fig, list(grid.flat), [*handles, dashed], [*labels, BOUND_LABEL])
    return _save(
        fig,
        out_dir,
        "comm_time_payload",
        "Communication time against update size",
        f"Mean per round of {COMM_SUM}, with synthetic updates of each size and no training "
        "(--payload). Top: the time, both axes logarithmic, dashed: the lower bound. Below: "
        "the time over the bound (1, dashed), on an axis that starts near the data: where a "
        "protocol rises above the others, its chunking, a broker's limits or per-message "
        "costs start to matter. " + reps_note(rows),
    )


def registry_order(names: list) -> list:
    """Series in the registry's order of their protocols (``run: tcp`` counts as tcp), the
    unregistered after them, so legends list protocols the same way whatever ran first."""
    rank = {p: i for i, p in enumerate(_KNOWN)}
    return sorted(names, key=lambda n: rank.get(str(n).rsplit(": ", 1)[-1], len(rank)))


def _rate_of(profile: Any) -> float:
    """A profile's rate in bits/s, to put the slowest first (unshaped or unknown: last)."""
    try:
        rate = as_profile(str(profile)).rate
    except ValueError:
        return float("inf")
    return float(rate) if rate is not None else float("inf")


def _plain_log_labels(axis: Any) -> None:
    """A log axis labelled in plain numbers (``20``, not ``2 x 10^1``): every decade, and
    2 and 5 between them."""

    def label(value: float, _: Any) -> str:
        if value <= 0:
            return ""
        lead = round(value / 10 ** np.floor(np.log10(value) + 1e-9), 6)
        return f"{value:g}" if lead in (1.0, 2.0, 5.0) else ""

    axis.set_major_formatter(FuncFormatter(label))
    axis.set_minor_formatter(FuncFormatter(label))


def ratio_figure(frame: pd.DataFrame, out_dir: Path, styles: dict) -> FigureFile | None:
    """Communication time over its lower bound per condition, a marker per protocol with its
    95 % CI, on an axis that starts near the data (not at zero), the bound at 1."""
    from tensorwire.bench.fl_ranking import experiment_table

    each = experiment_table(frame)
    if each.empty or each["ratio"].isna().all() or each["series"].nunique() < 2:
        return None  # one protocol alone: nothing to compare (an experiment's own report)
    each = each[each["ratio"].notna()]
    conditions, names = _order(each["condition"]), registry_order(_order(each["series"]))
    stats = mean_ci(each, ["condition", "series"], "ratio")
    width = max(PANEL_WIDTH * 1.4, 0.22 * len(conditions) * len(names) + 1.5)
    fig, ax = plt.subplots(figsize=(width, PANEL_HEIGHT + 0.4))
    spread = 0.7 / max(len(names), 1)
    for j, name in enumerate(names):
        mine = stats[stats["series"] == name].set_index("condition").reindex(conditions)
        x = np.arange(len(conditions)) - 0.35 + spread * (j + 0.5)
        style = styles[name]
        ax.plot(
            x,
            mine["ratio"],
            linestyle="none",
            marker=style.marker,
            color=style.color,
            markerfacecolor="none" if style.hollow else style.color,
            markersize=7,
            label=str(name),
        )
        err = mine["ratio_ci"].to_numpy()
        if np.isfinite(err).any():
            ok = np.isfinite(err)
            ax.errorbar(
                x[ok],
                mine["ratio"].to_numpy()[ok],
                yerr=err[ok],
                fmt="none",
                ecolor=style.color,
                capsize=3,
                elinewidth=1,
            )
    ax.axhline(1.0, color="black", linestyle="--", linewidth=1)
    low = max(np.nanmin(stats["ratio"] - stats["ratio_ci"].fillna(0.0)), 0.0)
    high = np.nanmax(stats["ratio"] + stats["ratio_ci"].fillna(0.0))
    if stats["ratio"].max() / min(stats["ratio"].min(), 1.0) > 5:  # heavy loss: many-fold
        ax.set_yscale("log")
        _plain_log_labels(ax.yaxis)
    else:
        pad = 0.06 * (high - min(low, 1.0)) or 0.02
        ax.set_ylim(max(min(low, 1.0) - pad, 0.0), high + pad)
    ax.set_xticks(np.arange(len(conditions)), [str(c).replace(", ", "\n") for c in conditions])
    if len(conditions) > 4:
        ax.tick_params(axis="x", labelsize=8)
    for k in range(1, len(conditions)):
        ax.axvline(k - 0.5, color="#dddddd", linewidth=0.8)
    ax.set_xlim(-0.5, len(conditions) - 0.5)
    ax.set_ylabel("communication time / lower bound")
    ax.grid(True, axis="y", alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
    dashed = Line2D([], [], color="black", linestyle="--", linewidth=1)
    _legend(fig, [ax], [*handles, dashed], [*labels, "the lower bound (1)"])
    rows = frame[frame["key"].isin(each["key"])] if "key" in frame else frame
    return _save(
        fig,
        out_dir,
        "comm_over_bound",
        "Communication time over its lower bound, per condition",
        "Each experiment's communication time summed over its rounds over its lower bound "
        "(message bytes / link rate), mean over repetitions; 1 is the bound. The axis "
        "starts near the data, not at zero, so that gaps of a few percent show. " + reps_note(rows),
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
    combos = _combos(devices, dims)
    scale, unit = time_unit(devices["comm_s"], devices.get("finished_s", devices["comm_s"]))
    names = registry_order(_order(devices["series"]))
    width = max(PANEL_WIDTH, 0.3 * len(names) * devices["device"].nunique())
    fig, grid = plt.subplots(
        len(combos), 2, figsize=(2 * width, PANEL_HEIGHT * len(combos)), squeeze=False
    )
    for (left, right), combo in zip(grid, combos, strict=True):
        part = _where(devices, dims, combo)
        grouped_bars(left, part, "who", "series", "comm_s", _by_series(styles), scale=scale)
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
            lambda series, case: _bar_kwargs(styles[series], second=case != "every device"),
            scale=scale,
        )
        right.set_ylabel(f"last update in, after round start ({unit})")
        right.set_title("the round's end")
        _rotate_long_ticks(right)
    grey = Style("#666666", "o", "-")
    handles = [*_series_handles(names, styles), Patch(**_patch(grey)), Patch(**_patch(grey, True))]
    labels = [*map(str, names), "every device", "without the slowest device"]
    _legend(fig, list(grid.flat), handles, labels)
    return _save(
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
    payload_figure,
    ratio_figure,
]


def draw_figures(
    frame: pd.DataFrame, out_dir: Path, devices: pd.DataFrame | None = None
) -> list[FigureFile]:
    """Every figure the data of ``frame`` (with a ``series`` column) allows, into ``out_dir``;
    with ``devices`` (per-device rows with ``series``), the per-device figure too."""
    if frame.empty:
        return []
    styles = series_styles(frame)
    figures = [f for draw in FIGURES if (f := draw(frame, out_dir, styles)) is not None]
    if devices is not None and not devices.empty:
        styles |= {s: styles.get(s) or protocol_style(str(s)) for s in set(devices["series"])}
        if (fig := device_figure(devices, out_dir, styles)) is not None:
            figures.append(fig)
    return figures
