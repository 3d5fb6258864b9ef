"""The byte-plane transform under floatplanes and the per-plane entropy choice: planes are
the documented rotate-then-bytes, merging inverts them, and planes that cannot shrink are
stored without a DEFLATE attempt."""

from __future__ import annotations

import numpy as np
import pytest

from tensorwire.codecs import deflate_planes
from tensorwire.codecs.deflate_planes import KEEP_BITS, compress_planes
from tensorwire.codecs.planes import merge_planes, split_planes

RNG = np.random.default_rng(7)


@pytest.mark.parametrize("typesize", [1, 2, 4, 8])
@pytest.mark.parametrize("n", [0, 1, 5, 4096])
def test_planes_are_the_bytes_of_each_element_rotated_left_by_one(typesize: int, n: int) -> None:
    words = RNG.integers(0, 256, n * typesize, dtype=np.uint8).view(f"<u{typesize}")
    bits = 8 * typesize
    rotated = (words << np.uint8(1)) | (words >> np.uint8(bits - 1)) if typesize > 1 else words
    planes = split_planes(words.view(np.uint8).data, typesize)
    assert planes.shape == (typesize, n)
    assert np.array_equal(planes, rotated.view(np.uint8).reshape(n, typesize).T)
    out = np.empty_like(words)
    merge_planes(list(planes), out.view(np.uint8).data, typesize)
    assert np.array_equal(out, words)


def test_near_random_planes_are_stored_without_trying_and_skewed_ones_are_coded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    weights = (RNG.standard_normal(1 << 16) * 0.05).astype(np.float32)
    planes = split_planes(weights.view(np.uint8).data, 4)  # 3 mantissa planes, 1 exponent
    tried: list[int] = []
    deflate = deflate_planes._deflate

    def counting(data: np.ndarray, strategy: int) -> bytes:
        tried.append(len(data))
        return deflate(data, strategy)

    monkeypatch.setattr(deflate_planes, "_deflate", counting)
    streams = compress_planes(planes)
    assert [s is None for s in streams] == [True, True, True, False]
    assert tried == [1 << 16]  # the exponent plane only
    assert len(streams[3] or b"") < planes[3].size / 3


def test_the_entropy_estimate_is_unbiased_enough_for_its_threshold() -> None:
    random = RNG.integers(0, 256, (8, 1 << 16), dtype=np.uint8)
    entropy, zeros = deflate_planes._judge(random)
    assert np.all(np.abs(entropy - 8) < 0.03)  # the plug-in estimate alone reads ~7.955
    assert np.all(entropy > KEEP_BITS)
    assert np.all(zeros < 4 / 256)
    skewed = RNG.integers(0, 16, (1, 1 << 16), dtype=np.uint8)
    assert abs(deflate_planes._judge(skewed)[0][0] - 4) < 0.03
    assert compress_planes(np.empty((3, 0), np.uint8)) == [None, None, None]
