"""``bench transfer``'s figure: every series drawn its own way, however many there are."""

from __future__ import annotations

from tensorwire.bench.baselines import load
from tensorwire.bench.figures import distinct_styles, transfer_figure
from tensorwire.transports.registry import listed_transports

BASELINES = ("socket", "pyzmq", "arrow_flight", "paho", "pika", "shm_memcpy")


def every_series() -> list[str]:
    ours = [t.label for t in listed_transports()]
    return sorted(ours + [load(b).NAME for b in BASELINES] + ["spare-a", "spare-b"])


def test_no_two_series_of_the_transfer_figure_are_drawn_alike():
    labels = every_series()
    assert len(labels) >= 16
    styles = distinct_styles(labels)
    drawn = {(s.color, s.marker, label.startswith("tensorwire-")) for label, s in styles.items()}
    assert len(drawn) == len(labels)


def test_the_transfer_figure_is_written_with_every_series_in_its_legend(tmp_path):
    rows = [
        {"case": "gsoc", "dtype": "float32", "transport": label, "bytes": b, "gb_per_s": g}
        for label in every_series()
        for b, g in ((1_000, 0.1), (1_000_000, 1.0))
    ]
    paths = transfer_figure(rows, tmp_path)
    assert [p.suffix for p in paths] == [".png", ".svg"]
    svg = paths[1].read_text()
    assert all(label in svg for label in every_series())
