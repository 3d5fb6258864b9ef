"""floatplanes-zl: floatplanes whose Huffman-coded planes are OpenZL frames. Lossless on
every float dtype and on XOR deltas, at floatplanes' ratio; its documented vector
(docs/wire-format.md 11.2); hostile frames (typed errors, nothing made larger than the plane
declares); and a peer without openzl gets plain floatplanes instead."""

from __future__ import annotations

import struct
import tracemalloc

import ml_dtypes
import numpy as np
import pytest
from codec_helpers import container

from tensorwire.codecs import FloatPlanes, get_codec
from tensorwire.errors import CodecDataError, DecompressedSizeMismatch
from tensorwire.transports.base.negotiation import _decodable, _DecodableCodecs

pytest.importorskip("openzl", reason="openzl is not installed (extra 'floatplanes')")

from tensorwire.codecs import FloatPlanesZl
from tensorwire.codecs.floatplanes import ZL_FLAG
from tensorwire.codecs.zl_planes import huffman_frame

RNG = np.random.default_rng(30)
WEIGHTS = (RNG.standard_normal(300_000) * 0.05).astype(np.float32)  # trained-weight-like

# docs/wire-format.md, 11.2: (1.0, -2.0, 0.5, 3.0, 1.5, 0.25, -1.0, 2.0) x 8, float32, as
# the current encoder writes it (plane 3: its smallest byte subtracted, then Huff0) and as
# the earlier one did (Huff0 alone); every decoder reads both.
VECTOR_IN = np.array([1.0, -2.0, 0.5, 3.0, 1.5, 0.25, -1.0, 2.0] * 8, dtype="<f4")
VECTOR_OUT = bytes.fromhex(
    "0000010000010000000000000100000071000000041800000005000000170000002c0000800dc1"
    "01010000008220fc7fba402e72918b5ce42217b9c86563a01000001dc1010d000000c2a04727ba"
    "9b50d1d1d1d1d1d1d1510ddba5b1d70001410501001bc528010700000100000000100100017dde"
    "e2dee2dee2dee2dee2dee2dee2dee200"
)
VECTOR_OUT_HUFFMAN_ONLY = bytes.fromhex(
    "0000010000010000000000000100000075000000041800000005000000170000003000008"
    "00dc101010000008220fc7fba402e72918b5ce42217b9c86563a01000001dc1010d000000"
    "c2a04727ba9b50d1d1d1d1d1d1d1510ddba5b1d7030141210202001d000000001104dee2de"
    "e2dee2dee2dee2dee2dee2dee2017d7e7f800bf08739272c661600"
)


def _planes_of(encoded: bytes, typesize: int) -> tuple[int, ...]:
    """The plane sizes (flags included) of a one-block payload's block."""
    return struct.unpack_from(f"<{typesize}I", encoded, 16 + 4 + 1)


@pytest.mark.parametrize("dtype", [np.float32, np.float16, ml_dtypes.bfloat16, np.float64])
def test_every_float_dtype_round_trips_at_floatplanes_ratio(dtype: type) -> None:
    arr = WEIGHTS.astype(dtype)
    arr[:5] = [np.nan, np.inf, -np.inf, -0.0, 0.0]
    zl, plain = FloatPlanesZl().for_itemsize(arr.itemsize), FloatPlanes().for_itemsize(arr.itemsize)
    encoded, reference = bytes(zl.encode(arr)), bytes(plain.encode(arr))
    out = np.empty_like(arr)
    get_codec(zl.get_config()).decode(encoded, out=out)
    assert out.view(np.uint8).tobytes() == arr.view(np.uint8).tobytes()
    assert len(encoded) < 0.9 * arr.nbytes
    assert len(encoded) <= 1.005 * len(reference)  # Huff0's table per plane vs DEFLATE's


