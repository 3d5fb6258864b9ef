"""How each series is drawn: one colour, marker and line style per protocol in every figure of
every report, a hatch and marker fill per run in a comparison, the bars' and patches' looks."""

from __future__ import annotations

import dataclasses
import zlib
from collections.abc import Callable
from typing import Any

import pandas as pd
from matplotlib.artist import Artist
from matplotlib.patches import Patch

from tensorwire.bench.fl_figures.selection import in_order
from tensorwire.bench.fl_matrix import protocol_schemes

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
SPARE_COLORS = ("#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173", "#5254a3", "#8ca252")

SPARE_MARKERS = ("<", ">", "d", "8", "H", "1", "2")

# In a comparison of runs, the runs are told apart by hatching (bars) and marker fill (lines).
_RUN_HATCHES = ("", "//", "..", "xx", "\\\\", "++")

# Two-part bars (messages and frames, none and stressed, encode and decode): the second part
# is the protocol's colour, hatched.
_SECOND_HATCH = "///"


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
        color=PROTOCOL_COLORS.get(protocol, SPARE_COLORS[spare % len(SPARE_COLORS)]),
        marker=PROTOCOL_MARKERS.get(protocol, SPARE_MARKERS[spare % len(SPARE_MARKERS)]),
        linestyle=PROTOCOL_LINES.get(protocol, "-"),
    )


def series_styles(frame: pd.DataFrame) -> dict[str, Style]:
    """Each ``series`` of ``frame``: its protocol's style, and in a comparison of several
    runs a hatch and marker fill per run."""
    runs = in_order(frame["run"]) if "run" in frame else []
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


def bar_style(style: Style, second: bool = False) -> dict[str, Any]:
    hatch = style.hatch + (_SECOND_HATCH if second else "")
    return {
        "color": style.color,
        "alpha": 0.55 if second else 1.0,
        "hatch": hatch or None,
        "edgecolor": "white" if hatch else style.color,
        "linewidth": 0.0,
    }


def series_handles(names: list[str], styles: dict[str, Style]) -> list[Artist]:
    return [
        Patch(facecolor=styles[n].color, hatch=styles[n].hatch or None, edgecolor="white")
        for n in names
    ]


def bar_style_by_series(styles: dict[str, Style]) -> Callable[[Any, Any], dict[str, Any]]:
    return lambda group, name: bar_style(styles[name])


def patch_style(style: Style, second: bool = False) -> dict[str, Any]:
    kwargs = bar_style(style, second)
    kwargs.pop("linewidth")
    return {"facecolor": kwargs.pop("color"), **kwargs}


def registry_order(names: list) -> list:
    """Series in the registry's order of their protocols (``run: tcp`` counts as tcp), the
    unregistered after them, so legends list protocols the same way whatever ran first."""
    rank = {p: i for i, p in enumerate(_KNOWN)}
    return sorted(names, key=lambda n: rank.get(str(n).rsplit(": ", 1)[-1], len(rank)))
