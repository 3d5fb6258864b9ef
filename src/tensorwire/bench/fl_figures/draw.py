"""Every figure a table's data allows."""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path

import pandas as pd

from tensorwire.bench.fl_figures.accuracy import accuracy_figure
from tensorwire.bench.fl_figures.bound import payload_figure, ratio_figure
from tensorwire.bench.fl_figures.canvas import FigureFile
from tensorwire.bench.fl_figures.comm_time import (
    codec_figure,
    comm_time_figure,
    loss_figure,
    stress_figure,
)
from tensorwire.bench.fl_figures.devices import device_figure
from tensorwire.bench.fl_figures.styles import protocol_style, series_styles
from tensorwire.bench.fl_figures.traffic import (
    breakdown_figure,
    bytes_figure,
    retransmissions_figure,
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
