"""The lossy compressors: their error bounds, selections, sizes and wire round trips."""

from __future__ import annotations

import functools
import math

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from tensorwire.codecs import available_codecs, get_codec
from tensorwire.codecs.lossy import (
    BF16,
    DGC,
    FLOAT_DTYPES,
    FP16,
    QSGD,
    Int8,
    LossyCodec,
    RandomK,
    SignSGD,
    TopK,
)
from tensorwire.codecs.lossy.randomk import random_indices
from tensorwire.codecs.lossy.topk import PREFILTER_MIN
from tensorwire.errors import CodecConfigError, CodecDataError, DecompressedSizeMismatch
from tensorwire.wire import PREFIX_SIZE, Limits, decode_message, encode_message
from tensorwire.wire.dtypes import WIRE_DTYPES
from tensorwire.wire.format import parse_header, parse_prefix

IDS = ["fp16", "bf16", "int8", "qsgd", "topk", "randomk", "dgc", "signsgd"]

SETUPS = [
    (FP16, {}),
    (BF16, {}),
    (Int8, {}),
    (Int8, {"block_size": 7}),
    (QSGD, {"seed": 1}),
    (QSGD, {"levels": 7, "block_size": 100, "seed": 2}),
    (QSGD, {"levels": 1, "seed": 3}),
    (TopK, {}),
    (TopK, {"ratio": 0.3}),
    (RandomK, {"seed": 4}),
    (DGC, {"seed": 5}),
    (SignSGD, {}),
]
SETUP_IDS = [f"{cls.codec_id}{kwargs or ''}" for cls, kwargs in SETUPS]


def gradient(n: int, dtype: str = "float32", seed: int = 0) -> np.ndarray:
    """Heavy-tailed values with some exact zeros, like a gradient (a new array)."""
    return _gradient(n, seed).astype(WIRE_DTYPES[dtype])