def test_exponent_planes_are_openzl_frames_and_delta_runs_stay_deflate() -> None:
    one_block = WEIGHTS[: (1 << 19) // 4]
    sizes = _planes_of(bytes(FloatPlanesZl(typesize=4).encode(one_block)), 4)
    assert sizes[3] & ZL_FLAG and not sizes[0] & ZL_FLAG  # exponents coded, mantissa stored
    before = one_block.view(np.uint32)
    sparse = before.copy()
    sparse[::100] ^= 1 << 22  # 1 % of the weights changed: planes mostly zeros
    delta = sparse ^ before
    encoded = bytes(FloatPlanesZl(typesize=4).encode(delta))
    assert not any(s & ZL_FLAG for s in _planes_of(encoded, 4))  # runs: DEFLATE's
    assert len(encoded) < delta.nbytes / 10
    assert bytes(FloatPlanesZl().decode(encoded)) == delta.tobytes()


def test_the_documented_vectors_decode_with_either_id() -> None:
    raw = VECTOR_IN.view(np.uint8).tobytes()
    for vector in (VECTOR_OUT, VECTOR_OUT_HUFFMAN_ONLY):
        for codec in (FloatPlanesZl(), FloatPlanes()):
            assert bytes(codec.decode(vector)) == raw
    assert _planes_of(VECTOR_OUT, 4)[3] == ZL_FLAG | 0x2C  # plane 3: a 44-byte OpenZL frame
    assert _planes_of(VECTOR_OUT_HUFFMAN_ONLY, 4)[3] == ZL_FLAG | 0x30  # 48 bytes
    codec = FloatPlanesZl(typesize=4, block_size=1 << 16)
    encoded = bytes(codec.encode(VECTOR_IN))
    assert bytes(codec.decode(encoded)) == raw
    assert len(encoded) <= len(VECTOR_OUT)


def test_a_frame_pays_no_table_for_byte_values_below_the_planes_smallest() -> None:
    # An exponent plane's bytes lie in about 100..127; Huff0's table has a weight for every
    # value from 0 up, so coding them as they are would cost some 50 bytes per table (one
    # table per 32 K bytes of a plane over 100,000 bytes).
    exponents = np.clip(RNG.normal(118, 3, 1 << 17), 100, 127).astype(np.uint8)
    shifted = exponents - np.uint8(100)
    assert len(huffman_frame(exponents)) <= len(huffman_frame(shifted)) + 8


def _block(typesize: int, sizes: list[int], payload: bytes) -> bytes:
    return struct.pack(f"<B{len(sizes)}I", typesize, *sizes) + payload


def test_forged_openzl_planes_raise_typed_errors() -> None:
    n = 1 << 14
    garbage = _block(1, [ZL_FLAG | 40], bytes(range(40)))
    with pytest.raises(CodecDataError):
        FloatPlanesZl().decode(container(1 << 16, n, [garbage]))
    frame = huffman_frame(np.zeros(n, np.uint8) + np.arange(n, dtype=np.uint8) % 3)
    cut = _block(1, [ZL_FLAG | (len(frame) - 5)], frame[:-5])
    with pytest.raises((CodecDataError, DecompressedSizeMismatch)):
        FloatPlanesZl().decode(container(1 << 16, n, [cut]))
    flagged_over = _block(1, [ZL_FLAG | (n + 1)], bytes(n + 1))
    with pytest.raises(CodecDataError):
        FloatPlanesZl().decode(container(1 << 16, n, [flagged_over]))


def test_a_frame_declaring_more_than_its_plane_is_refused_before_decoding() -> None:
    n = 1 << 16
    big = 4 * n  # Huffman codes a byte in 1 bit or more: 4x in a frame that fits the block
    frame = huffman_frame((np.arange(big) % 97 == 0).astype(np.uint8))
    assert len(frame) < n
    block = _block(1, [ZL_FLAG | len(frame)], frame)
    tracemalloc.start()
    try:
        with pytest.raises(DecompressedSizeMismatch):
            FloatPlanesZl().decode(container(1 << 16, n, [block]))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 * n + 2 * len(frame)


def test_a_peer_without_openzl_gets_plain_floatplanes_and_one_without_either_raw() -> None:
    zl = FloatPlanesZl(typesize=4)
    assert _decodable(zl, frozenset({"floatplanes-zl"})) is zl
    fallback = _decodable(zl, frozenset({"floatplanes", "lz4"}))
    assert type(fallback) is FloatPlanes and fallback.typesize == 4
    assert _decodable(zl, frozenset({"lz4"})) is None
    chains = _DecodableCodecs(lambda name, arr: [zl], frozenset({"floatplanes"}))
    (chosen,) = chains("w", WEIGHTS)
    assert chosen.get_config()["id"] == "floatplanes"
    assert _DecodableCodecs(lambda name, arr: [zl], frozenset({"zstd"}))("w", WEIGHTS) == []
