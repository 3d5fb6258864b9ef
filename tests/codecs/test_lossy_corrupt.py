"""Mutated or truncated lossy payloads raise WireError subclasses and never write past ``out``."""

from __future__ import annotations

import contextlib
import struct

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tensorwire.codecs.lossy import BF16, DGC, FP16, QSGD, Int8, RandomK, SignSGD, TopK
from tensorwire.errors import CodecDataError, DecompressedSizeMismatch, WireError

GUARD = 256

CODECS = [
    FP16("float32"),
    BF16("bfloat16"),
    Int8("float32", block_size=256),
    QSGD("float32", levels=1, block_size=256, seed=0),
    QSGD("float64", levels=7, seed=0),
    QSGD("float16", seed=0),
    TopK("float32", ratio=0.05),
    TopK("float64", ratio=0.001),
    RandomK("float32", ratio=0.05, seed=0),
    DGC("bfloat16", ratio=0.02, seed=0),
    SignSGD("float32"),
]


def _source(codec) -> np.ndarray:
    rng = np.random.default_rng(7)
    x = rng.standard_normal(5003)
    x[::7] = 0
    return x.astype(codec._dtype)


SOURCES = [_source(codec) for codec in CODECS]
PAYLOADS = [bytes(codec.encode(x)) for codec, x in zip(CODECS, SOURCES, strict=True)]

edits = st.lists(
    st.tuples(st.floats(0, 1, exclude_max=True), st.integers(0, 255)), min_size=1, max_size=8
)


def _decode_guarded(index: int, payload: bytes) -> None:
    """Decode into the front of a larger buffer and check nothing past it changed."""
    nbytes = SOURCES[index].nbytes
    backing = np.full(nbytes + GUARD, 0xA5, dtype=np.uint8)
    with contextlib.suppress(WireError):
        CODECS[index].decode(payload, out=backing[:nbytes])
    assert (backing[nbytes:] == 0xA5).all()
    try:
        result = CODECS[index].decode(payload, max_size=nbytes)
    except WireError:
        return
    assert result.nbytes <= nbytes


@given(st.integers(0, len(CODECS) - 1), edits, st.booleans())
def test_mutated_payloads(index: int, changes: list[tuple[float, int]], in_header: bool) -> None:
    payload = bytearray(PAYLOADS[index])
    span = min(40, len(payload)) if in_header else len(payload)
    for where, value in changes:
        payload[int(where * span)] = value
    _decode_guarded(index, bytes(payload))


@given(st.integers(0, len(CODECS) - 1), st.floats(0, 1, exclude_max=True))
def test_truncated_payloads(index: int, keep: float) -> None:
    payload = PAYLOADS[index]
    _decode_guarded(index, payload[: int(keep * len(payload))])


@given(st.integers(0, len(CODECS) - 1), st.binary(max_size=64))
def test_appended_bytes(index: int, extra: bytes) -> None:
    _decode_guarded(index, PAYLOADS[index] + extra)


@pytest.mark.parametrize("codec", CODECS[2:], ids=repr)
def test_a_huge_declared_size_is_refused_before_allocating(codec) -> None:
    payload = bytearray(codec.encode(_source(codec)))
    struct.pack_into("<Q", payload, 0, 1 << 60)
    with pytest.raises(WireError):
        codec.decode(bytes(payload))


def test_sparse_index_out_of_range() -> None:
    codec = TopK("float32", ratio=1.0)
    payload = bytearray(codec.encode(np.ones(3, dtype=np.float32)))
    struct.pack_into("<Q", payload, 0, 2)  # n = 2 but k = 3
    with pytest.raises(CodecDataError, match="3 entries"):
        codec.decode(bytes(payload))
    payload = bytearray(codec.encode(np.ones(3, dtype=np.float32)))
    payload[-2:] = b"\1\0"  # the last gap makes index 3 of 3
    with pytest.raises(CodecDataError, match="element 3 of 3"):
        codec.decode(bytes(payload))


def test_specific_corruptions() -> None:
    x = np.ones(16, dtype=np.float32)
    int8 = Int8("float32")
    payload = bytearray(int8.encode(x))
    payload[-1] = 0x80  # -128
    with pytest.raises(CodecDataError, match="-128"):
        int8.decode(bytes(payload))
    payload = bytearray(int8.encode(x))
    struct.pack_into("<f", payload, 8, float("nan"))
    with pytest.raises(CodecDataError, match="scale"):
        int8.decode(bytes(payload))
    qsgd = QSGD("float32", levels=1)
    payload = bytearray(qsgd.encode(x))
    payload[-1] = 0xFF  # code 3 > 2 × levels
    with pytest.raises(CodecDataError, match="code above 2"):
        qsgd.decode(bytes(payload))
    with pytest.raises(CodecDataError, match="odd"):
        FP16("float32").decode(b"\0\0\0")
    with pytest.raises(DecompressedSizeMismatch):
        FP16("float32").decode(b"\0\0", out=np.empty(8, dtype=np.uint8))
    randomk = RandomK("float32", ratio=0.5)
    payload = bytearray(randomk.encode(x))
    payload[21] = 1
    with pytest.raises(CodecDataError, match="reserved"):
        randomk.decode(bytes(payload))
