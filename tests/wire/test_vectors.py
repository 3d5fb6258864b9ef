"""The checked-in test vectors (tests/wire/vectors, written by make_vectors.py) still hold.

Valid vectors decode to what index.json says and, when uncompressed, re-encode to the same
bytes; invalid ones raise the named error; chunk vectors reassemble and re-chunk exactly.
A second decoder, written from docs/wire-format.md alone (the lossless codecs through
their libraries, the lossy payloads of section 11.3 by hand), reads every valid vector to
the same bytes.
"""

from __future__ import annotations

import base64
import json
import lzma
import random
import struct
import zlib
from pathlib import Path
from typing import Any

import blosc2
import lz4.block
import ml_dtypes
import msgpack
import numpy as np
import pytest
import xxhash
import zstandard
from wire_helpers import drain, feed_pieces

import tensorwire.errors
from tensorwire.wire import (
    WIRE_DTYPES,
    ChunkReassembler,
    Message,
    MessageStream,
    decode_message,
    encode_message,
    iter_chunks,
    parse_chunk,
)
from tensorwire.wire.tensors import flatten, unflatten

VECTORS = Path(__file__).resolve().parent / "vectors"
INDEX = json.loads((VECTORS / "index.json").read_text(encoding="utf-8"))["vectors"]


def by_type(kind: str) -> list[dict[str, Any]]:
    return [v for v in INDEX if v["type"] == kind]


def ident(v: dict[str, Any]) -> str:
    return v.get("file") or v["message_file"] + " chunks"


def codec_lookup() -> Any:
    codecs = pytest.importorskip("tensorwire.codecs", reason="tensorwire.codecs is not importable")
    return codecs.get_codec


def expected_array(t: dict[str, Any]) -> np.ndarray:
    dtype = WIRE_DTYPES[t["dtype"]]
    flat = np.frombuffer(base64.b64decode(t["data_base64"]), dtype)
    return flat.reshape(t["shape"], order=t["order"])


def check_message(msg: Message, v: dict[str, Any]) -> None:
    assert msg.kind == v["kind"]
    assert msg.t0 == v["t0"]
    assert msg.meta == v["meta"]
    got = dict(flatten(msg.tensors))
    assert [tuple(t["name"]) for t in v["tensors"]] == list(got)  # same names, same order
    for t in v["tensors"]:
        arr = got[tuple(t["name"])]
        want = expected_array(t)
        assert arr.dtype == WIRE_DTYPES[t["dtype"]]
        assert list(arr.shape) == t["shape"]
        if t["order"] == "F":
            assert arr.flags.f_contiguous
        else:
            assert arr.flags.c_contiguous
        assert (
            arr.reshape(-1, order=t["order"]).tobytes()
            == want.reshape(-1, order=t["order"]).tobytes()
        )
        values = t["values"]
        if t["dtype"].startswith("complex"):
            values = [complex(re, im) for re, im in values]
        np.testing.assert_array_equal(
            arr.reshape(-1, order=t["order"]), np.array(values, dtype=arr.dtype)
        )


@pytest.mark.parametrize("v", by_type("message"), ids=ident)
def test_valid_vector_decodes_as_indexed(v: dict[str, Any]) -> None:
    data = (VECTORS / v["file"]).read_bytes()
    lookup = codec_lookup() if v["needs_codecs"] else None
    check_message(decode_message(data, codec_lookup=lookup), v)
    s = MessageStream(codec_lookup=lookup)
    feed_pieces(s, data, random.Random(0), 17)
    (msg,) = drain(s)
    check_message(msg, v)


@pytest.mark.parametrize("v", [v for v in by_type("message") if v["exact_reencode"]], ids=ident)
def test_valid_vector_reencodes_to_the_same_bytes(v: dict[str, Any]) -> None:
    tensors = unflatten([(tuple(t["name"]), expected_array(t)) for t in v["tensors"]])
    opts = v["encode"]
    enc = encode_message(
        tensors, v["meta"], checksum=opts["checksum"], kind=opts["kind"], t0=opts["t0"]
    )
    assert enc.to_bytes() == (VECTORS / v["file"]).read_bytes()


@pytest.mark.parametrize("v", by_type("error"), ids=ident)
def test_invalid_vector_raises_the_named_error(v: dict[str, Any]) -> None:
    data = (VECTORS / v["file"]).read_bytes()
    error = getattr(tensorwire.errors, v["error"])
    lookup = codec_lookup() if v["needs_codecs"] else None
    with pytest.raises(error) as info:
        decode_message(data, codec_lookup=lookup)
    assert type(info.value) is error


