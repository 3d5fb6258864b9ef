"""``bench codec`` on trained weights: floatplanes (and floatplanes-zl) against ZipNN,
blosc2, zstd and lz4.

Each model (VGG-5, VGG-8, ResNet-18 from :mod:`tensorwire.fl.models`) is trained briefly on
the built-in digits data (``samples`` images, one epoch of SGD per checkpoint; ResNet-18
on fewer, it is slow on a CPU), and two checkpoints one epoch apart are taken: the
second's float tensors, concatenated as one file holds them, are the "weights"; the XOR of
the two checkpoints' bits (what the FL delta downlink sends) is the "delta". Both as
float32 and cast to bfloat16. Every codec runs on one thread; the trials are interleaved
(each codec once per round, a round starting with the next codec each time; a trial repeats
its call for 50 ms of CPU) and the medians of ``repeat`` rounds reported, in GB of raw
bytes per CPU second of this process (the machine may be shared: wall time would count the
others' work).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np

from tensorwire.codecs import FloatPlanes, FloatPlanesZl, get_threads, set_threads
from tensorwire.codecs.zl_planes import zl_available

MODELS = ("vgg5", "vgg8", "resnet18")
DEFAULT_SAMPLES = {"vgg5": 1437, "vgg8": 1437, "resnet18": 200}
"""Digits images each checkpoint is trained on (1,437: the whole training split)."""


@dataclass
class Contender:
    """A codec as its library is called: ``compress(data) -> blob``, ``decompress(blob) -> raw
    bytes-like``; ``data`` is a uint array of the case's element size."""

    name: str
    compress: Callable[[np.ndarray], Any]
    decompress: Callable[[Any], Any]


