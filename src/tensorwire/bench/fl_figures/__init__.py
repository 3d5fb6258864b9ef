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

One module per idea: :mod:`.styles` (a series' look), :mod:`.selection` (which rows a
figure draws), :mod:`.canvas` (panels, legend, files), :mod:`.marks` (bars and lines), one
per kind of figure, and :mod:`.draw` (all of them); the statistics are
:mod:`tensorwire.bench.confidence`'s.
"""

from tensorwire.bench.confidence import mean_ci, t95
from tensorwire.bench.fl_figures.accuracy import accuracy_figure
from tensorwire.bench.fl_figures.bound import payload_figure, ratio_figure
from tensorwire.bench.fl_figures.canvas import (
    BOUND_LABEL,
    COMM_SUM,
    DPI,
    PANEL_HEIGHT,
    PANEL_WIDTH,
    FigureFile,
    time_unit,
)
from tensorwire.bench.fl_figures.comm_time import (
    codec_figure,
    comm_time_figure,
    loss_figure,
    stress_figure,
)
from tensorwire.bench.fl_figures.devices import device_figure
from tensorwire.bench.fl_figures.draw import FIGURES, draw_figures
from tensorwire.bench.fl_figures.marks import DODGE, grouped_bars
from tensorwire.bench.fl_figures.selection import base_rows, is_payload, reps_note
from tensorwire.bench.fl_figures.styles import (
    PROTOCOL_COLORS,
    PROTOCOL_LINES,
    PROTOCOL_MARKERS,
    Style,
    protocol_style,
    registry_order,
    series_styles,
)
from tensorwire.bench.fl_figures.traffic import (
    breakdown_figure,
    bytes_figure,
    retransmissions_figure,
)

__all__ = [
    "BOUND_LABEL",
    "COMM_SUM",
    "DODGE",
    "DPI",
    "FIGURES",
    "PANEL_HEIGHT",
    "PANEL_WIDTH",
    "PROTOCOL_COLORS",
    "PROTOCOL_LINES",
    "PROTOCOL_MARKERS",
    "FigureFile",
    "Style",
    "accuracy_figure",
    "base_rows",
    "breakdown_figure",
    "bytes_figure",
    "codec_figure",
    "comm_time_figure",
    "device_figure",
    "draw_figures",
    "grouped_bars",
    "is_payload",
    "loss_figure",
    "mean_ci",
    "payload_figure",
    "protocol_style",
    "ratio_figure",
    "registry_order",
    "reps_note",
    "retransmissions_figure",
    "series_styles",
    "stress_figure",
    "t95",
    "time_unit",
]
