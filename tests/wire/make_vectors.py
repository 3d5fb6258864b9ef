"""Write the wire-format test vectors: tests/wire/vectors/*.bin and vectors/index.json.

Run by hand from the repository root after a deliberate change to the wire format:

    .venv/bin/python tests/wire/make_vectors.py

then review the diff of tests/wire/vectors/ and update the hex dumps in
docs/wire-format.md if the bytes they show changed. Output is deterministic (the header's
``t0`` is fixed). ``tests/wire/test_vectors.py`` decodes every vector, compares it with
index.json and re-encodes the valid uncompressed ones byte for byte.

index.json lists one entry per vector, with ``type``:

- ``"message"``: ``file`` decodes to ``kind``, ``t0``, ``meta`` and ``tensors`` (each with
  ``name`` path, ``dtype``, ``shape``, ``order``, ``data_base64`` = the tensor's raw
  little-endian bytes in ``order``'s memory order, and ``values``, the same elements as a
  flat JSON list in that order; complex elements are ``[real, imag]``). ``encode`` holds
  the encoder options that made the file (``codecs``: each tensor's codec chain, as the
  configs that travel in the header); ``exact_reencode`` says whether they must reproduce
  it (compressed payloads may differ between compressor versions, so those are not).
  With a lossy codec in a chain, the tensors listed are what decoding the file gives, not
  what was encoded: such a vector pins decoding.
- ``"error"``: decoding ``file`` raises the ``tensorwire.errors`` class named ``error``.
- ``"chunks"``: the ``chunks`` files are ``message_file`` cut with ``chunk_payload``
  bytes per chunk and ``message_id``.

``needs_codecs`` (messages and errors): decode with the codec registry
(``tensorwire.codecs.get_codec``).
"""

from __future__ import annotations

import base64
import json
import struct
from pathlib import Path
from typing import Any

import ml_dtypes
import msgpack
import numpy as np
import xxhash

from tensorwire.wire import WIRE_DTYPES, decode_message, encode_message, iter_chunks
from tensorwire.wire.format import PREFIX_SIZE, pack_prefix
from tensorwire.wire.tensors import flatten

OUT = Path(__file__).resolve().parent / "vectors"
T0 = 1700000000.5
MESSAGE_ID = 0x0123456789ABCDEF
CHUNK_PAYLOAD = 128

DTYPE_VALUES: dict[str, list[Any]] = {
    "bool": [True, False, True],
    "int8": [-128, 0, 127],
    "int16": [-32768, 1, 32767],
    "int32": [-(2**31), 2, 2**31 - 1],
    "int64": [-(2**63), 3, 2**63 - 1],
    "uint8": [0, 1, 255],
    "uint16": [0, 258, 65535],
    "uint32": [0, 16909060, 2**32 - 1],
    "uint64": [0, 72623859790382856, 2**64 - 1],
    "float16": [1.0, -2.0, 65504.0],
    "bfloat16": [1.0, -2.0, 3.140625],
    "float32": [1.0, -0.5, 3.25],
    "float64": [1.0, -0.5, 1e300],
    "complex64": [[1.0, -1.0], [0.5, 2.0], [0.0, 0.0]],
    "complex128": [[1.0, -1.0], [0.5, 2.0], [-3.0, 1e-300]],
}


def array(dtype: str, values: list[Any], shape: tuple[int, ...], order: str = "C") -> np.ndarray:
    if dtype.startswith("complex"):
        values = [complex(re, im) for re, im in values]
    flat = np.array(values, dtype=WIRE_DTYPES[dtype])
    return flat.reshape(shape, order=order)


def describe_tensor(path: tuple[str, ...], arr: np.ndarray) -> dict[str, Any]:
    order = "F" if arr.flags.f_contiguous and not arr.flags.c_contiguous else "C"
    flat = arr.reshape(-1, order=order)
    dtype = next(name for name, dt in WIRE_DTYPES.items() if dt == arr.dtype)
    if dtype.startswith("complex"):
        values: list[Any] = [[float(v.real), float(v.imag)] for v in flat]
    elif arr.dtype == np.dtype(ml_dtypes.bfloat16):
        values = [float(v) for v in flat.astype(np.float32)]
    else:
        values = flat.tolist()
    return {
        "name": list(path),
        "dtype": dtype,
        "shape": list(arr.shape),
        "order": order,
        "data_base64": base64.b64encode(flat.tobytes()).decode(),
        "values": values,
    }


