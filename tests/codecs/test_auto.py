"""AutoCodec sends a tensor raw unless a codec makes the whole transfer faster."""

from __future__ import annotations

import math
import time

import ml_dtypes
import numpy as np
import pytest

from tensorwire.codecs import LZ4, AutoCodec, Blosc2, Zstd
from tensorwire.errors import CodecConfigError


@pytest.fixture(scope="module")
def random_big() -> np.ndarray:
    return np.random.default_rng(0).random((4096, 4096))  # 128 MiB of float64


def test_random_floats_go_raw_on_a_10_gbs_link(random_big: np.ndarray) -> None:
    # Shuffled, these compress to ~0.88: 1.6 ms of wire saved on 128 MiB at 10 GB/s, which no
    # codec earns back (at 1 GB/s it is 16 ms, a near tie with blosc2 on a fast machine).
    assert AutoCodec(bandwidth=1e10).select("w", random_big) == []


def test_ones_are_compressed_at_1e9() -> None:
    ones = np.ones((4096, 4096))
    chain = AutoCodec(bandwidth=1e9).select("w", ones)
    assert len(chain) == 1
    assert memoryview(chain[0].encode(ones)).nbytes < ones.nbytes // 100


def test_sampling_costs_well_under_one_percent_of_sending_raw(random_big: np.ndarray) -> None:
    auto = AutoCodec(bandwidth=1e9)
    auto.select("w", random_big)  # calibrates the candidates for this itemsize
    seconds = []
    for _ in range(5):
        start = time.process_time()
        auto.estimate(random_big)  # what sampling a stream costs (select keeps the result)
        seconds.append(time.process_time() - start)
    # CPU seconds (every thread of this process), the fewest of five runs: the cost itself,
    # not the waits for a core that a shared machine adds to wall time (beside a CPU hog the
    # fastest of five wall times was once 2.2 ms for 1.3 ms of budget).
    assert min(seconds) < 0.01 * random_big.nbytes / 1e9


def test_on_a_slow_link_even_a_small_saving_pays() -> None:
    data = np.random.default_rng(1).random(1 << 20)  # 8 MiB, shuffling saves ~12 %
    chain = AutoCodec(bandwidth=1e6).select("w", data)
    assert len(chain) == 1
    assert memoryview(chain[0].encode(data)).nbytes < 0.95 * data.nbytes
    # ... unless the saving is below min_saving.
    assert AutoCodec(bandwidth=1e6, min_saving=0.5).select("w", data) == []


def test_small_and_empty_tensors_go_raw() -> None:
    auto = AutoCodec(bandwidth=1e6, min_size=64 << 10)  # slow: compressing would pay
    assert auto.select("b", np.zeros(8191)) == []  # 65528 bytes
    assert auto.select("b", np.zeros(8192)) != []
    assert auto.select("e", np.zeros((0, 5))) == []
    assert auto.select("s", np.array(1.0)) == []


def test_estimate_puts_raw_first_and_explains_the_choice(random_big: np.ndarray) -> None:
    auto = AutoCodec(bandwidth=1e9)
    estimates = auto.estimate(random_big)
    raw = estimates[0]
    assert raw.codec is None and raw.total_seconds == pytest.approx(random_big.nbytes / 1e9)
    assert [e.codec for e in estimates[1:]] == auto.candidates_for(8)
    for e in estimates[1:]:
        assert 0.5 < e.ratio < 1.01
        assert e.encode_seconds > 0
        assert e.wire_seconds == pytest.approx(e.ratio * random_big.nbytes / 1e9)
        # Whether a codec beats raw here depends on this machine's speed (uniform doubles
        # shuffle to ~0.88, a near tie at 1 GB/s), so the estimate only has to add up.
        if e.eligible and e.decode_seconds is not None:
            assert e.total_seconds == pytest.approx(
                e.encode_seconds + e.wire_seconds + e.decode_seconds
            )
        else:
            assert e.total_seconds == math.inf
    lz4 = next(e for e in estimates if isinstance(e.codec, LZ4))
    assert not lz4.eligible  # random floats: LZ4 saves nothing