@pytest.mark.parametrize("v", by_type("chunks"), ids=ident)
def test_chunk_vector_reassembles_and_rechunks_exactly(v: dict[str, Any]) -> None:
    message = (VECTORS / v["message_file"]).read_bytes()
    chunks = [(VECTORS / f).read_bytes() for f in v["chunks"]]
    for i, c in enumerate(chunks):
        head, payload = parse_chunk(c)
        assert (head.message_id, head.index, head.count) == (v["message_id"], i, len(chunks))
        assert head.offset == i * v["chunk_payload"] and head.total_length == len(message)
        assert bytes(payload) == message[head.offset : head.offset + len(payload)]
    r = ChunkReassembler()
    results = [r.feed(c, now=0.0) for c in reversed(chunks)]
    assert results[:-1] == [None] * (len(chunks) - 1)
    assert results[-1].tobytes() == message
    again = [
        b"".join(bytes(p) for p in parts)
        for parts in iter_chunks([message], v["message_id"], v["chunk_payload"])
    ]
    assert again == chunks


def test_the_index_covers_what_the_spec_promises() -> None:
    files = {v.get("file") for v in INDEX} | {f for v in by_type("chunks") for f in v["chunks"]}
    assert files - {None} == {p.name for p in VECTORS.glob("*.bin")}
    errors = {v["error"] for v in by_type("error")}
    assert {
        "BadMagic",
        "UnsupportedVersion",
        "ChecksumMismatch",
        "ShapeMismatch",
        "UnknownDtype",
    } <= errors
    dtypes = {t["dtype"] for v in by_type("message") for t in v["tensors"]}
    assert dtypes == set(WIRE_DTYPES)


def test_every_codec_has_a_vector() -> None:
    codecs = pytest.importorskip("tensorwire.codecs", reason="tensorwire.codecs is not importable")
    chains = [chain for v in by_type("message") for chain in (v["encode"]["codecs"] or {}).values()]
    configs = [c for chain in chains for c in chain]
    # floatplanes-zl is announced only where openzl is installed
    assert {c["id"] for c in configs} - set(codecs.available_codecs()) <= {"floatplanes-zl"}
    assert set(codecs.available_codecs()) <= {c["id"] for c in configs}
    lossless = {"lz4", "zstd", "zlib", "lzma", "blosc2", "floatplanes", "floatplanes-zl"}
    assert {c["id"] for c in configs} == {*lossless, *SPEC_LOSSY}
    assert {c["filter"] for c in configs if c["id"] == "blosc2"} >= {"shuffle", "bitshuffle"}
    qsgd_levels = {c["levels"] for c in configs if c["id"] == "qsgd"}
    assert {2 if s == 1 else 4 if s <= 7 else 8 for s in qsgd_levels} == {2, 4, 8}  # code widths
    assert max(len(chain) for chain in chains) >= 3  # a chain with two inner 'sizes'
    lossy_dtypes = {c["dtype"] for c in configs if c["id"] in SPEC_LOSSY}
    assert lossy_dtypes == {"float16", "bfloat16", "float32", "float64"}
    assert {"CodecDataError", "DecompressedSizeMismatch", "UnknownCodec"} <= {
        v["error"] for v in by_type("error")
    }


# --- an independent decoder, written from docs/wire-format.md alone ----------------------


def spec_decode(data: bytes) -> dict[str, Any]:
    """Decode a valid message by the letter of docs/wire-format.md (no tensorwire code)."""
    magic, version, flags, reserved, hlen, hcheck, blen = struct.unpack_from("<4sBBHIIQ", data)
    assert (magic, version, reserved) == (b"TWIR", 1, 0) and flags & ~1 == 0
    header = data[24 : 24 + hlen]
    assert xxhash.xxh3_64_intdigest(header) & 0xFFFFFFFF == hcheck
    doc = msgpack.unpackb(header)
    assert len(data) == 24 + hlen + blen
    pos, tensors = 24 + hlen, []
    for e in doc.get("tensors", []):
        encoded = data[pos : pos + e["size"]]
        pos += e["size"]
        if flags & 1:
            assert struct.unpack_from("<Q", data, pos)[0] == xxhash.xxh3_64_intdigest(encoded)
            pos += 8
        stages = [e["nbytes"], *e.get("sizes", []), e["size"]]
        for i in reversed(range(len(e.get("codecs", [])))):
            encoded = spec_codec_decode(e["codecs"][i], encoded)
            assert len(encoded) == stages[i]
        tensors.append({**e, "data": encoded})
    assert pos == len(data)
    return {**doc, "tensors": tensors}


