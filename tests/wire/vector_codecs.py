"""The codec vectors of tests/wire/make_vectors.py: messages compressed with zlib, lzma,
blosc2, floatplanes and floatplanes-zl, the lossy codecs and codec chains, and the errors a
decoder with the codec registry must raise."""

from __future__ import annotations

import struct
from typing import Any

import msgpack
import numpy as np
import xxhash
from vector_writer import OUT, Writer, array, with_header

from tensorwire.wire import WIRE_DTYPES
from tensorwire.wire.format import PREFIX_SIZE


def ramp(n: int, dtype: str, start: int = 0) -> np.ndarray:
    """``n`` distinct-looking values in [-0.615, 0.615] (0 among them), reproducible anywhere:
    one correctly rounded float64 product each, rounded to ``dtype``."""
    k = (np.arange(start, start + n, dtype=np.int64) * 37) % 101 - 50
    return (k * 0.0123).astype(WIRE_DTYPES[dtype])


def codec_vectors(w: Writer) -> None:
    """Vectors for zlib, lzma, blosc2, floatplanes, the lossy codecs, chains, and codec errors."""
    pattern = np.tile(np.arange(16, dtype=np.float32), 64).reshape(32, 32)
    raw = array("uint8", [1, 2, 3], (3,))
    lossless: list[tuple[str, str, dict[str, Any]]] = [
        ("zlib_compressed.bin", "zlib", {"id": "zlib", "level": 1, "block_size": 65536}),
        ("lzma_compressed.bin", "lzma", {"id": "lzma", "preset": 6, "block_size": 65536}),
        (
            "blosc2_shuffle.bin",
            "blosc2 (lz4, byte shuffle of 4-byte elements)",
            {
                "id": "blosc2",
                "cname": "lz4",
                "clevel": 5,
                "filter": "shuffle",
                "typesize": 4,
                "block_size": 65536,
            },
        ),
        (
            "blosc2_bitshuffle.bin",
            "blosc2 (zstd, bit shuffle of 4-byte elements)",
            {
                "id": "blosc2",
                "cname": "zstd",
                "clevel": 5,
                "filter": "bitshuffle",
                "typesize": 4,
                "block_size": 65536,
            },
        ),
        (
            "floatplanes_compressed.bin",
            "floatplanes (byte planes of 4-byte elements, DEFLATE)",
            {"id": "floatplanes", "typesize": 4, "block_size": 65536},
        ),
    ]
    for file, what, config in lossless:
        w.message(
            file,
            f"float32 [32, 32] (0..15 repeated) compressed with {what}, and a raw tensor",
            {"z": pattern, "raw": raw},
            {},
            codecs={"z": [config]},
        )
    # floatplanes-zl on values whose exponent plane has few zero bytes: it is Huffman coded
    # (an OpenZL frame), not run-length DEFLATE as the pattern's would be.
    w.message(
        "floatplanes_zl_compressed.bin",
        "float32 [32, 32] (a ramp of 101 values) compressed with floatplanes-zl (byte planes "
        "of 4-byte elements, OpenZL Huffman frames), and a raw tensor",
        {"z": ramp(1024, "float32").reshape(32, 32), "raw": raw},
        {},
        codecs={"z": [{"id": "floatplanes-zl", "typesize": 4, "block_size": 65536}]},
    )

    # Lossy codecs: each vector pins what a decoder makes of the stored payload.
    int8_x = ramp(40, "float32").reshape(5, 8)
    int8_x[:2] = 0  # block 0 (16 elements) is all zero: scale 0
    lossy: list[tuple[str, str, dict[str, Any], dict[str, list[dict[str, Any]]]]] = [
        (
            "lossy_fp16.bin",
            "fp16: float32 [8, 8] and float64 [16] sent as binary16",
            {"x": ramp(64, "float32").reshape(8, 8), "d": ramp(16, "float64", 7)},
            {
                "x": [{"id": "fp16", "dtype": "float32"}],
                "d": [{"id": "fp16", "dtype": "float64"}],
            },
        ),
        (
            "lossy_bf16.bin",
            "bf16: float32 [8, 8] and float64 [16] sent as bfloat16",
            {"x": ramp(64, "float32").reshape(8, 8), "d": ramp(16, "float64", 7)},
            {
                "x": [{"id": "bf16", "dtype": "float32"}],
                "d": [{"id": "bf16", "dtype": "float64"}],
            },
        ),
        (
            "lossy_int8.bin",
            "int8: float32 [5, 8] in blocks of 16 (the first all zero, the last 8 long), "
            "float64 [20] in blocks of 8, bfloat16 [20] in blocks of 16",
            {"x": int8_x, "d": ramp(20, "float64", 3), "b": ramp(20, "bfloat16", 5)},
            {
                "x": [{"id": "int8", "dtype": "float32", "block_size": 16}],
                "d": [{"id": "int8", "dtype": "float64", "block_size": 8}],
                "b": [{"id": "int8", "dtype": "bfloat16", "block_size": 16}],
            },
        ),
        (
            "lossy_qsgd.bin",
            "qsgd: 2-bit (levels 1), 4-bit (levels 5, 3) and 8-bit (levels 127) codes; "
            "float32, float16 and float64 tensors; several blocks and padding bits",
            {
                "s1": ramp(37, "float32"),
                "s5": ramp(37, "float32", 1),
                "s127": ramp(37, "float32", 2),
                "h": ramp(24, "float16", 3),
                "d": ramp(21, "float64", 4),
            },
            {
                "s1": [
                    {"id": "qsgd", "dtype": "float32", "levels": 1, "block_size": 16, "seed": 1}
                ],
                "s5": [
                    {"id": "qsgd", "dtype": "float32", "levels": 5, "block_size": 16, "seed": 2}
                ],
                "s127": [
                    {"id": "qsgd", "dtype": "float32", "levels": 127, "block_size": 512, "seed": 3}
                ],
                "h": [
                    {"id": "qsgd", "dtype": "float16", "levels": 127, "block_size": 16, "seed": 4}
                ],
                "d": [{"id": "qsgd", "dtype": "float64", "levels": 3, "block_size": 8, "seed": 5}],
            },
        ),
        (
            "lossy_topk.bin",
            "topk: the 10 largest of float32 [10, 10] and the 10 largest of bfloat16 [40]",
            {"x": ramp(100, "float32").reshape(10, 10), "b": ramp(40, "bfloat16", 9)},
            {
                "x": [{"id": "topk", "dtype": "float32", "ratio": 0.1}],
                "b": [{"id": "topk", "dtype": "bfloat16", "ratio": 0.25}],
            },
        ),
        (
            "lossy_randomk.bin",
            "randomk: 10 random entries of float32 [100] and 3 of float64 [12]",
            {"x": ramp(100, "float32", 1), "d": ramp(12, "float64", 2)},
            {
                "x": [{"id": "randomk", "dtype": "float32", "ratio": 0.1, "seed": 11}],
                "d": [{"id": "randomk", "dtype": "float64", "ratio": 0.25, "seed": 12}],
            },
        ),
        (
            "lossy_dgc.bin",
            "dgc: about the 10 largest of float32 [100] by a sampled threshold",
            {"x": ramp(100, "float32", 5)},
            {
                "x": [
                    {"id": "dgc", "dtype": "float32", "ratio": 0.1, "sample_ratio": 0.01, "seed": 7}
                ]
            },
        ),
        (
            "lossy_signsgd.bin",
            "signsgd: float32 [37] (zeros, padding bits), bfloat16 [12], an all-zero float32 [16]",
            {
                "x": ramp(37, "float32"),
                "b": ramp(12, "bfloat16", 6),
                "z": np.zeros(16, np.float32),
            },
            {
                "x": [{"id": "signsgd", "dtype": "float32"}],
                "b": [{"id": "signsgd", "dtype": "bfloat16"}],
                "z": [{"id": "signsgd", "dtype": "float32"}],
            },
        ),
    ]
    for file, description, tensors, chains in lossy:
        w.message(file, description, tensors, {}, codecs=chains)

    chains = {
        "topk_zstd": [
            {"id": "topk", "dtype": "float32", "ratio": 0.1},
            {"id": "zstd", "level": 1, "block_size": 65536},
        ],
        "fp16_blosc2": [
            {"id": "fp16", "dtype": "float32"},
            {
                "id": "blosc2",
                "cname": "lz4",
                "clevel": 5,
                "filter": "shuffle",
                "typesize": 2,
                "block_size": 65536,
            },
        ],
        "int8_zlib_lz4": [
            {"id": "int8", "dtype": "float32", "block_size": 64},
            {"id": "zlib", "level": 9, "block_size": 65536},
            {"id": "lz4", "acceleration": 1, "block_size": 65536},
        ],
    }
    chained = w.message(
        "codec_chains.bin",
        "codec chains: topk then zstd; fp16 then blosc2; int8, zlib, then lz4 (three stages, "
        "two 'sizes'; lz4 stores its one block as is)",
        {name: ramp(256, "float32", i).reshape(16, 16) for i, name in enumerate(chains)},
        {},
        codecs=chains,
    )

    # A payload the codec must refuse: an int8 code of -128 (the digest is recomputed).
    data = bytearray((OUT / "lossy_int8.bin").read_bytes())
    hlen = struct.unpack_from("<I", data, 8)[0]
    doc = msgpack.unpackb(data[PREFIX_SIZE : PREFIX_SIZE + hlen])
    first = doc["tensors"][0]
    assert first["name"] == ["x"] and first["codecs"][0]["id"] == "int8"
    end = PREFIX_SIZE + hlen + first["size"]
    data[end - 1] = 0x80
    data[end : end + 8] = struct.pack(
        "<Q", xxhash.xxh3_64_intdigest(bytes(data[end - first["size"] : end]))
    )
    w.error(
        "codec_data_error.bin",
        "lossy_int8.bin with tensor 'x''s last int8 code set to -128 (digest recomputed)",
        bytes(data),
        "CodecDataError",
        needs_codecs=True,
    )
    hlen = struct.unpack_from("<I", chained, 8)[0]
    doc = msgpack.unpackb(chained[PREFIX_SIZE : PREFIX_SIZE + hlen])
    entry = doc["tensors"][0]
    assert entry["codecs"][1]["id"] == "zstd"
    entry["codecs"][1]["level"] = 23
    w.error(
        "bad_codec_config.bin",
        "codec_chains.bin with zstd 'level' 23 (out of range) in tensor 'topk_zstd''s chain",
        with_header(doc, chained[PREFIX_SIZE + hlen :], digests=True),
        "CodecDataError",
        needs_codecs=True,
    )
