"""``tensorwire bench codec``: tensorwire's codecs against the libraries they wrap, same run.

The Dask case (dask/distributed#7433): ``np.ones((4096, 4096))`` float64, 128 MiB. For each
codec, tensorwire's encode and its decode into a reused output buffer, whole messages
through ``tensorwire.encode``/``decode``, and the library called directly the way most code
calls it (``lz4.frame.compress`` / ``decompress`` ...). Then ``auto`` on incompressible data
(``np.random.random``), which must pick raw and cost no more than sending it uncompressed.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import blosc2
import lz4.frame
import numpy as np
import zstandard

import tensorwire
from tensorwire.bench.progress import progress_bar
from tensorwire.codecs import AutoCodec, get_codec


def _median_s(fn: Callable[[], Any], repeat: int) -> float:
    fn()  # warm-up: pools, thread start, page faults of first use
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def _interleaved_s(fns: list[Callable[[], Any]], rounds: int) -> list[list[float]]:
    """Each of ``fns`` once per round, in turn, after one warm-up each: their times."""
    for fn in fns:
        fn()
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(rounds):
        for fn, spent in zip(fns, times, strict=True):
            t = time.perf_counter()
            fn()
            spent.append(time.perf_counter() - t)
    return times


def _library_baselines(arr: np.ndarray) -> dict[str, tuple[Callable[[], Any], Callable[[], Any]]]:
    """(compress, decompress) of each library called directly, as most code calls it."""
    lz4_c = lz4.frame.compress(arr)
    zc, zd = zstandard.ZstdCompressor(), zstandard.ZstdDecompressor()
    zstd_c = zc.compress(arr.data)
    blosc_c = blosc2.compress2(arr, typesize=arr.itemsize)
    return {
        "lz4": (lambda: lz4.frame.compress(arr), lambda: lz4.frame.decompress(lz4_c)),
        "zstd": (lambda: zc.compress(arr.data), lambda: zd.decompress(zstd_c)),
        "blosc2": (
            lambda: blosc2.compress2(arr, typesize=arr.itemsize),
            lambda: blosc2.decompress2(blosc_c),
        ),
    }


def bench_codecs(
    repeat: int = 5, codecs: tuple[str, ...] = ("lz4", "zstd", "blosc2")
) -> list[dict[str, Any]]:
    """One row per codec: tensorwire vs the library, encode and decode medians (ms)."""
    arr = np.ones((4096, 4096))
    flat = arr.reshape(-1).view(np.uint8).data
    out = np.empty_like(arr)
    out_view = out.reshape(-1).view(np.uint8).data
    baselines = _library_baselines(arr)
    rows = []
    with progress_bar() as bar:
        task = bar.add_task("codecs", total=len(codecs))
        for cid in codecs:
            bar.update(task, description=f"codec {cid}")
            codec = get_codec({"id": cid}).for_itemsize(arr.itemsize)  # blosc2 shuffles by it
            encoded = codec.encode(flat)
            enc_s = _median_s(partial(codec.encode, flat), repeat)
            dec_s = _median_s(partial(codec.decode, encoded, out=out_view), repeat)
            assert np.array_equal(out, arr)
            wire = tensorwire.encode({"x": arr}, codec=cid).to_bytes()
            msg_enc_s = _median_s(partial(tensorwire.encode, {"x": arr}, codec=cid), repeat)
            msg_dec_s = _median_s(partial(tensorwire.decode, wire, out={("x",): out}), repeat)
            raw_c, raw_d = baselines[cid]
            raw_enc_s, raw_dec_s = _median_s(raw_c, repeat), _median_s(raw_d, repeat)
            rows.append(
                {
                    "case": "ones float64 4096x4096",
                    "codec": cid,
                    "ratio": len(encoded) / arr.nbytes,
                    "encode_ms": enc_s * 1e3,
                    "library_encode_ms": raw_enc_s * 1e3,
                    "encode_vs_library": enc_s / raw_enc_s,
                    "decode_ms": dec_s * 1e3,
                    "library_decode_ms": raw_dec_s * 1e3,
                    "decode_vs_library": dec_s / raw_dec_s,
                    "message_encode_ms": msg_enc_s * 1e3,
                    "message_decode_ms": msg_dec_s * 1e3,
                }
            )
            bar.advance(task)
    return rows


AUTO_ROUNDS = 21
"""At least this many rounds in :func:`bench_auto_incompressible`: the difference it measures
is microseconds in milliseconds, so it takes more than a handful of samples to see it."""


def bench_auto_incompressible(repeat: int = 5, bandwidth: float = 1e9) -> dict[str, Any]:
    """``auto`` on ``np.random.random((4096, 4096))``: what it picks and what choosing costs.

    Encodes with ``auto`` (decided on the warm-up) and raw alternate, one of each per round,
    for ``max(repeat, AUTO_ROUNDS)`` rounds; ``auto_vs_raw`` is the median over rounds of the
    two times' ratio, so the machine's drift hits both alike."""
    arr = np.random.default_rng(0).random((4096, 4096))
    auto = AutoCodec(bandwidth=bandwidth)
    chain = auto.select("x", arr)

    def with_auto() -> None:
        tensorwire.encode({"x": arr}, codec=auto).frames()

    def raw() -> None:
        tensorwire.encode({"x": arr}, codec=None).frames()

    auto_times, raw_times = _interleaved_s([with_auto, raw], max(repeat, AUTO_ROUNDS))
    auto_s, raw_s = statistics.median(auto_times), statistics.median(raw_times)
    select_s = _median_s(lambda: auto.select("x", arr), repeat)
    return {
        "case": "random float64 4096x4096",
        "codec": "+".join(c.get_config()["id"] for c in chain) or "raw",
        "bandwidth_bytes_per_s": bandwidth,
        "select_ms": select_s * 1e3,
        "auto_encode_ms": auto_s * 1e3,
        "raw_encode_ms": raw_s * 1e3,
        "auto_vs_raw": statistics.median(a / r for a, r in zip(auto_times, raw_times, strict=True)),
        "wire_ms_at_bandwidth": arr.nbytes / bandwidth * 1e3,
    }
