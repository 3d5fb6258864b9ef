"""Error feedback and the lossy selectors: residuals, momentum, what goes raw, chains."""

from __future__ import annotations

import functools

import numpy as np
import pytest

from tensorwire.codecs import Codec, Zstd, get_codec
from tensorwire.codecs.lossy import (
    DGC,
    FEEDBACK_BY_DEFAULT,
    LOSSY_CODECS,
    ErrorFeedback,
    FeedbackCodec,
    Int8,
    LossySelector,
    RandomK,
    SignSGD,
    TopK,
    lossy_selector,
)
from tensorwire.errors import CodecConfigError
from tensorwire.wire import PREFIX_SIZE, Limits, decode_message, encode_message
from tensorwire.wire.format import parse_header, parse_prefix


def gradients(rounds: int, shape: tuple[int, ...] = (64, 100), seed: int = 0) -> list:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(shape).astype(np.float32) for _ in range(rounds)]


def send(selector, tensors: dict) -> dict:
    """Encode with ``selector`` and decode as a receiver would (registry only)."""
    data = encode_message(tensors, codecs=selector).to_bytes()
    return decode_message(data, codec_lookup=get_codec).tensors


def chains(selector, tensors: dict) -> list[list[str]]:
    """The codec ids each tensor's header entry lists, in order."""
    view = memoryview(encode_message(tensors, codecs=selector).to_bytes())
    prefix = parse_prefix(view, Limits())
    plan = parse_header(view[PREFIX_SIZE : PREFIX_SIZE + prefix.header_length], prefix, Limits())
    return [[c["id"] for c in spec.codecs] for spec in plan.tensors]


@pytest.mark.parametrize(
    "factory",
    [
        functools.partial(TopK, ratio=0.05),
        functools.partial(RandomK, ratio=0.05, seed=1),
        functools.partial(DGC, ratio=0.05, seed=1),
        SignSGD,
        Int8,
    ],
    ids=lambda f: getattr(f, "func", f).codec_id,
)
@pytest.mark.parametrize("lossless", [None, Zstd(level=1)], ids=["alone", "zstd"])
def test_residual_is_what_was_dropped_and_is_sent_next_round(factory, lossless) -> None:
    ef = ErrorFeedback(factory, lossless=lossless)
    residual = np.zeros((64, 100), dtype=np.float32)
    received_total = np.zeros_like(residual)
    sent_total = np.zeros_like(residual)
    for g in gradients(4):
        x = g + residual  # what this round compresses
        got = send(ef, {"g": g})["g"]
        residual = x - got
        np.testing.assert_array_equal(ef.residual("g"), residual)
        received_total += got
        sent_total += g
    # Nothing is lost for good: what arrived plus what is held back is what was sent.
    np.testing.assert_allclose(received_total + residual, sent_total, atol=1e-5)


def test_top_k_feedback_sends_the_dropped_entries_later() -> None:
    ef = ErrorFeedback(functools.partial(TopK, ratio=0.002), min_size=0)  # k = 2
    g = np.zeros(1000, dtype=np.float32)
    g[:4] = [4.0, 3.0, 2.0, 1.0]
    np.testing.assert_array_equal(send(ef, {"g": g})["g"][:4], [4, 3, 0, 0])
    np.testing.assert_array_equal(ef.residual("g")[:4], [0, 0, 2, 1])
    # Next round x = g + residual = [4, 3, 4, 2]: the held-back 2 wins its place.
    np.testing.assert_array_equal(send(ef, {"g": g})["g"][:4], [4, 0, 4, 0])
    np.testing.assert_array_equal(ef.residual("g")[:4], [0, 3, 0, 2])


def test_a_snapshot_puts_the_memory_back_as_before_an_update_that_was_not_applied() -> None:
    ef = ErrorFeedback(functools.partial(RandomK, ratio=0.05, seed=3), min_size=0)
    g1, g2, g3 = gradients(3)
    send(ef, {"g": g1})
    before = ef.snapshot()
    kept = ef.residual("g")
    lost = send(ef, {"g": g2})["g"]  # an update the server never applied
    assert not np.array_equal(ef.residual("g"), kept)
    ef.restore(before)
    np.testing.assert_array_equal(ef.residual("g"), kept)
    again = send(ef, {"g": g2})["g"]  # the same random stream: the same choice as before
    np.testing.assert_array_equal(again, lost)
    ef.restore(before)  # a snapshot stays usable
    np.testing.assert_array_equal(ef.residual("g"), kept)
    send(ef, {"g": g3})
    assert not np.array_equal(ef.residual("g"), kept)


