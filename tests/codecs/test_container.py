"""The block container's byte layout, and every way a payload can lie about its size."""

from __future__ import annotations

import lzma
import struct
import tracemalloc
import zlib

import blosc2
import lz4.block
import numpy as np
import pytest
import zstandard
from codec_helpers import SMALL_BLOCK, container

from tensorwire.codecs import LZ4, LZMA, Blosc2, Codec, Zlib, Zstd
from tensorwire.errors import CodecDataError, DecompressedSizeMismatch, WireError

BLOCK_CODECS = [
    LZ4(block_size=SMALL_BLOCK),
    Zstd(block_size=SMALL_BLOCK),
    Zlib(block_size=SMALL_BLOCK),
    LZMA(preset=1, block_size=SMALL_BLOCK),
    Blosc2(block_size=SMALL_BLOCK, typesize=1),
]


def library_decompress(codec: Codec, block: bytes, raw_size: int) -> bytes:
    """Decompress one stored block with the library alone, as the module docs specify."""
    if isinstance(codec, LZ4):
        return lz4.block.decompress(block, uncompressed_size=raw_size)
    if isinstance(codec, Zstd):
        assert zstandard.frame_content_size(block) == raw_size
        return zstandard.ZstdDecompressor().decompress(block)
    if isinstance(codec, Zlib):
        return zlib.decompress(block)
    if isinstance(codec, LZMA):
        return lzma.decompress(block, format=lzma.FORMAT_XZ)
    assert blosc2.get_cbuffer_sizes(block)[:2] == (raw_size, len(block))
    return blosc2.decompress2(block)


@pytest.mark.parametrize("codec", BLOCK_CODECS, ids=repr)
def test_layout_matches_the_documented_format(codec: Codec) -> None:
    rng = np.random.default_rng(0)
    noise = rng.integers(0, 256, SMALL_BLOCK, dtype=np.uint8).tobytes()
    data = bytes(SMALL_BLOCK) + noise + b"abc" * 1000  # compressible, raw, short last block
    encoded = bytes(codec.encode(data))

    block_size, raw_length, nblocks = struct.unpack_from("<IQI", encoded)
    assert (block_size, raw_length, nblocks) == (SMALL_BLOCK, len(data), 3)
    sizes = struct.unpack_from("<3I", encoded, 16)
    assert len(encoded) == 16 + 4 * 3 + sum(sizes)
    offsets = np.cumsum((16 + 12, *sizes))
    blocks = [encoded[offsets[i] : offsets[i + 1]] for i in range(3)]
    raws = [data[:SMALL_BLOCK], noise, data[2 * SMALL_BLOCK :]]
    assert sizes[1] == SMALL_BLOCK and blocks[1] == noise  # incompressible: stored raw
    for i in (0, 2):
        assert sizes[i] < len(raws[i])
        assert library_decompress(codec, blocks[i], len(raws[i])) == raws[i]


def test_empty_input_is_a_bare_header() -> None:
    encoded = bytes(LZ4().encode(b""))
    assert encoded == struct.pack("<IQI", 1 << 20, 0, 0)
    assert LZ4().decode(encoded).nbytes == 0
    assert Zstd().decode(encoded, out=bytearray()) == bytearray()


@pytest.mark.parametrize("codec", BLOCK_CODECS, ids=repr)
def test_out_of_another_size_is_refused_before_writing(codec: Codec) -> None:
    data = np.arange(3 * SMALL_BLOCK, dtype=np.uint8)
    encoded = codec.encode(data)
    for size in (data.nbytes - 1, data.nbytes + 1, 0):
        out = np.full(size, 0xEE, dtype=np.uint8)
        with pytest.raises(DecompressedSizeMismatch):
            codec.decode(encoded, out=out)
        assert (out == 0xEE).all()


def test_max_size_bounds_what_decode_allocates() -> None:
    encoded = LZ4().encode(bytes(10_000))
    with pytest.raises(DecompressedSizeMismatch, match="max_size"):
        LZ4().decode(encoded, max_size=9_999)
    assert LZ4().decode(encoded, max_size=10_000).nbytes == 10_000


def test_declared_huge_length_raises_before_allocating() -> None:
    # 1 TiB in 1024 one-byte blocks: 5 KiB of payload that claims a terabyte.
    bomb = container(1 << 30, 1 << 40, [b"\x00"] * 1024)
    out = np.empty(1 << 20, np.uint8)
    tracemalloc.start()
    try:
        with pytest.raises(DecompressedSizeMismatch):
            LZ4().decode(bomb)
        with pytest.raises(DecompressedSizeMismatch):
            LZ4().decode(bomb, out=out)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 64 << 10


def _bomb_blocks() -> list[tuple[Codec, bytes]]:
    """A block per codec that really decompresses to 16 MiB of zeros."""
    zeros = bytes(16 << 20)
    return [
        (LZ4(), lz4.block.compress(zeros, store_size=False)),
        (Zstd(), zstandard.ZstdCompressor().compress(zeros)),
        (Zstd(), zstandard.ZstdCompressor(write_content_size=False).compress(zeros)),
        (Zlib(), zlib.compress(zeros, 9)),
        (LZMA(), lzma.compress(zeros, format=lzma.FORMAT_XZ)),
        (Blosc2(), blosc2.compress2(zeros)),
    ]


