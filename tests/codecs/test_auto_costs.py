"""``auto`` weighs a codec at the wall time its encodes really take here (issue 29).

A sample is timed in CPU seconds; on shared cores an encode waits for a core and takes
several times that. What the wire encoder reports of the real encodes scales the codecs'
seconds (before any, the load average does), so a codec that saves less link time than it
really costs loses to raw. The load is pinned to an idle machine's (conftest) unless a test
sets it.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from tensorwire.codecs import LZ4, AutoCodec, get_codec
from tensorwire.codecs.slowdown import MAX_FACTOR, MIN_FACTOR, CodecSlowdown, cpu_contention
from tensorwire.wire import decode_message, encode_message

# 8 MiB of small whole numbers as float64: mostly zero bytes, lz4 shrinks them well
DATA = np.random.default_rng(29).integers(0, 4, size=1 << 20).astype(np.float64)


def _link_where_lz4_saves(times: float) -> float:
    """A bandwidth (bytes/s) at which what lz4 saves of DATA's wire time is ``times`` what
    lz4's encode and decode cost on a core of their own."""
    lz4 = AutoCodec(bandwidth=1e3, candidates=[LZ4()]).estimate(DATA)[1]
    assert lz4.eligible and lz4.decode_seconds is not None
    saved_bytes = (1.0 - lz4.ratio) * DATA.nbytes
    return saved_bytes / (times * lz4.codec_seconds)


def test_compression_pays_until_the_encodes_really_take_far_longer() -> None:
    auto = AutoCodec(bandwidth=_link_where_lz4_saves(20.0), candidates=[LZ4()])
    chain = auto.select("w", DATA)
    assert [type(c) for c in chain] == [LZ4]  # saves 20 times its CPU cost: it pays
    assert auto.codec_slowdown() == 1.0
    # The real encodes take far longer than the sample said (cores shared with other work):
    # the codec now costs more than it saves, and the same stream goes raw, unsampled again.
    wire_seconds = DATA.nbytes / auto.bandwidth
    auto.observe("w", DATA, chain, DATA.nbytes // 4, seconds=wire_seconds)
    assert auto.codec_slowdown() > 20.0
    assert auto.select("w", DATA) == []
    assert auto.samples == 1


def test_encodes_about_as_fast_as_sampled_keep_the_codec() -> None:
    auto = AutoCodec(bandwidth=_link_where_lz4_saves(20.0), candidates=[LZ4()])
    chain = auto.select("w", DATA)
    promised = auto.estimate(DATA)[1].encode_seconds  # another sample: within noise of it
    auto.observe("w", DATA, chain, DATA.nbytes // 4, seconds=promised)
    assert MIN_FACTOR < auto.codec_slowdown("lz4") < 10.0
    assert auto.select("w", DATA) == chain


def test_the_wire_encoder_reports_encode_seconds_and_round_trips() -> None:
    auto = AutoCodec(bandwidth=1e6)  # slow: compressing pays, however slow the codec here
    enc = encode_message({"w": DATA}, codecs=auto)
    assert enc.codec_label != "raw"
    assert auto.codec_slowdown() != 1.0  # what the encode took was heard
    assert encode_message({"w": DATA}, codecs=auto).codec_label == enc.codec_label
    np.testing.assert_array_equal(decode_message(enc.to_bytes(), codec_lookup=get_codec)["w"], DATA)


def test_before_any_encode_is_heard_the_load_sets_the_slowdown(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    bandwidth = _link_where_lz4_saves(20.0)
    monkeypatch.setattr("tensorwire.codecs.slowdown.cpu_contention", lambda: 50.0)
    busy = AutoCodec(bandwidth=bandwidth, candidates=[LZ4()])
    assert busy.codec_slowdown() == 50.0  # 50 runnable threads per CPU
    assert busy.select("w", DATA) == []  # lz4 saves 20 times its cost on a core of its own


def test_cpu_contention_is_at_least_one() -> None:
    assert 1.0 <= cpu_contention() <= MAX_FACTOR


def test_slowdown_is_wall_over_promised_per_codec_decayed_and_bounded() -> None:
    slow = CodecSlowdown(decay=0.5, prior=lambda: 1.0)
    assert slow.factor() == slow.factor("lz4") == 1.0  # nothing heard
    slow.heard("lz4", 3.0, 1.0)
    assert slow.factor("lz4") == pytest.approx(3.0)
    slow.heard("lz4", 1.0, 1.0)  # (0.5 * 3 + 1) / (0.5 * 1 + 1)
    assert slow.factor("lz4") == pytest.approx(2.5 / 1.5)
    for bad in ((math.nan, 1.0), (1.0, 0.0), (1.0, math.inf), (-1.0, 1.0), (math.inf, 1.0)):
        slow.heard("lz4", *bad)
    assert slow.factor("lz4") == pytest.approx(2.5 / 1.5)  # none of those counted
    slow.heard("zstd", 1.0, 1.0)
    assert slow.factor("zstd") == pytest.approx(1.0)  # each codec its own
    assert slow.factor("blosc2") == slow.factor() == pytest.approx(2.25 / 1.75)  # not heard: all
    slow.heard("lz4", 1e9, 1.0)
    assert slow.factor("lz4") == MAX_FACTOR
    fast = CodecSlowdown(prior=lambda: 7.0)
    assert fast.factor("lz4") == fast.factor() == 7.0  # nothing heard: the prior
    fast.heard("lz4", 1e-9, 1.0)
    assert fast.factor("lz4") == MIN_FACTOR
