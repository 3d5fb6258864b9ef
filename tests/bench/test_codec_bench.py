"""``tensorwire bench codec``'s auto case: auto and raw encodes alternate (the machine's drift
hits both alike) and the ratio is taken per round; auto picks raw for incompressible data."""

from __future__ import annotations

import math

from tensorwire.bench.codec import _interleaved_s, bench_auto_incompressible


def test_trials_alternate_after_one_warm_up_each():
    calls: list[str] = []
    times = _interleaved_s([lambda: calls.append("a"), lambda: calls.append("b")], 3)
    assert calls == ["a", "b"] * 4  # the warm-ups, then three rounds
    assert [len(t) for t in times] == [3, 3]
    assert all(t >= 0 for spent in times for t in spent)


def test_auto_on_incompressible_data_picks_raw_and_is_compared_round_by_round():
    row = bench_auto_incompressible(repeat=1)
    assert row["codec"] == "raw"
    assert math.isfinite(row["auto_vs_raw"]) and row["auto_vs_raw"] > 0
    assert row["auto_encode_ms"] > 0 and row["raw_encode_ms"] > 0