def test_dgc_momentum_correction_and_masking() -> None:
    m = 0.9
    ef = ErrorFeedback(functools.partial(TopK, ratio=0.25), min_size=0, momentum=m)
    u = np.zeros(8, dtype=np.float32)
    v = np.zeros(8, dtype=np.float32)
    for g in gradients(5, shape=(8,), seed=3):
        u = m * u + g
        v = v + u
        got = send(ef, {"g": g})["g"]
        keep = np.argsort(-np.abs(v), kind="stable")[:2]
        expected = np.zeros_like(v)
        expected[keep] = v[keep]
        np.testing.assert_array_equal(got, expected)
        v = v - got
        u[got != 0] = 0
        np.testing.assert_array_equal(ef.residual("g"), v)


def test_small_and_non_float_tensors_go_raw_untouched() -> None:
    ef = ErrorFeedback(TopK, min_size=4096)
    tensors = {
        "conv": np.ones((32, 32), dtype=np.float32),  # 4096 bytes: compressed
        "bias": np.ones(1023, dtype=np.float32),
        "num_batches_tracked": np.int64(7),
        "counts": np.arange(5000, dtype=np.int64),
    }
    assert chains(ef, tensors) == [["topk"], [], [], []]
    got = send(ef, tensors)
    for name in ("bias", "num_batches_tracked", "counts"):
        np.testing.assert_array_equal(got[name], tensors[name])
        assert ef.residual(name) is None


def test_a_tensor_sent_raw_keeps_its_residual() -> None:
    # ratio 1 sends 8 bytes an element: larger than raw, so the encoder sends it raw.
    ef = ErrorFeedback(functools.partial(TopK, ratio=1.0), min_size=0)
    g = gradients(1)[0]
    assert chains(ef, {"g": g}) == [[]]
    np.testing.assert_array_equal(send(ef, {"g": g})["g"], g)
    np.testing.assert_array_equal(ef.residual("g"), np.zeros_like(g))


class _Padding(Codec):
    """A lossless stage that appends ``pad`` zero bytes (to make a chain not pay off)."""

    codec_id = "test-padding"

    def __init__(self, pad: int = 0) -> None:
        self.pad = pad

    def encode(self, buf):
        return bytes(buf) + bytes(self.pad)

    def decode(self, buf, out=None, *, max_size=0):
        raise NotImplementedError


def test_a_chain_that_does_not_pay_off_leaves_the_residual_as_it_was() -> None:
    padding = _Padding()
    ef = ErrorFeedback(functools.partial(TopK, ratio=0.1), lossless=padding)
    first, second = gradients(2)
    assert chains(ef, {"g": first}) == [["topk", "test-padding"]]
    kept = ef.residual("g")
    assert np.abs(kept).sum() > 0
    padding.pad = second.nbytes  # now the chain's output is larger than the tensor
    assert chains(ef, {"g": second}) == [[]]
    np.testing.assert_array_equal(ef.residual("g"), kept)


def test_feedback_codec_gives_the_compressor_config_and_encodes_once() -> None:
    ef = ErrorFeedback(functools.partial(TopK, ratio=0.1))
    g = gradients(1)[0]
    (codec,) = ef("g", g)
    assert isinstance(codec, FeedbackCodec)
    assert codec.get_config() == {"id": "topk", "dtype": "float32", "ratio": 0.1}
    payload = codec.encode(g)
    out = np.empty_like(g)
    get_codec(codec.get_config()).decode(payload, out=out)
    np.testing.assert_array_equal(codec.decode(payload), out.view(np.uint8).ravel())
    with pytest.raises(RuntimeError):
        codec.encode(g)


def test_reset_and_reshape_start_afresh() -> None:
    ef = ErrorFeedback(TopK, min_size=0)
    a, b = gradients(2)
    send(ef, {"a": a, "b": b})
    assert ef.residual("a") is not None and ef.residual("b") is not None
    ef.reset("a")
    assert ef.residual("a") is None and ef.residual("b") is not None
    send(ef, {"b": b.reshape(-1)[:100]})
    np.testing.assert_array_equal(ef.residual("b").shape, (100,))
    ef.reset()
    assert ef.residual("b") is None


