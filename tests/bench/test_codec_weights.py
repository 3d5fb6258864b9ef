"""``bench codec`` on weights: every contender on the same bytes, given back bit-exact."""

from __future__ import annotations

import numpy as np
from typer.testing import CliRunner

from tensorwire.bench.codec_weights import as_bits, bench_case
from tensorwire.cli.app import app
from tensorwire.codecs.zl_planes import zl_available


def test_every_contender_runs_on_the_same_bytes_and_floatplanes_shrinks_floats() -> None:
    weights = (np.random.default_rng(1).standard_normal(100_000) * 0.05).astype(np.float32)
    for dtype in ("float32", "bfloat16"):
        rows = {r["codec"]: r for r in bench_case(as_bits(weights, dtype), repeat=1)}
        assert {"floatplanes", "blosc2 zstd+shuffle", "zstd-3", "lz4"} <= set(rows)
        assert rows["floatplanes"]["ratio"] > 1.15
        if zl_available():  # floatplanes' planes, OpenZL's Huffman: within 0.5 % of its ratio
            assert rows["floatplanes-zl"]["ratio"] > rows["floatplanes"]["ratio"] / 1.005
        assert all(r["compress_GBps"] > 0 and r["decompress_GBps"] > 0 for r in rows.values())


def test_an_unknown_model_is_a_usage_error_before_anything_runs() -> None:
    result = CliRunner().invoke(app, ["bench", "codec", "--models", "vgg5,alexnet"])
    assert result.exit_code == 2
    assert "alexnet" in result.output and "resnet18" in result.output
