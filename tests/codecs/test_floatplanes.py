"""floatplanes: lossless on every float dtype and on XOR deltas, its frame as
docs/wire-format.md gives it (test vectors), and hostile frames (typed errors, bounded
memory)."""

from __future__ import annotations

import struct
import subprocess
import sys
import tracemalloc
import zlib

import ml_dtypes
import numpy as np
import pytest
from codec_helpers import container

from tensorwire.codecs import FloatPlanes, get_codec
from tensorwire.errors import CodecDataError, DecompressedSizeMismatch, WireError

RNG = np.random.default_rng(29)
WEIGHTS = (RNG.standard_normal(300_000) * 0.05).astype(np.float32)  # trained-weight-like

# docs/wire-format.md, 11.2: 60 x 1.0 then -2.0, 0.5, 3.0, 1.5 (float32, 256 bytes).
VECTOR_F32_IN = np.array([1.0] * 60 + [-2.0, 0.5, 3.0, 1.5], dtype="<f4")
VECTOR_F32_OUT = bytes.fromhex(
    "000004000001000000000000010000003c000000040900000005000000070000001600000063a000303230"
    "30000063a010000063a0083434000005c1010100000082a0e7e1f400000000000000005a0e"
)
# 16 x (1.0, -1.0, 2.0, 0.5) as bfloat16 (128 bytes).
VECTOR_BF16_IN = np.array([1.0, -1.0, 2.0, 0.5] * 16, dtype=ml_dtypes.bfloat16)
VECTOR_BF16_OUT = bytes.fromhex(
    "000004008000000000000000010000003b00000002170000001b00000005c101010000008010fd3f1d4208"
    "21841042082184100305c1010100000082a0e7d2f480c562b1582c168bc562b1582c16eb"
)


def _roundtrip(arr: np.ndarray) -> bytes:
    codec = FloatPlanes().for_itemsize(arr.itemsize)
    encoded = bytes(codec.encode(arr))
    out = np.empty_like(arr)
    get_codec(codec.get_config()).decode(encoded, out=out)
    assert out.view(np.uint8).tobytes() == arr.view(np.uint8).tobytes()
    return encoded


@pytest.mark.parametrize(
    "dtype", [np.float32, np.float16, ml_dtypes.bfloat16, np.float64, np.uint32, np.uint8]
)
def test_every_float_dtype_round_trips_bit_exact_and_shrinks(dtype: type) -> None:
    arr = WEIGHTS.astype(dtype) if dtype not in (np.uint32, np.uint8) else WEIGHTS.view(dtype)
    arr = arr.copy()
    arr[:5] = [np.nan, np.inf, -np.inf, -0.0, 0.0] if arr.dtype.kind == "f" else arr[:5]
    encoded = _roundtrip(arr)
    if dtype is not np.uint8:  # bytes as they are: one plane of mixed bytes
        assert len(encoded) < 0.9 * arr.nbytes


def test_random_bits_cost_next_to_nothing_and_odd_sizes_work() -> None:
    noise = RNG.integers(0, 256, 1 << 20, dtype=np.uint8).view(np.float32)
    assert len(_roundtrip(noise)) <= noise.nbytes + 16 + 4 * 4  # blocks stored raw
    for n in (0, 1, 3, 65_537):
        _roundtrip(WEIGHTS[:n].copy())
    odd = bytes(range(256)) * 3 + b"x"  # not whole 4-byte elements: coded as bytes
    codec = FloatPlanes(typesize=4)
    assert bytes(codec.decode(codec.encode(odd))) == odd


def test_round_to_round_xor_deltas_shrink_far_more_than_the_weights() -> None:
    before = WEIGHTS.view(np.uint32)
    after = (WEIGHTS + RNG.standard_normal(WEIGHTS.size).astype(np.float32) * 1e-4).view(np.uint32)
    sparse = before.copy()
    sparse[::100] = after[::100]  # top-k-like: 1 % of the weights changed
    full = len(_roundtrip(before))
    assert len(_roundtrip(after ^ before)) < full
    assert len(_roundtrip(sparse ^ before)) < full / 10


