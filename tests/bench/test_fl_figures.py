"""``bench fl``'s figures as a paper needs them: one title (the report's, none in the image),
error bars only from two or more repetitions (a 95 % CI, and the caption says which), a fixed
colour and marker per protocol in every figure, 300 dpi PNG + SVG, milliseconds for small
times, a legend no wider than the panels. Drawn from a made-up per-round table, so each
property can be checked against numbers chosen for it.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest
from matplotlib.container import BarContainer, ErrorbarContainer
from PIL import Image

from tensorwire.bench import fl_figures
from tensorwire.bench.fl_figures import (
    PROTOCOL_COLORS,
    PROTOCOL_LINES,
    PROTOCOL_MARKERS,
    draw_figures,
    grouped_bars,
    mean_ci,
    protocol_style,
    reps_note,
    series_styles,
    t95,
    time_unit,
)
from tensorwire.bench.fl_figures.styles import bar_style
from tensorwire.bench.report import render


def frame(
    protocols=("tcp", "mqtt"),
    reps: int = 1,
    rounds: int = 3,
    codecs=("none",),
    losses=(0.0,),
    comm_s: float = 8.0,
) -> pd.DataFrame:
    """A per-round table like ``experiments.parquet``: every protocol reaches the same
    accuracy (as lossless transports do); times differ by protocol and repetition."""
    rows = []
    for p, protocol in enumerate(protocols):
        for rep, codec, loss in itertools.product(range(reps), codecs, losses):
            key = f"{protocol}_{codec}_{loss}_rep{rep}"
            for r in range(1, rounds + 1):
                comm = comm_s * (1 + 0.1 * p + 0.02 * rep + loss)
                rows.append(
                    {
                        "key": key,
                        "protocol": protocol,
                        "series": protocol,
                        "model": "vgg5",
                        "profile": "4g",
                        "loss": loss,
                        "stress": "none",
                        "codec": codec,
                        "epochs": 1,
                        "security": "none",
                        "rep": rep,
                        "round": r,
                        "rounds_total": rounds,
                        "label": "netns 4g: 20 Mbit/s",
                        "shaped": True,
                        "accuracy": 0.2 + 0.2 * r,
                        "comm_s": comm,
                        "lower_bound_s": comm_s * 0.9,
                        "encode_s": 0.009,
                        "decode_s": 0.005,
                        "wire_s": comm - 0.014,
                        "payload_bytes": 18.7e6,
                        "wire_bytes": 19.9e6,
                        "retrans_segs": float(p + rep),
                    }
                )
    return pd.DataFrame(rows)


@pytest.fixture(scope="module")
def drawn(tmp_path_factory) -> tuple[list[fl_figures.FigureFile], Path]:
    out = tmp_path_factory.mktemp("figures")
    return draw_figures(frame(reps=1, codecs=("none", "topk 1%"), losses=(0.0, 0.05)), out), out


def test_every_figure_is_a_300_dpi_png_and_an_svg(drawn):
    figures, _ = drawn
    assert {f.name for f in figures} >= {
        "comm_time",
        "accuracy",
        "bytes",
        "retransmissions",
        "breakdown",
        "comm_time_codecs",
        "comm_time_loss",
    }
    for f in figures:
        with Image.open(f.png) as png:
            assert png.info["dpi"] == pytest.approx((300, 300), abs=0.5), f.name
            assert png.size[0] >= 1200, f"{f.name}: {png.size} is too small to print"
        assert f.svg.read_text().startswith("<?xml"), f.name


def test_the_title_is_not_in_the_image(drawn):
    figures, _ = drawn
    for f in figures:
        svg = f.svg.read_text()  # matplotlib writes each text as a comment beside its glyphs
        assert f"<!-- {f.title} -->" not in svg, f.name
        assert "<!-- vgg5 -->" not in svg, f"{f.name}: one model needs no panel title"


def test_one_repetition_draws_no_error_bars_and_the_caption_says_so(drawn):
    figures, _ = drawn
    for f in figures:
        assert "One repetition per setting, so no error bars." in f.caption, f.name
        assert "std" not in f.caption, f.name


def test_error_bars_are_the_95_percent_ci_over_repetitions():
    rows = frame(protocols=("tcp",), reps=3)
    stats = mean_ci(rows, ["protocol"], "comm_s")
    each = rows.groupby("key")["comm_s"].mean()
    assert stats["comm_s_n"].item() == 3
    assert stats["comm_s"].item() == pytest.approx(each.mean())
    assert stats["comm_s_ci"].item() == pytest.approx(t95(3) * each.std() / np.sqrt(3))
    assert mean_ci(frame(protocols=("tcp",)), ["protocol"], "comm_s")["comm_s_ci"].isna().all()
    assert reps_note(rows) == (
        "Error bars: 95 % confidence interval of the mean over 3 repetitions."
    )
    assert t95(2) == pytest.approx(12.706) and t95(31) == pytest.approx(2.04, abs=0.01)


def _bars(rows: pd.DataFrame) -> plt.Axes:
    fig, ax = plt.subplots()
    styles = series_styles(rows)
    grouped_bars(ax, rows, "profile", "series", "comm_s", lambda g, s: bar_style(styles[s]))
    plt.close(fig)
    return ax


def test_error_bars_only_where_there_are_two_repetitions():
    def error_bars(ax: plt.Axes) -> int:
        return sum(isinstance(c, ErrorbarContainer) for c in ax.containers)

    def bars(ax: plt.Axes) -> list[BarContainer]:
        return [c for c in ax.containers if isinstance(c, BarContainer)]

    one, two = _bars(frame(reps=1)), _bars(frame(reps=2))
    assert error_bars(one) == 0 and len(bars(one)) == 2
    assert error_bars(two) == 2 and all(c.errorbar is not None for c in bars(two))


def test_a_protocol_has_one_colour_in_every_figure_whatever_else_is_drawn():
    alone = series_styles(frame(protocols=("mqtt",)))
    among = series_styles(frame(protocols=("tcp", "zmq", "udp", "mqtt")))
    assert alone["mqtt"] == among["mqtt"] == protocol_style("mqtt")
    bars = _bars(frame(protocols=("udp", "mqtt")))
    colours = [
        matplotlib.colors.to_hex(c.patches[0].get_facecolor())
        for c in bars.containers
        if isinstance(c, BarContainer)
    ]
    assert colours == [PROTOCOL_COLORS["udp"], PROTOCOL_COLORS["mqtt"]]
    # a transport registered at run time gets a colour of its own, the same every time
    assert protocol_style("toy") == protocol_style("toy")  # not registered here
    assert protocol_style("toy").color not in PROTOCOL_COLORS.values()


def test_protocols_differ_in_marker_and_line_style_too():
    assert len(set(PROTOCOL_MARKERS.values())) == len(PROTOCOL_MARKERS)
    assert len(set(map(str, PROTOCOL_LINES.values()))) == len(PROTOCOL_LINES)
    assert set(PROTOCOL_MARKERS) == set(PROTOCOL_COLORS) == set(PROTOCOL_LINES)


def test_coinciding_accuracy_curves_stay_apart(tmp_path, monkeypatch):
    drawn_figures = []
    monkeypatch.setattr(
        fl_figures.accuracy, "save_figure", lambda fig, *args: drawn_figures.append(fig)
    )
    rows = frame(protocols=("tcp", "zmq", "mqtt"))  # the same accuracy in every round
    fl_figures.accuracy_figure(rows, tmp_path, series_styles(rows))
    lines = [line for line in drawn_figures[0].axes[0].lines if len(line.get_xdata()) == 3]
    plt.close(drawn_figures[0])
    assert len(lines) == 3
    assert len({tuple(line.get_ydata()) for line in lines}) == 1  # they do coincide
    assert len({tuple(line.get_xdata()) for line in lines}) == 3, "drawn on top of each other"
    assert len({line.get_marker() for line in lines}) == 3


def test_small_times_are_in_milliseconds():
    assert time_unit(pd.Series([0.004, 0.2])) == (1e3, "ms")
    assert time_unit(pd.Series([0.004, 7.8])) == (1.0, "s")
    assert time_unit(pd.Series([np.nan, 0.5]), pd.Series([0.9])) == (1e3, "ms")


def test_the_breakdown_shows_encode_and_decode_in_milliseconds(drawn):
    figures, _ = drawn
    breakdown = next(f for f in figures if f.name == "breakdown")
    svg = breakdown.svg.read_text()
    assert "<!-- encode and decode (ms) -->" in svg
    assert "milliseconds" in breakdown.caption


def test_the_legend_is_no_wider_than_the_panels():
    fig, axes = plt.subplots(1, 1, figsize=(4, 3))
    names = [f"a rather long series name number {i}" for i in range(6)]
    handles = [axes.plot([0, 1], [i, i])[0] for i in range(6)]
    fl_figures.canvas.legend_below(fig, [axes], handles, names)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    legend = fig.legends[0].get_window_extent(renderer)
    assert legend.width <= axes.get_window_extent(renderer).width
    plt.close(fig)


def test_the_report_shows_each_title_once(drawn):
    figures, out = drawn
    page = render({"run": {"label": "x"}}, frame(), figures, out.parent)
    for f in figures:
        assert page.count(f">{f.title}<") == 1, f.name
