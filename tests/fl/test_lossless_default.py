"""FL runs compress losslessly by default, link-aware: devices and the server use ``auto``
unless told otherwise, a lossy compressor replaces it on its link, and the name is checked
where the run's settings are."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch", reason="torch is not installed (extra 'fl')")

from tensorwire.codecs import (
    AutoCodec,
    ErrorFeedback,
    FixedChainSelector,
    LossySelector,
    Zstd,
)
from tensorwire.fl.compression import downlink_codec, uplink_codec
from tensorwire.fl.config import FLConfig, lossless_codecs


def test_both_links_use_auto_unless_told_otherwise():
    cfg = FLConfig()
    assert cfg.codec == "auto"
    assert isinstance(uplink_codec(cfg), AutoCodec)
    assert isinstance(downlink_codec(cfg), AutoCodec)
    assert uplink_codec(FLConfig(codec="none")) is None
    assert downlink_codec(FLConfig(codec="none")) is None


def test_a_named_codec_compresses_what_it_shrinks_on_both_links():
    cfg = FLConfig(codec="zstd")
    weights = np.zeros(1 << 16, np.float32)  # compressible: a codec that shrinks it is chosen
    for selector in (uplink_codec(cfg), downlink_codec(cfg)):
        assert isinstance(selector, FixedChainSelector)
        assert [c.codec_id for c in selector("w", weights)] == ["zstd"]


def test_a_lossy_link_keeps_its_compressor():
    cfg = FLConfig(uplink="topk", downlink="delta", codec="lz4")
    assert isinstance(uplink_codec(cfg), ErrorFeedback)  # top-k with its residual
    assert isinstance(uplink_codec(FLConfig(uplink="fp16", codec="lz4")), LossySelector)
    assert isinstance(downlink_codec(cfg), Zstd)  # delta: XOR, then zstd, as before


def test_an_unknown_codec_is_refused_with_the_names_there_are():
    with pytest.raises(ValueError, match="codec 'zip': choose one of none, auto") as err:
        FLConfig(codec="zip")
    assert "lz4" in str(err.value) and "fp16" not in str(err.value)  # lossy ones are not
    assert {"none", "auto", "lz4", "zstd", "blosc2"} <= set(lossless_codecs())