@functools.cache
def _gradient(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(n) * rng.gamma(0.5, 1.0, n)
    x[rng.random(n) < 0.05] = 0.0
    return x


def decoded(codec: LossyCodec, x: np.ndarray) -> np.ndarray:
    out = np.empty_like(x)
    codec.decode(codec.encode(x), out=out)
    return out


# --- every compressor --------------------------------------------------------------------


def test_ids_are_registered() -> None:
    assert set(IDS) <= set(available_codecs())
    for codec_id, cls in zip(
        IDS, [FP16, BF16, Int8, QSGD, TopK, RandomK, DGC, SignSGD], strict=True
    ):
        assert cls.codec_id == codec_id
        assert type(get_codec({"id": codec_id, "dtype": "float32"})) is cls


@pytest.mark.parametrize(("cls", "kwargs"), SETUPS, ids=SETUP_IDS)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("n", [0, 1, 7, 1000, 4097])
def test_decode_fills_out_exactly(cls, kwargs, dtype: str, n: int) -> None:
    codec = cls(dtype, **kwargs)
    assert get_codec(codec.get_config()) == codec
    x = gradient(n, dtype)
    payload = codec.encode(x)
    guarded = np.full(x.nbytes + 64, 0xA5, dtype=np.uint8)
    assert codec.decode(payload, out=guarded[: x.nbytes]) is not None
    assert (guarded[x.nbytes :] == 0xA5).all()
    fresh = codec.decode(payload)
    assert fresh.dtype == np.uint8 and fresh.nbytes == x.nbytes
    np.testing.assert_array_equal(fresh, guarded[: x.nbytes])
    with pytest.raises(DecompressedSizeMismatch):
        codec.decode(payload, out=np.empty(x.nbytes + x.itemsize, dtype=np.uint8))
    if n:
        with pytest.raises(DecompressedSizeMismatch):
            codec.decode(payload, max_size=x.nbytes - 1)


@pytest.mark.parametrize(("cls", "kwargs"), SETUPS, ids=SETUP_IDS)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_round_trip_through_a_message(cls, kwargs, dtype: str) -> None:
    codec = cls(dtype, **kwargs)
    x = gradient(3000, dtype).reshape(30, 100)
    message = encode_message(
        {"w": x, "step": np.int64(3)}, codecs=lambda name, a: [codec] if name == "w" else []
    )
    entry = _header_entries(message.to_bytes())[0]
    got = decode_message(message.to_bytes(), codec_lookup=get_codec)
    assert got["w"].dtype == x.dtype and got["w"].shape == x.shape
    assert got["step"] == 3
    if cls in (FP16, BF16) and x.itemsize == 2:  # no smaller: the encoder sends it raw
        assert entry.codecs == ()
        np.testing.assert_array_equal(got["w"], x)
        return
    assert list(entry.codecs) == [codec.get_config()]  # the header carries the config
    expected = np.empty_like(x)
    codec.decode(message.buffers[0], out=expected)
    np.testing.assert_array_equal(got["w"], expected)


def _header_entries(data: bytes) -> list:
    view = memoryview(data)
    prefix = parse_prefix(view, Limits())
    header = view[PREFIX_SIZE : PREFIX_SIZE + prefix.header_length]
    return parse_header(header, prefix, Limits()).tensors


@pytest.mark.parametrize("codec_id", ["int8", "qsgd", "topk", "dgc", "signsgd"])
def test_nan_is_refused_at_encode(codec_id: str) -> None:
    x = gradient(5000)
    x[1234] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        get_codec({"id": codec_id, "dtype": "float32"}).encode(x)


def test_elements_of_another_dtype_are_refused() -> None:
    with pytest.raises(ValueError, match="float32"):
        TopK("float32").encode(np.zeros(10, dtype=np.float64))
    with pytest.raises(ValueError, match="whole number"):
        TopK("float32").encode(b"\0" * 7)
    with pytest.raises(CodecConfigError, match="8-byte"):
        TopK("float32").for_itemsize(8)
    assert TopK("float64").for_itemsize(8) == TopK("float64")


@pytest.mark.parametrize(
    "config",
    [
        {"id": "topk"},
        {"id": "topk", "dtype": "int64"},
        {"id": "topk", "dtype": "float32", "ratio": 0},
        {"id": "topk", "dtype": "float32", "ratio": 1.5},
        {"id": "topk", "dtype": "float32", "ratio": float("nan")},
        {"id": "randomk", "dtype": "float32", "seed": -1},
        {"id": "randomk", "dtype": "float32", "seed": 1 << 64},
        {"id": "qsgd", "dtype": "float32", "levels": 0},
        {"id": "qsgd", "dtype": "float32", "levels": 128},
        {"id": "int8", "dtype": "float32", "block_size": 0},
        {"id": "dgc", "dtype": "float32", "sample_ratio": 2},
        {"id": "signsgd", "dtype": "float32", "extra": 1},
    ],
)
def test_hostile_configs_are_refused(config: dict) -> None:
    with pytest.raises(CodecDataError):
        get_codec(config)


# --- casts -------------------------------------------------------------------------------


def _half_ulp(x: np.ndarray, mantissa_bits: int, min_exponent: int) -> np.ndarray:
    """Half the spacing of a float with ``mantissa_bits`` at each |x| (float64)."""
    _, e = np.frexp(np.abs(x.astype(np.float64)))
    return np.ldexp(0.5, np.maximum(e - 1, min_exponent) - mantissa_bits)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize(("cls", "bits", "min_exp"), [(FP16, 10, -14), (BF16, 7, -126)])
def test_casts_err_by_at_most_half_an_ulp(dtype: str, cls, bits: int, min_exp: int) -> None:
    rng = np.random.default_rng(1)
    x = rng.standard_normal(200_000) * 10.0 ** rng.uniform(-9, 4.5, 200_000)
    x = x[np.abs(x) < 65504].astype(dtype)  # fp16's range: beyond, it is inf
    xhat = decoded(cls(dtype), x)
    bound = _half_ulp(x, bits, min_exp)
    if cls is BF16 and dtype == "float64":  # ml_dtypes rounds float64 through float32
        bound += _half_ulp(x, 23, -126)
    error = np.abs(x.astype(np.float64) - xhat.astype(np.float64))
    assert (error <= bound).all()
    assert cls(dtype).encode(x).nbytes == x.size * 2


def test_fp16_overflows_to_infinity_like_torch() -> None:
    x = np.array([65504, 65520, -1e6, 6e-8, 1e-9], dtype=np.float32)
    expected = [65504, np.inf, -np.inf, 5.960464477539063e-08, 0]
    np.testing.assert_array_equal(decoded(FP16("float32"), x), expected)


# --- int8 --------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("block_size", [1, 100, 4096, 1 << 20])
def test_int8_error_within_half_a_scale(dtype: str, block_size: int) -> None:
    codec = Int8(dtype, block_size=block_size)
    x = gradient(50_001, dtype, seed=2)
    payload = codec.encode(x)
    nblocks = -(-x.size // block_size)
    scales = np.frombuffer(payload, "<f4", nblocks, offset=8).astype(np.float64)
    x64 = x.astype(np.float64)
    per_element = np.repeat(scales, block_size)[: x.size]
    out = np.empty_like(x)
    codec.decode(payload, out=out)
    error = np.abs(x64 - out.astype(np.float64))
    rounding = {"float16": 2**-11, "bfloat16": 2**-8}.get(dtype, 2**-24) * np.abs(x64)
    assert (error <= per_element / 2 * (1 + 1e-5) + rounding).all()
    # The per-block scales never exceed the per-tensor one: max|x| / 127.
    assert scales.max() <= np.abs(x64).max() / 127 * (1 + 1e-6)
    assert payload.nbytes == 8 + 4 * nblocks + x.size


def test_int8_sends_zeros_and_extremes_exactly() -> None:
    x = np.array([0, 127, -127, 0, 0, 1, -1], dtype=np.float32)
    np.testing.assert_array_equal(decoded(Int8("float32"), x), x)


# --- qsgd --------------------------------------------------------------------------------


@pytest.mark.parametrize("levels", [1, 7, 127])
def test_qsgd_is_unbiased(levels: int) -> None:
    x = gradient(64, seed=3)
    codec = QSGD("float32", levels=levels, block_size=64, seed=levels)
    rounds = 4000
    total = np.zeros(x.size)
    for _ in range(rounds):
        total += decoded(codec, x)
    mean = total / rounds
    # Each decode is within one step (norm / levels) of x: variance at most step² / 4.
    step = np.linalg.norm(x.astype(np.float64)) / levels
    assert np.abs(mean - x).max() <= 5 * step / 2 / math.sqrt(rounds)


def test_qsgd_levels_are_whole_steps_with_the_sign_of_x() -> None:
    x = gradient(10_000, seed=4)
    codec = QSGD("float32", levels=7, block_size=10_000, seed=0)
    payload = codec.encode(x)
    norm = np.frombuffer(payload, "<f4", 1, offset=8)[0]
    assert norm >= np.linalg.norm(x.astype(np.float64))
    xhat = np.empty_like(x)
    codec.decode(payload, out=xhat)
    levels = xhat.astype(np.float64) * 7 / norm
    np.testing.assert_allclose(levels, np.rint(levels), atol=1e-4)
    assert (np.abs(levels) <= 7 + 1e-4).all()
    assert (np.sign(xhat) * np.sign(x) >= 0).all()
    assert payload.nbytes == 8 + 4 + 5000  # 4-bit codes


def test_qsgd_seed_reproduces_the_stream() -> None:
    x = gradient(5000)
    a, b = QSGD("float32", seed=9), QSGD("float32", seed=9)
    first = [bytes(a.encode(x)) for _ in range(3)]
    assert first == [bytes(b.encode(x)) for _ in range(3)]
    assert first[0] != first[1]  # the stream goes on: rounds are not correlated


# --- top-k and dgc -----------------------------------------------------------------------


def reference_top_k(x: np.ndarray, k: int) -> np.ndarray:
    """The k largest |x|, ties to the lowest index, by a stable sort."""
    order = np.lexsort((np.arange(x.size), -np.abs(x.astype(np.float64))))
    return np.sort(order[:k])


@given(
    hnp.arrays(np.float32, st.integers(1, 300), elements=st.sampled_from([0.0, 1.0, -1.0, 2.5])),
    st.floats(0.001, 1.0),
)
def test_top_k_keeps_the_k_largest_ties_to_lowest_index(x: np.ndarray, ratio: float) -> None:
    codec = TopK("float32", ratio=ratio)
    k = math.ceil(ratio * x.size - 1e-6)
    keep = reference_top_k(x, max(k, 1))
    expected = np.zeros_like(x)
    expected[keep] = x[keep]
    np.testing.assert_array_equal(decoded(codec, x), expected)


@pytest.mark.parametrize(
    "kind", ["gaussian", "ties_at_the_cut", "periodic", "few_nonzero", "constant"]
)
@pytest.mark.parametrize("ratio", [0.0001, 0.01, 0.1, 0.5])
def test_top_k_is_exact_on_large_tensors(kind: str, ratio: float) -> None:
    n = PREFILTER_MIN * 4 + 3
    rng = np.random.default_rng(5)
    x = {
        "gaussian": lambda: rng.standard_normal(n),
        "ties_at_the_cut": lambda: rng.integers(-3, 4, n).astype(float),
        "periodic": lambda: np.resize([9.0, 0, 0, 0, 0, 0, 0, 1.5], n),
        "few_nonzero": lambda: np.where(rng.random(n) < 0.001, 1.0, 0.0),
        "constant": lambda: np.full(n, -2.0),
    }[kind]().astype(np.float32)
    codec = TopK("float32", ratio=ratio)
    k = math.ceil(ratio * n)
    keep = reference_top_k(x, k)
    expected = np.zeros_like(x)
    expected[keep] = x[keep]
    np.testing.assert_array_equal(decoded(codec, x), expected)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_top_k_one_percent_payload_is_small(dtype: str) -> None:
    x = gradient(1_000_000, dtype)
    payload = TopK(dtype, ratio=0.01).encode(x)
    entries = 10_000 + x.size // 65536  # at most that many zero bridges
    assert payload.nbytes <= 16 + entries * (x.itemsize + 2)
    if dtype == "float32":
        assert payload.nbytes <= 0.08 * x.nbytes
        assert payload.nbytes <= 0.0151 * x.nbytes  # 16-bit index gaps: 6 bytes an entry


@pytest.mark.parametrize("far", [65535, 65536, 65537, 200_000])
def test_long_gaps_are_bridged_with_zero_entries(far: int) -> None:
    x = np.zeros(far + 1, dtype=np.float32)
    x[[0, far]] = [1.0, -2.0]
    codec = TopK("float32", ratio=2 / x.size)
    payload = codec.encode(x)
    entries = 2 + (far - 1) // 65536  # the gap is far - 1 positions
    assert payload.nbytes == 16 + entries * (4 + 2)
    np.testing.assert_array_equal(decoded(codec, x), x)


def test_dgc_keeps_at_most_k_of_the_largest() -> None:
    x = gradient(400_000, seed=6)
    k = 4000
    for seed in range(5):
        xhat = decoded(DGC("float32", ratio=0.01, seed=seed), x)
        sent = xhat != 0
        assert 0.8 * k <= np.count_nonzero(sent) <= k
        np.testing.assert_array_equal(xhat[sent], x[sent])
        assert np.abs(x[sent]).min() >= np.abs(x[~sent]).max()


def test_dgc_seed_reproduces_the_sample() -> None:
    x = gradient(100_000)
    assert bytes(DGC("float32", seed=3).encode(x)) == bytes(DGC("float32", seed=3).encode(x))


# --- random-k ----------------------------------------------------------------------------


_M64 = (1 << 64) - 1


def _mix(z: int) -> int:
    z ^= z >> 30
    z = (z * 0xBF58476D1CE4E5B9) & _M64
    z ^= z >> 27
    z = (z * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)


def spec_indices(n: int, k: int, seed: int) -> list[int]:
    """The randomk index permutation, written from its docstring in plain Python."""
    keys = [_mix((seed + (r + 1) * 0x9E3779B97F4A7C15) & _M64) for r in range(4)]
    h = max(1, math.ceil((n - 1).bit_length() / 2))
    mask = (1 << h) - 1
    found = []
    j = 0
    while len(found) < k:
        left, right = j >> h, j & mask
        for key in keys:
            left, right = right, left ^ (_mix((right + key) & _M64) & mask)
        if (candidate := (left << h) | right) < n:
            found.append(candidate)
        j += 1
    return found


@pytest.mark.parametrize(("n", "k"), [(1, 1), (2, 1), (5, 5), (17, 3), (1000, 10), (4097, 4000)])
@pytest.mark.parametrize("seed", [0, 1, _M64])
def test_random_k_indices_follow_the_documented_permutation(n: int, k: int, seed: int) -> None:
    assert random_indices(n, k, seed).tolist() == spec_indices(n, k, seed)


def test_random_k_sends_k_distinct_entries_and_its_seed() -> None:
    x = gradient(100_000)
    codec = RandomK("float32", ratio=0.01, seed=1)
    payload = codec.encode(x)
    assert payload.nbytes == 24 + 1000 * 4
    seed = int(np.frombuffer(payload, "<u8", 1, offset=8)[0])
    indices = random_indices(x.size, 1000, seed)
    assert np.unique(indices).size == 1000 and indices.max() < x.size
    out = np.empty_like(x)
    codec.decode(payload, out=out)
    expected = np.zeros_like(x)
    expected[indices] = x[indices]
    np.testing.assert_array_equal(out, expected)
    assert RandomK("float32", seed=1).encode(x).tobytes() == payload.tobytes()


def test_random_k_picks_every_position_about_equally() -> None:
    n, k, draws = 64, 8, 4000
    counts = np.zeros(n)
    for seed in range(draws):
        counts[random_indices(n, k, seed)] += 1
    expected = draws * k / n  # 500, standard deviation about 21
    assert np.abs(counts - expected).max() < 5 * math.sqrt(expected)


# --- sign-SGD ----------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_signsgd_decodes_to_scale_times_sign(dtype: str) -> None:
    x = gradient(10_001, dtype)
    x[:3] = [0.0, -0.0, 1.0]
    codec = SignSGD(dtype)
    payload = codec.encode(x)
    assert payload.nbytes == 12 + -(-x.size // 8)
    scale = np.frombuffer(payload, "<f4", 1, offset=8)[0]
    assert scale == np.float32(np.abs(x.astype(np.float64)).mean())
    sign = np.where(x.astype(np.float64) < 0, -1.0, 1.0)
    expected = (np.float64(scale) * sign).astype(x.dtype)
    np.testing.assert_array_equal(decoded(codec, x), expected)


# --- sizes -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("codec", "ratio"),
    [
        (FP16("float32"), 0.5),
        (BF16("float32"), 0.5),
        (Int8("float32"), 0.2503),
        (QSGD("float32"), 0.252),
        (QSGD("float32", levels=7), 0.127),
        (QSGD("float32", levels=1), 0.0645),
        (TopK("float32"), 0.0151),
        (RandomK("float32"), 0.0101),
        (DGC("float32"), 0.0151),
        (SignSGD("float32"), 0.0313),
    ],
    ids=repr,
)
def test_compression_ratios(codec: LossyCodec, ratio: float) -> None:
    x = gradient(1_000_000)
    assert codec.encode(x).nbytes <= ratio * x.nbytes


def test_bfloat16_arrays_are_taken_directly() -> None:
    x = gradient(1000, "bfloat16")
    assert x.dtype == ml_dtypes.bfloat16
    assert TopK("bfloat16").encode(x).nbytes < x.nbytes
