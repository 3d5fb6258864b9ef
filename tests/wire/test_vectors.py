"""The checked-in test vectors (tests/wire/vectors, written by make_vectors.py) still hold.

Valid vectors decode to what index.json says and, when uncompressed, re-encode to the same
bytes; invalid ones raise the named error; chunk vectors reassemble and re-chunk exactly.
"""

from __future__ import annotations

import base64
import json
import random
import struct
from pathlib import Path
from typing import Any

import lz4.block
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
            encoded = spec_container_decode(e["codecs"][i]["id"], encoded)
            assert len(encoded) == stages[i]
        tensors.append({**e, "data": encoded})
    assert pos == len(data)
    return {**doc, "tensors": tensors}


def spec_container_decode(codec: str, payload: bytes) -> bytes:
    block_size, raw_length, nblocks = struct.unpack_from("<IQI", payload)
    sizes = struct.unpack_from(f"<{nblocks}I", payload, 16)
    pos, out = 16 + 4 * nblocks, []
    for i, size in enumerate(sizes):
        raw_i = min(block_size, raw_length - i * block_size)
        block = payload[pos : pos + size]
        pos += size
        if size == raw_i:
            out.append(block)
        elif codec == "lz4":
            out.append(lz4.block.decompress(block, uncompressed_size=raw_i))
        elif codec == "zstd":
            out.append(zstandard.ZstdDecompressor().decompress(block))
        else:
            raise AssertionError(codec)
    assert pos == len(payload)
    return b"".join(out)


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