def spec_codec_decode(config: dict[str, Any], payload: bytes) -> bytes:
    """One codec stage of section 11."""
    if config["id"] in SPEC_LOSSY:
        return SPEC_LOSSY[config["id"]](config, payload)
    return spec_container_decode(config["id"], payload)


def spec_container_decode(codec: str, payload: bytes) -> bytes:
    """The block container (11.1) and its compressed blocks (11.2)."""
    block_size, raw_length, nblocks = struct.unpack_from("<IQI", payload)
    assert 1 << 16 <= block_size <= 1 << 30 and nblocks == -(-raw_length // block_size)
    sizes = struct.unpack_from(f"<{nblocks}I", payload, 16)
    pos, out = 16 + 4 * nblocks, []
    for i, size in enumerate(sizes):
        raw_i = min(block_size, raw_length - i * block_size)
        block = payload[pos : pos + size]
        pos += size
        assert size <= raw_i
        if size == raw_i:
            out.append(block)
        elif codec == "lz4":
            out.append(lz4.block.decompress(block, uncompressed_size=raw_i))
        elif codec == "zstd":
            out.append(zstandard.ZstdDecompressor().decompress(block))
        elif codec == "zlib":
            out.append(zlib.decompress(block))
        elif codec == "lzma":
            out.append(lzma.decompress(block, format=lzma.FORMAT_XZ))
        elif codec == "blosc2":
            nbytes, cbytes = struct.unpack_from("<I4xI", block, 4)
            assert (nbytes, cbytes) == (raw_i, size)
            out.append(blosc2.decompress(block))
        elif codec in ("floatplanes", "floatplanes-zl"):
            out.append(spec_floatplanes_block(block, raw_i))
        else:
            raise AssertionError(codec)
        assert len(out[-1]) == raw_i
    assert pos == len(payload)
    return b"".join(out)


def spec_floatplanes_block(block: bytes, raw_i: int) -> bytes:
    """A floatplanes block (11.2): byte planes of rotated elements, raw, DEFLATE or (bit 31
    of the size) an OpenZL frame."""
    t = block[0]
    n = raw_i // t
    flagged = struct.unpack_from(f"<{t}I", block, 1)
    pos, words = 1 + 4 * t, [0] * n
    for k, size in enumerate(s & ~(1 << 31) for s in flagged):
        stream = block[pos : pos + size]
        pos += size
        if flagged[k] >> 31:
            zl = pytest.importorskip("openzl.ext", reason="openzl is not installed")
            plane = zl.DCtx().decompress(bytes(stream))[0].content.as_bytes()
        else:
            plane = stream if size == n else zlib.decompress(stream, -15)
        assert len(plane) == n
        words = [w | (b << (8 * k)) for w, b in zip(words, plane, strict=True)]
    bits = 8 * t
    rotated = [(w >> 1) | ((w & 1) << (bits - 1)) if t > 1 else w for w in words]
    return b"".join(w.to_bytes(t, "little") for w in rotated)


# Section 11.3: the lossy payloads. Arithmetic in float32, float64 for float64 tensors,
# rounded to the tensor's dtype at the end (numpy's casts round to nearest, ties to even).
SPEC_FLOATS = {
    "float16": np.dtype("<f2"),
    "bfloat16": np.dtype(ml_dtypes.bfloat16),
    "float32": np.dtype("<f4"),
    "float64": np.dtype("<f8"),
}


def spec_work(config: dict[str, Any]) -> type:
    return np.float64 if config["dtype"] == "float64" else np.float32


def spec_out(config: dict[str, Any], values: np.ndarray) -> bytes:
    return values.astype(SPEC_FLOATS[config["dtype"]]).tobytes()


def spec_cast(half: Any) -> Any:
    def decode(config: dict[str, Any], payload: bytes) -> bytes:
        assert len(payload) % 2 == 0
        return spec_out(config, np.frombuffer(payload, half).astype(spec_work(config)))

    return decode


def spec_blocked(config: dict[str, Any], n: int, default_block: int) -> np.ndarray:
    """The block number of each element."""
    return np.arange(n) // config.get("block_size", default_block)


def spec_int8(config: dict[str, Any], payload: bytes) -> bytes:
    (n,) = struct.unpack_from("<Q", payload)
    nb = -(-n // config.get("block_size", 4096))
    assert len(payload) == 8 + 4 * nb + n
    scales = np.frombuffer(payload, "<f4", nb, 8)
    q = np.frombuffer(payload, np.int8, n, 8 + 4 * nb)
    assert (scales >= 0).all() and np.isfinite(scales).all() and (q >= -127).all()
    work = spec_work(config)
    return spec_out(config, q.astype(work) * scales.astype(work)[spec_blocked(config, n, 4096)])


def spec_qsgd(config: dict[str, Any], payload: bytes) -> bytes:
    (n,) = struct.unpack_from("<Q", payload)
    s = config.get("levels", 127)
    width = 2 if s == 1 else 4 if s <= 7 else 8
    nb = -(-n // config.get("block_size", 512))
    assert len(payload) == 8 + 4 * nb + -(-n * width // 8)
    norms = np.frombuffer(payload, "<f4", nb, 8)
    codes = []
    for i in range(n):  # code i: bits [i * width, (i + 1) * width) of the code bytes, LSB first
        byte, shift = divmod(i * width, 8)
        codes.append(payload[8 + 4 * nb + byte] >> shift & (1 << width) - 1)
    assert all(c <= 2 * s for c in codes)
    work = spec_work(config)
    steps = norms.astype(work) / work(s)  # norm / s first, then times (c - s)
    return spec_out(
        config, (np.array(codes) - s).astype(work) * steps[spec_blocked(config, n, 512)]
    )


def spec_sparse(config: dict[str, Any], payload: bytes) -> bytes:
    n, k, zero = struct.unpack_from("<QII", payload)
    dtype = SPEC_FLOATS[config["dtype"]]
    assert zero == 0 and k <= n and len(payload) == 16 + k * (dtype.itemsize + 2)
    out = np.zeros(n, dtype)
    values = np.frombuffer(payload, dtype, k, 16)
    gaps = struct.unpack_from(f"<{k}H", payload, 16 + k * dtype.itemsize)
    idx = -1
    for value, gap in zip(values, gaps, strict=True):
        idx += gap + 1
        out[idx] = value
    return out.tobytes()


M64 = (1 << 64) - 1


def spec_mix(z: int) -> int:
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9 & M64
    z = (z ^ (z >> 27)) * 0x94D049BB133111EB & M64
    return z ^ (z >> 31)


def spec_randomk(config: dict[str, Any], payload: bytes) -> bytes:
    n, seed, k, zero = struct.unpack_from("<QQII", payload)
    dtype = SPEC_FLOATS[config["dtype"]]
    assert zero == 0 and k <= n < 1 << 62 and len(payload) == 24 + k * dtype.itemsize
    keys = [spec_mix((seed + (r + 1) * 0x9E3779B97F4A7C15) & M64) for r in range(4)]
    h = max(1, -(-(n - 1).bit_length() // 2))
    mask = (1 << h) - 1
    indices: list[int] = []
    j = 0
    while len(indices) < k:
        left, right = j >> h, j & mask
        for key in keys:
            left, right = right, left ^ (spec_mix((right + key) & M64) & mask)
        if (index := left << h | right) < n:
            indices.append(index)
        j += 1
    out = np.zeros(n, dtype)
    out[indices] = np.frombuffer(payload, dtype, k, 24)
    return out.tobytes()


def spec_signsgd(config: dict[str, Any], payload: bytes) -> bytes:
    n, scale = struct.unpack_from("<Qf", payload)
    assert len(payload) == 12 + -(-n // 8) and np.isfinite(scale) and scale >= 0
    negative = [payload[12 + i // 8] >> (i % 8) & 1 for i in range(n)]
    scale = spec_work(config)(scale)
    return spec_out(config, np.array([-scale if b else scale for b in negative]) + 0.0)


SPEC_LOSSY = {
    "fp16": spec_cast(np.dtype("<f2")),
    "bf16": spec_cast(np.dtype(ml_dtypes.bfloat16)),
    "int8": spec_int8,
    "qsgd": spec_qsgd,
    "topk": spec_sparse,
    "dgc": spec_sparse,
    "randomk": spec_randomk,
    "signsgd": spec_signsgd,
}


@pytest.mark.parametrize("v", by_type("message"), ids=ident)
def test_an_independent_decoder_written_from_the_spec_reads_the_vectors(v: dict[str, Any]) -> None:
    doc = spec_decode((VECTORS / v["file"]).read_bytes())
    assert doc.get("kind", "data") == v["kind"] and doc.get("t0") == v["t0"]
    assert doc.get("meta", {}) == v["meta"]
    assert len(doc["tensors"]) == len(v["tensors"])
    for got, want in zip(doc["tensors"], v["tensors"], strict=True):
        for key in ("name", "dtype", "shape"):
            assert got[key] == want[key]
        assert got.get("order", "C") == want["order"]
        assert got["data"] == base64.b64decode(want["data_base64"])
