"""``bench fl``'s numbers say what they are: the terminal table names its sums and explains
the bound, a figure that does not apply is n/a (not 0), a count's axis has whole ticks, the
report lists only settings the run used, and the time a run is announced to take is within
1.5x of what quick runs took here."""

from __future__ import annotations

import dataclasses
import json

import matplotlib

matplotlib.use("Agg")
import pandas as pd
import pytest

pytest.importorskip("torch", reason="torch is not installed (extra 'fl')")

from tensorwire.bench import fl_figures
from tensorwire.bench.fl_figures import draw_figures
from tensorwire.bench.fl_matrix import Matrix
from tensorwire.bench.fl_results import TABLE
from tensorwire.bench.report import shown_settings
from tensorwire.cli.bench_fl import TABLE_NOTE, _print_fl_table
from tensorwire.cli.console import console
from tensorwire.cli.fl_estimate import QUICK_RUNS_S, estimate_seconds


def _rows(protocol: str, retrans: float | None) -> list[dict]:
    return [
        {
            "key": f"{protocol}_k",
            "protocol": protocol,
            "series": protocol,
            "model": "vgg5",
            "profile": "4g",
            "loss": 0.0,
            "stress": "none",
            "codec": "auto",
            "epochs": 1,
            "security": "none",
            "topology": "star",
            "links": "uniform",
            "rep": 0,
            "round": r,
            "rounds_total": 3,
            "label": "netns 4g: 20 Mbit/s",
            "shaped": True,
            "accuracy": 0.5,
            "comm_s": 8.0,
            "lower_bound_s": 7.5,
            "encode_s": 0.01,
            "wait_s": 0.1,
            "wire_s": 7.8,
            "decode_s": 0.02,
            "payload_bytes": 18.7e6,
            "wire_bytes": 19.9e6,
            # one segment in three rounds for tcp; udp's data is not TCP's
            "retrans_segs": (1.0 if r == 1 else 0.0) if retrans is not None else float("nan"),
        }
        for r in (1, 2, 3)
    ]


@pytest.fixture
def frame() -> pd.DataFrame:
    return pd.DataFrame(_rows("tcp", 1.0) + _rows("udp", None))


def test_the_terminal_table_names_its_sums_explains_the_bound_and_says_n_a(
    tmp_path, frame, monkeypatch
):
    # the width a terminal-less run gets (a narrower terminal folds headers over lines)
    monkeypatch.setattr(console, "width", 160)
    frame.to_parquet(tmp_path / TABLE, index=False)
    (tmp_path / "manifest.json").write_text(json.dumps({"label": "netns 4g"}))
    with console.capture() as captured:
        _print_fl_table(tmp_path)
    text = captured.get()
    assert "comm s/round (sum over devices)" in " ".join(text.split())
    assert "not how long a round" in " ".join(text.split()) and "bound s/round" in TABLE_NOTE
    udp = next(line for line in text.splitlines() if " udp " in line)
    assert "n/a" in udp  # TCP retransmissions: not 0 for a protocol that is not TCP


def test_the_retransmission_axis_counts_whole_segments(tmp_path, frame, monkeypatch):
    seen = {}
    save = fl_figures.traffic.save_figure

    def keep(fig, out_dir, name, title, caption):
        ax = fig.axes[0]
        seen[name] = (ax.get_ylim(), [t for t in ax.get_yticks() if 0 <= t <= ax.get_ylim()[1]])
        return save(fig, out_dir, name, title, caption)

    monkeypatch.setattr(fl_figures.traffic, "save_figure", keep)
    draw_figures(frame, tmp_path)
    (low, high), ticks = seen["retransmissions"]
    assert low == 0 and high >= 1.0  # a third of a segment per round is not the scale
    assert ticks and all(float(t).is_integer() for t in ticks)


def test_the_report_lists_the_network_load_only_with_network_stress():
    quiet = {"matrix": dataclasses.asdict(Matrix(protocols=("tcp",)))}
    assert "network_mbit" not in shown_settings(quiet)
    loaded = {"matrix": dataclasses.asdict(Matrix(protocols=("tcp",), stresses=("network",)))}
    assert shown_settings(loaded)["network_mbit"] == 250.0
    assert "network_mbit" not in shown_settings({"experiment": {"stress": "cpu"}})


QUICK_RUNS_PROTOCOLS = ("tcp", "zmq", "udp", "amqp", "mqtt", "flight", "quic")  # QUICK_RUNS_S's


def test_the_quick_run_estimate_is_within_one_and_a_half_times_the_runs_here():
    quick = Matrix.quick()  # with the protocols those runs ran (ucx's extra adds one here)
    estimate = estimate_seconds(dataclasses.replace(quick, protocols=QUICK_RUNS_PROTOCOLS), cores=2)
    for measured in QUICK_RUNS_S:
        assert measured / 1.5 <= estimate <= measured * 1.5, (estimate, measured)