@pytest.mark.parametrize(
    ("data", "encoded"),
    [(VECTOR_F32_IN, VECTOR_F32_OUT), (VECTOR_BF16_IN, VECTOR_BF16_OUT)],
    ids=["float32", "bfloat16"],
)
def test_the_documented_vectors_decode_and_encoding_them_round_trips(
    data: np.ndarray, encoded: bytes
) -> None:
    raw = data.view(np.uint8).tobytes()
    assert bytes(FloatPlanes().decode(encoded)) == raw
    # Another DEFLATE library may write other (valid) streams: decoding is what is pinned.
    codec = FloatPlanes().for_itemsize(data.itemsize)
    assert bytes(codec.decode(codec.encode(data.view(f"u{data.itemsize}")))) == raw


def test_the_vector_is_the_frame_the_document_describes() -> None:
    block_size, raw_length, nblocks, size = struct.unpack_from("<IQII", VECTOR_F32_OUT)
    assert (block_size, raw_length, nblocks, size) == (1 << 18, 256, 1, len(VECTOR_F32_OUT) - 20)
    block = VECTOR_F32_OUT[20:]
    assert block[0] == 4
    sizes = struct.unpack_from("<4I", block, 1)
    streams, pos = [], 17
    for s in sizes:
        streams.append(block[pos : pos + s])
        pos += s
    planes = [np.frombuffer(zlib.decompress(s, -15), np.uint8) for s in streams]
    words = np.zeros(64, np.uint32)
    for k, plane in enumerate(planes):
        words |= plane.astype(np.uint32) << (8 * k)
    assert np.array_equal(((words >> 1) | (words << 31)).view("<f4"), VECTOR_F32_IN)


def _block(typesize: int, sizes: list[int], payload: bytes) -> bytes:
    return struct.pack(f"<B{len(sizes)}I", typesize, *sizes) + payload


@pytest.mark.parametrize(
    ("block", "error"),
    [
        (_block(3, [1, 1, 1], b"abc"), CodecDataError),  # typesize not 1, 2, 4, 8
        (b"", CodecDataError),
        (_block(4, [], b""), CodecDataError),  # truncated plane table
        (_block(4, [16, 16, 16, 17], b""), CodecDataError),  # a plane over its raw size
        (_block(4, [16, 16, 16, 1], b"\0" * 20), CodecDataError),  # table vs length
        (_block(4, [16, 16, 16, 3], b"\0" * 48 + b"\xff\xff\xff"), CodecDataError),  # garbage
        (_block(2, [32, 1], b"\0" * 32 + b"\x03"), WireError),  # a truncated stream
    ],
)
def test_forged_blocks_raise_typed_errors(block: bytes, error: type[Exception]) -> None:
    payload = container(1 << 16, 64, [block])
    with pytest.raises(error):
        FloatPlanes().decode(payload)
    out = np.full(64, 0xA5, np.uint8)
    with pytest.raises(error):
        FloatPlanes().decode(payload, out=out)


def test_a_plane_that_inflates_past_its_size_is_refused_without_inflating_it() -> None:
    cobj = zlib.compressobj(9, zlib.DEFLATED, -15)
    bomb = cobj.compress(bytes(64 << 20)) + cobj.flush()  # 64 MiB of zeros in ~64 KiB
    n = 1 << 16  # the plane's declared size
    block = _block(1, [len(bomb)], bomb)
    tracemalloc.start()
    try:
        with pytest.raises(DecompressedSizeMismatch):
            FloatPlanes().decode(container(1 << 16, n, [block]))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 * n  # what the plane may hold, not what the stream declares


def test_a_forged_raw_length_allocates_nothing_without_room() -> None:
    forged = struct.pack("<IQI", 1 << 16, 1 << 34, 1 << 18)
    with pytest.raises(CodecDataError):
        FloatPlanes().decode(forged)  # its block table is missing: refused before allocating
    table = forged + b"\0" * 4 * (1 << 18)
    with pytest.raises(WireError):
        FloatPlanes().decode(table, max_size=1 << 20)


def test_config_is_checked() -> None:
    assert get_codec({"id": "floatplanes", "typesize": 2}) == FloatPlanes(typesize=2)
    for bad in ({"typesize": 3}, {"block_size": 1000}, {"block_size": (1 << 16) + 4}):
        with pytest.raises(CodecDataError):
            get_codec({"id": "floatplanes", **bad})


def test_importing_tensorwire_imports_no_heavy_codec_library() -> None:
    heavy = "{'blosc2', 'isal', 'zlib_ng', 'openzl'}"
    code = f"import sys, tensorwire; print(sorted({heavy} & set(sys.modules)))"
    found = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert found.stdout.strip() == "[]"