class Writer:
    def __init__(self) -> None:
        self.entries: list[dict[str, Any]] = []
        OUT.mkdir(exist_ok=True)
        for old in OUT.glob("*.bin"):
            old.unlink()

    def save(self, file: str, data: bytes) -> bytes:
        (OUT / file).write_bytes(data)
        return data

    def message(
        self,
        file: str,
        description: str,
        tensors: dict[str, Any],
        meta: dict[str, Any],
        *,
        checksum: bool = True,
        kind: str = "data",
        codecs: dict[str, list[dict[str, Any]]] | None = None,
    ) -> bytes:
        selector = None
        if codecs:
            from tensorwire.codecs import get_codec

            def selector(name: str, arr: np.ndarray) -> list[Any]:
                return [get_codec(c) for c in codecs.get(name, [])]

        enc = encode_message(tensors, meta, checksum=checksum, kind=kind, t0=T0, codecs=selector)
        data = self.save(file, enc.to_bytes())
        listed = list(flatten(tensors))
        if codecs:
            listed = self.decoded(data, listed, codecs)
        self.entries.append(
            {
                "type": "message",
                "file": file,
                "description": description,
                "encode": {"checksum": checksum, "kind": kind, "t0": T0, "codecs": codecs},
                "exact_reencode": not codecs,
                "needs_codecs": bool(codecs),
                "kind": kind,
                "t0": T0,
                "meta": meta,
                "tensors": [describe_tensor(p, np.asarray(a)) for p, a in listed],
            }
        )
        return data

    @staticmethod
    def decoded(
        data: bytes, listed: list[tuple[tuple[str, ...], Any]], codecs: dict[str, list[Any]]
    ) -> list[tuple[tuple[str, ...], np.ndarray]]:
        """The tensors as the reference decoder reads ``data`` back (what a lossy vector pins);
        checks that every chain in ``codecs`` was kept and that lossless ones round-trip."""
        from tensorwire.codecs import LOSSY_CODECS, get_codec

        hlen = struct.unpack_from("<I", data, 8)[0]
        header = msgpack.unpackb(data[PREFIX_SIZE : PREFIX_SIZE + hlen])
        kept = {"/".join(e["name"]): e.get("codecs", []) for e in header["tensors"]}
        for name, chain in codecs.items():
            if [c["id"] for c in kept[name]] != [c["id"] for c in chain]:
                raise AssertionError(f"the encoder did not keep {name!r}'s codec chain {chain}")
        got = dict(flatten(decode_message(data, codec_lookup=get_codec).tensors))
        out = []
        for path, arr in listed:
            dec = got[path]
            lossy = any(c["id"] in LOSSY_CODECS for c in kept["/".join(path)])
            if not lossy:
                want = np.asarray(arr)
                assert dec.dtype == want.dtype and dec.shape == want.shape
                assert dec.tobytes(order="A") == want.tobytes(order="A")
            out.append((path, dec))
        return out

    def error(
        self, file: str, description: str, data: bytes, error: str, needs_codecs: bool = False
    ) -> None:
        self.save(file, data)
        self.entries.append(
            {
                "type": "error",
                "file": file,
                "description": description,
                "error": error,
                "needs_codecs": needs_codecs,
            }
        )

    def chunks(self, stem: str, description: str, message_file: str, data: bytes) -> None:
        files = []
        for i, parts in enumerate(iter_chunks([data], MESSAGE_ID, CHUNK_PAYLOAD)):
            files.append(f"{stem}.{i}.bin")
            self.save(files[-1], b"".join(bytes(p) for p in parts))
        self.entries.append(
            {
                "type": "chunks",
                "description": description,
                "message_file": message_file,
                "message_id": MESSAGE_ID,
                "chunk_payload": CHUNK_PAYLOAD,
                "chunks": files,
            }
        )

    def finish(self) -> None:
        index = {
            "format": "tensorwire wire format version 1 test vectors; see docs/wire-format.md",
            "generator": "tests/wire/make_vectors.py",
            "vectors": self.entries,
        }
        (OUT / "index.json").write_text(to_json(index) + "\n", encoding="utf-8")


