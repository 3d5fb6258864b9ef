"""Blocks are (de)compressed in parallel with the same result as one thread."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from codec_helpers import SMALL_BLOCK

from tensorwire.codecs import LZ4, Blosc2, Codec, Zstd, get_threads
from tensorwire.codecs.threads import _get_executor, split_runs
from tensorwire.errors import CodecConfigError, CodecDataError

DATA = np.concatenate(
    [np.arange(1 << 18, dtype=np.int32), np.random.default_rng(0).random(1 << 16)]
).view(np.uint8)  # 1.5 MiB: 24 blocks of 64 KiB


@pytest.mark.parametrize("codec", [LZ4(block_size=SMALL_BLOCK), Zstd(block_size=SMALL_BLOCK)])
def test_thread_count_does_not_change_the_bytes(
    codec: Codec, threads: Callable[[int], None]
) -> None:
    results = []
    for n in (1, 2, 5):
        threads(n)
        assert get_threads() == n
        encoded = bytes(codec.encode(DATA))
        out = np.empty_like(DATA)
        codec.decode(encoded, out=out)
        np.testing.assert_array_equal(out, DATA)
        results.append(encoded)
    assert results[0] == results[1] == results[2]


def test_blosc2_payloads_decode_with_any_thread_count() -> None:
    # Blosc2's threads may order its blocks differently: compare the decoded bytes.
    data = np.tile(DATA, 2)  # 3 MiB: enough for Blosc2 to use its threads
    one, four = Blosc2(nthreads=1, typesize=4), Blosc2(nthreads=4, typesize=4)
    np.testing.assert_array_equal(four.decode(one.encode(data)), data)
    np.testing.assert_array_equal(one.decode(four.encode(data)), data)


def test_a_corrupt_block_fails_the_whole_parallel_decode(threads: Callable[[int], None]) -> None:
    threads(4)
    codec = LZ4(block_size=SMALL_BLOCK)
    payload = bytearray(codec.encode(DATA))
    payload[len(payload) // 3 : len(payload) // 3 + 64] = b"\xff" * 64
    backing = np.full(DATA.nbytes + 64, 0xA5, dtype=np.uint8)
    with pytest.raises(CodecDataError):
        codec.decode(payload, out=backing[: DATA.nbytes])
    assert (backing[DATA.nbytes :] == 0xA5).all()


def test_codecs_called_from_a_pool_thread_run_inline(threads: Callable[[int], None]) -> None:
    threads(2)
    codec = Zstd(block_size=SMALL_BLOCK)

    def round_trip() -> np.ndarray:
        return codec.decode(codec.encode(DATA))

    # Both pool threads busy with codec work that itself has many blocks: no deadlock.
    futures = [_get_executor().submit(round_trip) for _ in range(2)]
    for future in futures:
        np.testing.assert_array_equal(future.result(timeout=60), DATA)


@pytest.mark.parametrize("n", [0, 1, 2, 7, 8, 9, 1000])
def test_runs_cover_every_block_once_in_order(n: int, threads: Callable[[int], None]) -> None:
    threads(2)
    runs = split_runs(n)
    assert [i for start, stop in runs for i in range(start, stop)] == list(range(n))
    assert len(runs) <= max(1, 8) and all(stop > start for start, stop in runs)


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2"])
def test_set_threads_validates(bad: object, threads: Callable[[int], None]) -> None:
    with pytest.raises(CodecConfigError, match="threads"):
        threads(bad)  # type: ignore[arg-type]