def trained_checkpoints(model: str, samples: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Two checkpoints one epoch apart, each its float tensors concatenated (float32)."""
    import torch

    from tensorwire.fl.data import load_dataset
    from tensorwire.fl.models import build_model
    from tensorwire.fl.train import ArrayData, state_to_numpy, train_model

    torch.manual_seed(seed)
    net = build_model(model)
    data = load_dataset("digits", seed=seed)
    part = ArrayData(data.train_x[:samples], data.train_y[:samples])
    flat = []
    for epoch in range(2):
        train_model(net, part, epochs=1, seed=seed + epoch)
        state = state_to_numpy(net)
        flat.append(np.concatenate([v.reshape(-1) for v in state.values() if v.dtype.kind == "f"]))
    return flat[0].astype(np.float32), flat[1].astype(np.float32)


def as_bits(weights: np.ndarray, dtype: str) -> np.ndarray:
    """``weights`` (float32) as ``dtype`` (float32 or bfloat16), viewed as unsigned ints."""
    if dtype == "float32":
        return weights.view(np.uint32)
    import ml_dtypes

    return weights.astype(ml_dtypes.bfloat16).view(np.uint16)


def contenders(itemsize: int) -> list[Contender]:
    """floatplanes and the libraries it is compared with, each on one thread."""
    import blosc2
    import lz4.frame
    import zstandard

    planes = FloatPlanes(typesize=itemsize)
    zc, zd = zstandard.ZstdCompressor(level=3), zstandard.ZstdDecompressor()
    with_zl = []
    if zl_available():  # Huffman coded by OpenZL: the same planes, another entropy coder
        zl = FloatPlanesZl(typesize=itemsize)
        with_zl = [Contender("floatplanes-zl", zl.encode, zl.decode)]
    found = [
        *with_zl,
        Contender("floatplanes", planes.encode, planes.decode),
        Contender(
            "blosc2 zstd+shuffle",
            lambda a: blosc2.compress2(
                a, codec=blosc2.Codec.ZSTD, clevel=5, typesize=itemsize, nthreads=1
            ),
            lambda b: blosc2.decompress2(b, nthreads=1),
        ),
        Contender("zstd-3", lambda a: zc.compress(a.data), zd.decompress),
        Contender("lz4", lambda a: lz4.frame.compress(a.data), lz4.frame.decompress),
    ]
    zipnn = _zipnn(itemsize)
    ours = len(with_zl) + 1
    return found if zipnn is None else [*found[:ours], zipnn, *found[ours:]]


def _zipnn(itemsize: int) -> Contender | None:
    try:
        import torch
        from zipnn import ZipNN
    except ImportError:
        return None
    zn = ZipNN(input_format="torch", threads=1)
    dtype = torch.float32 if itemsize == 4 else torch.bfloat16

    def compress(a: np.ndarray) -> Any:
        # ZipNN 0.5.4 rotates its input's bits in place: it gets a copy (made in the timing
        # as everyone's input would be: a copy costs ~1/10 of its compression).
        return zn.compress(torch.from_numpy(a.copy()).view(dtype))

    def decompress(blob: Any) -> Any:
        return zn.decompress(blob).view(torch.int32 if itemsize == 4 else torch.int16).numpy()

    return Contender("zipnn", compress, decompress)


TRIAL_S = 0.05
"""Each trial repeats its call until it has taken this many CPU seconds: one call on a few MB
takes milliseconds, and the first after another codec's pays for the caches and pages that
one left (up to 45 % more, measured)."""


def _cpu_seconds(fn: Callable[[], Any]) -> float:
    """CPU seconds per call of ``fn``, over as many calls as fill :data:`TRIAL_S`."""
    calls, start = 0, time.process_time()
    while True:
        fn()
        calls += 1
        spent = time.process_time() - start
        if spent >= TRIAL_S:
            return spent / calls


def bench_case(data: np.ndarray, repeat: int) -> list[dict[str, Any]]:
    """Every contender on ``data`` (uint bits): ratio and single-thread GB/s, medians."""
    raw = data.tobytes()
    found = contenders(data.itemsize)
    blobs = [c.compress(data) for c in found]  # warm-up, and the ratio
    for c, blob in zip(found, blobs, strict=True):
        if np.asarray(c.decompress(blob)).tobytes() != raw:
            raise AssertionError(f"{c.name} did not give back its input")
    enc: list[list[float]] = [[] for _ in found]
    dec: list[list[float]] = [[] for _ in found]
    for r in range(repeat):
        for k in range(len(found)):  # each round starts with the next codec: none always first
            i = (k + r) % len(found)
            enc[i].append(_cpu_seconds(partial(found[i].compress, data)))
            dec[i].append(_cpu_seconds(partial(found[i].decompress, blobs[i])))
    rows = []
    for c, blob, e, d in zip(found, blobs, enc, dec, strict=True):
        rows.append(
            {
                "codec": c.name,
                "raw_MB": data.nbytes / 1e6,
                "ratio": data.nbytes / len(memoryview(blob).cast("B")),
                "compress_GBps": data.nbytes / statistics.median(e) / 1e9,
                "decompress_GBps": data.nbytes / statistics.median(d) / 1e9,
            }
        )
    return rows


def bench_weights(
    models: tuple[str, ...] = MODELS,
    repeat: int = 5,
    samples: dict[str, int] | None = None,
    progress: Callable[[str], None] | None = None,
) -> list[dict[str, Any]]:
    """One row per model x dtype x (weights, delta) x codec."""
    samples = {**DEFAULT_SAMPLES, **(samples or {})}
    threads = get_threads()
    set_threads(1)
    rows = []
    try:
        for model in models:
            if progress:
                progress(f"training {model} on {samples[model]} digits images, two epochs")
            before, after = trained_checkpoints(model, samples[model])
            for dtype in ("float32", "bfloat16"):
                old, new = as_bits(before, dtype), as_bits(after, dtype)
                for data_name, data in (("weights", new), ("delta", new ^ old)):
                    if progress:
                        progress(f"{model} {dtype} {data_name}")
                    for row in bench_case(np.ascontiguousarray(data), repeat):
                        rows.append({"model": model, "dtype": dtype, "data": data_name, **row})
    finally:
        set_threads(threads)
    return rows