def to_json(obj: Any, level: int = 0) -> str:
    """JSON with short containers and lists of numbers on one line (a readable diff)."""
    one_line = json.dumps(obj, ensure_ascii=False)
    flat_list = isinstance(obj, list) and not any(isinstance(v, (dict, list)) for v in obj)
    if len(one_line) <= 90 or flat_list or not isinstance(obj, (dict, list)):
        return one_line
    pad = "  " * (level + 1)
    if isinstance(obj, dict):
        items = [f"{pad}{json.dumps(k)}: {to_json(v, level + 1)}" for k, v in obj.items()]
        return "{\n" + ",\n".join(items) + "\n" + "  " * level + "}"
    items = [pad + to_json(v, level + 1) for v in obj]
    return "[\n" + ",\n".join(items) + "\n" + "  " * level + "]"


def with_header(doc: dict[str, Any], body: bytes, digests: bool) -> bytes:
    """A message from a hand-written header map (the header check is correct)."""
    header = msgpack.packb(doc, use_bin_type=True)
    return pack_prefix(header, len(body), digests) + header + body


def main() -> None:
    w = Writer()
    w.message(
        "empty_meta_only.bin",
        "no tensors, metadata only, digests flag set",
        {},
        {"round": 0, "client": "server"},
    )
    f32 = array("float32", [0.0, 1.0, 2.0, 3.0, 4.0, 5.0], (2, 3))
    good = w.message(
        "float32_2x3.bin", "one float32 tensor 'x' of shape [2, 3], C order", {"x": f32}, {}
    )
    w.message(
        "all_dtypes.bin",
        "one 3-element tensor per wire dtype, named after it",
        {name: array(name, values, (3,)) for name, values in DTYPE_VALUES.items()},
        {},
    )
    w.message(
        "zero_d_and_empty.bin",
        "a 0-d float64 scalar and int32 tensors of shapes [0, 3] and [0]",
        {
            "scalar": array("float64", [2.5], ()),
            "empty": array("int32", [], (0, 3)),
            "nothing": array("uint8", [], (0,)),
        },
        {},
    )
    w.message(
        "fortran_order.bin",
        "int16 [2, 3] in Fortran (column-major) order: bytes are 1 4 2 5 3 6",
        {"f": array("int16", [1, 4, 2, 5, 3, 6], (2, 3), order="F")},
        {},
    )
    w.message(
        "nested_names.bin",
        "nested tensor names and nested metadata, kind 'update'",
        {
            "weights": {
                "conv1": {
                    "weight": array("float32", [0.5, -0.5, 0.25, -0.25], (1, 1, 2, 2)),
                    "bias": array("float32", [0.125], (1,)),
                },
                "bn": {"num_batches_tracked": array("int64", [7], ())},
            },
            "step": array("uint32", [3], ()),
        },
        {
            "round": 3,
            "client": "dev-1",
            "samples": 12500,
            "lr": 0.05,
            "shape": [2, [3, 4]],
            "opts": {"momentum": 0.9, "nesterov": False, "note": None},
        },
        kind="update",
    )
    w.message(
        "no_digests.bin",
        "float32 [2, 3] without per-tensor digests (flags = 0)",
        {"x": f32},
        {},
        checksum=False,
    )
    chunked = w.message(
        "chunked_message.bin",
        "a message that the 'chunks' vector cuts into 128-byte chunk payloads",
        {"w": np.arange(64, dtype=np.float32)},
        {"round": 1},
    )
    w.chunks(
        "chunked_message.chunk",
        "chunked_message.bin in chunks of 128 payload bytes, message id 0x0123456789abcdef",
        "chunked_message.bin",
        chunked,
    )

    try:
        import tensorwire.codecs  # noqa: F401
    except ImportError:
        have_codecs = False
        print("tensorwire.codecs is not importable: no compressed vectors")
    else:
        have_codecs = True
        pattern = np.tile(np.arange(16, dtype=np.float32), 64).reshape(32, 32)
        for codec in ("lz4", "zstd"):
            w.message(
                f"{codec}_compressed.bin",
                f"float32 [32, 32] (0..15 repeated) compressed with {codec}, and a raw tensor",
                {"z": pattern, "raw": array("uint8", [1, 2, 3], (3,))},
                {},
                codecs={"z": [{"id": codec, "block_size": 65536}]},
            )
        lz4 = (OUT / "lz4_compressed.bin").read_bytes()
        hlen = struct.unpack_from("<I", lz4, 8)[0]
        doc = msgpack.unpackb(lz4[PREFIX_SIZE : PREFIX_SIZE + hlen])
        doc["tensors"][0]["shape"] = [32, 31]
        doc["tensors"][0]["nbytes"] = 32 * 31 * 4
        w.error(
            "decompressed_size_mismatch.bin",
            "lz4_compressed.bin with tensor 'z' declared as [32, 31]: the payload holds 4096 bytes",
            with_header(doc, lz4[PREFIX_SIZE + hlen :], digests=True),
            "DecompressedSizeMismatch",
            needs_codecs=True,
        )

    hlen = struct.unpack_from("<I", good, 8)[0]
    header = good[PREFIX_SIZE : PREFIX_SIZE + hlen]
    w.error("bad_magic.bin", "float32_2x3.bin with magic 'TWIX'", b"TWIX" + good[4:], "BadMagic")
    w.error(
        "bad_version.bin",
        "float32_2x3.bin with version byte 2",
        good[:4] + b"\x02" + good[5:],
        "UnsupportedVersion",
    )
    flipped = bytearray(good)
    flipped[PREFIX_SIZE + hlen] ^= 0x01
    w.error(
        "checksum_mismatch.bin",
        "float32_2x3.bin with the first data byte changed (digest unchanged)",
        bytes(flipped),
        "ChecksumMismatch",
    )
    flipped = bytearray(good)
    flipped[PREFIX_SIZE + 4] ^= 0x01
    w.error(
        "header_check_mismatch.bin",
        "float32_2x3.bin with one header byte changed (header_check unchanged)",
        bytes(flipped),
        "HeaderCheckMismatch",
    )
    w.error(
        "truncated.bin", "float32_2x3.bin without its last 3 bytes", good[:-3], "TruncatedMessage"
    )
    doc = msgpack.unpackb(header)
    entry = doc["tensors"][0]
    w.error(
        "shape_mismatch.bin",
        "tensor 'x' declares shape [2, 3] float32 (24 bytes) but nbytes and size 20",
        with_header(
            {**doc, "tensors": [{**entry, "nbytes": 20, "size": 20}]},
            bytes(f32.tobytes()[:20]) + bytes(8),
            digests=True,
        ),
        "ShapeMismatch",
    )
    w.error(
        "unknown_dtype.bin",
        "tensor 'x' with dtype 'float8_e4m3' (not a wire dtype)",
        with_header(
            {**doc, "tensors": [{**entry, "dtype": "float8_e4m3", "nbytes": 6, "size": 6}]},
            bytes(6),
            digests=False,
        ),
        "UnknownDtype",
    )
    w.error(
        "unknown_codec.bin",
        "tensor 'x' with codec chain [{'id': 'snappy'}]",
        with_header(
            {**doc, "tensors": [{**entry, "codecs": [{"id": "snappy"}], "size": 4}]},
            b"abcd",
            digests=False,
        ),
        "UnknownCodec",
        needs_codecs=True,
    )
    if have_codecs:
        codec_vectors(w)
    w.finish()
    print(f"wrote {len(w.entries)} vectors to {OUT}")


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


if __name__ == "__main__":
    main()