@pytest.mark.parametrize("codec, block", _bomb_blocks(), ids=lambda x: repr(x)[:40])
def test_a_block_that_expands_past_its_raw_size_is_stopped(codec: Codec, block: bytes) -> None:
    # The container says the block holds 64 KiB; the block itself would give 16 MiB.
    payload = container(SMALL_BLOCK, SMALL_BLOCK, [block])
    out = np.full(SMALL_BLOCK + 64, 0xEE, dtype=np.uint8)
    tracemalloc.start()
    try:
        with pytest.raises((DecompressedSizeMismatch, CodecDataError)):
            codec.decode(payload, out=out[:SMALL_BLOCK])
        with pytest.raises((DecompressedSizeMismatch, CodecDataError)):
            codec.decode(payload)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 * SMALL_BLOCK
    assert (out[SMALL_BLOCK:] == 0xEE).all()


def test_zstd_frame_asking_for_a_huge_window_is_refused() -> None:
    data = bytes(range(256)) * 400
    frame = zstandard.ZstdCompressor(level=1).compress(data)
    assert frame[4] == 0xA0  # single segment, 4-byte content size: header is 9 bytes
    # Same blocks, but a frame header that is not single-segment and asks for 128 MiB.
    big_window = frame[:4] + bytes([0x80, 17 << 3]) + frame[5:]
    assert zstandard.ZstdDecompressor().decompress(big_window) == data  # a valid frame
    payload = container(1 << 17, len(data), [big_window])
    with pytest.raises(CodecDataError, match="window"):
        Zstd().decode(payload)


def test_lzma_stream_needing_a_large_dictionary_is_refused() -> None:
    data = bytes(range(256)) * 256
    block = lzma.compress(data, format=lzma.FORMAT_XZ, preset=9)  # 64 MiB dictionary
    with pytest.raises(CodecDataError, match="lzma"):
        LZMA().decode(container(SMALL_BLOCK, len(data), [block]))


def valid() -> bytes:
    return bytes(LZ4(block_size=SMALL_BLOCK).encode(bytes(3 * SMALL_BLOCK)))


THREE_BLOCKS = 3 * SMALL_BLOCK


@pytest.mark.parametrize(
    "payload, out_size, message",
    [
        (b"", 0, "shorter than its 16-byte header"),
        (valid()[:15], THREE_BLOCKS, "shorter than its 16-byte header"),
        (valid()[:20], THREE_BLOCKS, "truncated in its block table"),
        (valid()[:-1], THREE_BLOCKS, "block table accounts for"),
        (valid() + b"\x00", THREE_BLOCKS, "block table accounts for"),
        (container(1000, 10, [b"0123456789"]), 10, "invalid block_size"),
        (container(1 << 31, 10, [b"0123456789"]), 10, "invalid block_size"),
        (container(SMALL_BLOCK, 10, [b"0123456789"], nblocks=2), 10, "declares 2 blocks"),
        (container(SMALL_BLOCK, 10, [b"0123456789", b""]), 10, "declares 2 blocks"),
        (container(SMALL_BLOCK, 0, [b"x"]), 0, "declares 1 blocks"),
        (container(SMALL_BLOCK, 5, [b"0123456789"]), 5, "larger than its raw size"),
        (container(SMALL_BLOCK, 10, [b""]), 10, "corrupt lz4 block"),
        (container(SMALL_BLOCK, 10, [b"\xff" * 9]), 10, "corrupt lz4 block"),
    ],
)
def test_malformed_containers_raise_codec_data_error(
    payload: bytes, out_size: int, message: str
) -> None:
    with pytest.raises(CodecDataError, match=message):
        LZ4().decode(payload, out=np.empty(out_size, np.uint8))


def test_a_block_that_decodes_short_is_a_size_mismatch() -> None:
    short = lz4.block.compress(b"abcabcabcabc", store_size=False)
    with pytest.raises(DecompressedSizeMismatch, match="decoded to 12 bytes instead of 20"):
        LZ4().decode(container(SMALL_BLOCK, 20, [short]), out=bytearray(20))


@pytest.mark.parametrize("codec", BLOCK_CODECS, ids=repr)
def test_garbage_blocks_raise_wire_errors(codec: Codec) -> None:
    rng = np.random.default_rng(3)
    for size in (1, 5, 31, 32, 33, 100, 1000):
        block = rng.integers(0, 256, size, dtype=np.uint8).tobytes()
        with pytest.raises(WireError):
            codec.decode(container(SMALL_BLOCK, 2000, [block]), out=bytearray(2000))


def test_blosc2_chunks_must_fill_the_block() -> None:
    zeros = blosc2.compress2(bytes(4096), typesize=8)
    assert len(zeros) == 32 and (zeros[31] >> 4) & 7 == 1  # a "special zeros" chunk: fine
    out = np.full(4096, 0xEE, np.uint8)
    Blosc2().decode(container(SMALL_BLOCK, 4096, [zeros]), out=out)
    assert not out.any()
    uninit = zeros[:31] + bytes([(zeros[31] & 0x8F) | 4 << 4])
    out[:] = 0xEE
    with pytest.raises(CodecDataError, match="uninitialised"):
        Blosc2().decode(container(SMALL_BLOCK, 4096, [uninit]), out=out)