def test_candidates_and_itemsize() -> None:
    ones32 = np.ones(1 << 20, dtype=np.float32)
    zstd3 = AutoCodec(bandwidth=1e6, candidates=[Zstd(level=3)])
    assert zstd3.select("w", ones32) == [Zstd(level=3)]
    blosc = AutoCodec(bandwidth=1e6, candidates=[Blosc2()])
    assert blosc.select("w", ones32) == [Blosc2(typesize=4)]
    shuffles = [c for c in AutoCodec().candidates_for(1) if getattr(c, "filter", "") == "shuffle"]
    assert shuffles == []  # shuffling one-byte elements is a no-op
    assert AutoCodec(bandwidth=1e3, candidates=[]).select("w", ones32) == []
    with pytest.raises(CodecConfigError, match="candidates"):
        AutoCodec(candidates=["lz4"])  # type: ignore[list-item]


@pytest.mark.parametrize(
    "array",
    [
        np.ones((1024, 512), dtype=np.float64)[:, ::2],  # not contiguous
        np.asfortranarray(np.ones((1024, 256), dtype=np.float32)),
        np.zeros(1 << 18, dtype=ml_dtypes.bfloat16),
        np.zeros(1 << 18, dtype=np.bool_),
        np.zeros((3, 5, 1 << 14), dtype=np.int16),
    ],
    ids=["strided", "fortran", "bfloat16", "bool", "3d"],
)
def test_any_array_layout_is_sampled(array: np.ndarray) -> None:
    auto = AutoCodec(bandwidth=1e6)  # a slow link, so that compressing clearly pays
    chain = auto(name="x", array=array)
    assert len(chain) == 1, auto.estimate(array)
    raw = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
    np.testing.assert_array_equal(chain[0].decode(chain[0].encode(raw)), raw)


def test_the_first_measured_bandwidth_replaces_the_guess_and_later_ones_blend() -> None:
    auto = AutoCodec()  # no bandwidth given: 1e9 B/s guessed until a send measures the link
    assert auto.bandwidth == 1e9
    auto.update_bandwidth(2e6)  # a 3G-like link, measured once
    assert auto.bandwidth == 2e6
    auto.update_bandwidth(4e6)
    assert auto.bandwidth == pytest.approx(3e6)
    told = AutoCodec(bandwidth=1e9)  # a bandwidth the caller gave is no guess: blended
    told.update_bandwidth(2e6)
    assert told.bandwidth == pytest.approx(5.01e8)


def test_bandwidth_can_be_set_and_fed() -> None:
    auto = AutoCodec(bandwidth=1e9)
    auto.update_bandwidth(5e8)
    assert auto.bandwidth == pytest.approx(7.5e8)
    auto.update_bandwidth(1e6, weight=1.0)
    assert auto.bandwidth == 1e6
    auto.bandwidth = 2e9
    assert auto.bandwidth == 2e9
    for bad in (0, -1.0, float("inf"), float("nan"), "fast", True):
        with pytest.raises(CodecConfigError, match="bandwidth"):
            auto.bandwidth = bad  # type: ignore[assignment]
        with pytest.raises(CodecConfigError, match="bandwidth"):
            auto.update_bandwidth(bad)  # type: ignore[arg-type]
    with pytest.raises(CodecConfigError, match="weight"):
        auto.update_bandwidth(1e6, weight=0)
    with pytest.raises(CodecConfigError, match="min_saving"):
        AutoCodec(min_saving=1.0)
    with pytest.raises(CodecConfigError, match="min_size"):
        AutoCodec(min_size=-1)


def test_an_auto_endpoint_imports_its_codec_libraries_in_the_background() -> None:
    """The first message does not pay for blosc2's import (~0.3 s): making an AutoCodec
    starts it in a thread, once per process; ``import tensorwire`` alone imports nothing."""
    import subprocess
    import sys

    code = (
        "import sys, tensorwire\n"
        "before = 'blosc2' in sys.modules\n"
        "from tensorwire.codecs import resolve_codecs\n"
        "from tensorwire.codecs.auto import warm_up_codec_libraries\n"
        "resolve_codecs('auto'); resolve_codecs('auto')\n"
        "thread = warm_up_codec_libraries()\n"
        "thread.join(60)\n"
        "print(before, thread.name, 'blosc2' in sys.modules)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert done.stdout.split() == ["False", "tensorwire-codec-warm-up", "True"], done.stdout