def test_fortran_ordered_tensors_keep_their_layout() -> None:
    ef = ErrorFeedback(functools.partial(TopK, ratio=0.1), min_size=0)
    g = np.asfortranarray(gradients(1)[0])
    got = send(ef, {"g": g})["g"]
    np.testing.assert_array_equal(ef.residual("g"), g - got)


def test_error_feedback_refuses_bad_settings() -> None:
    with pytest.raises(CodecConfigError, match="sparsifying"):
        ErrorFeedback(SignSGD, momentum=0.9)
    with pytest.raises(CodecConfigError, match="momentum"):
        ErrorFeedback(TopK, momentum=1.0)
    with pytest.raises(CodecConfigError, match="min_size"):
        ErrorFeedback(TopK, min_size=-1)
    with pytest.raises(CodecConfigError, match="ratio"):
        ErrorFeedback(functools.partial(TopK, ratio=2))


# --- lossy_selector ----------------------------------------------------------------------


@pytest.mark.parametrize("name", list(LOSSY_CODECS))
def test_every_compressor_round_trips_through_its_selector(name: str) -> None:
    selector = lossy_selector(name)
    assert isinstance(selector, ErrorFeedback) == (name in FEEDBACK_BY_DEFAULT)
    w = gradients(1, shape=(128, 128))[0]
    tensors = {"w": w, "bias": w[0, :10].copy(), "step": np.int64(1)}
    expected_chain = {"qsgd": ["qsgd", "zstd"], "topk": ["topk", "zstd"], "dgc": ["dgc", "zstd"]}
    assert chains(selector, tensors) == [expected_chain.get(name, [name]), [], []]
    got = send(selector, tensors)
    assert got["w"].dtype == np.float32 and got["w"].shape == w.shape
    np.testing.assert_array_equal(got["bias"], tensors["bias"])


def test_selector_sizes() -> None:
    w = gradients(1, shape=(1000, 1000))[0]
    sizes = {
        name: encode_message({"w": w}, codecs=lossy_selector(name)).nbytes / w.nbytes
        for name in LOSSY_CODECS
    }
    assert sizes["fp16"] < 0.51 and sizes["bf16"] < 0.51
    assert sizes["int8"] < 0.26 and sizes["qsgd"] < 0.26
    assert sizes["topk"] < 0.015 and sizes["dgc"] < 0.015  # zstd on the index gaps
    assert sizes["randomk"] < 0.011 and sizes["signsgd"] < 0.032


def test_selector_options() -> None:
    assert lossy_selector("none")("w", np.ones(10_000, dtype=np.float32)) == []
    plain = lossy_selector("topk", ratio=0.1, error_feedback=False, lossless=None)
    assert isinstance(plain, LossySelector)
    assert plain("w", np.ones(10_000, dtype=np.float32)) == [TopK("float32", ratio=0.1)]
    assert plain("w", np.ones(10_000, dtype=np.float64)) == [TopK("float64", ratio=0.1)]
    assert plain("w", np.ones(100, dtype=np.float32)) == []
    chained = lossy_selector("int8", lossless="lz4", error_feedback=False, block_size=64)
    assert [c.get_config()["id"] for c in chained("w", np.ones(10_000))] == ["int8", "lz4"]
    with_momentum = lossy_selector("dgc", momentum=0.9, ratio=0.001)
    assert isinstance(with_momentum, ErrorFeedback) and with_momentum.momentum == 0.9


@pytest.mark.parametrize(
    ("args", "kwargs", "match"),
    [
        (("zstd",), {}, "unknown lossy"),
        (("topk",), {"dtype": "float32"}, "dtype"),
        (("topk",), {"ratio": 0}, "ratio"),
        (("topk",), {"levels": 3}, "bad parameters"),
        (("qsgd",), {"momentum": 0.9}, "error_feedback"),
        (("topk",), {"lossless": "nope"}, "nope"),
        (("topk",), {"lossless": "randomk"}, "lossless"),
    ],
)
def test_selector_refuses_bad_arguments(args, kwargs, match) -> None:
    with pytest.raises(CodecConfigError, match=match):
        lossy_selector(*args, **kwargs)
