"""Shared helpers for the wire tests: test codecs, hand-built messages, stream feeders.

The codecs here implement the ``tensorwire.wire.Codec`` protocol with the standard library
only, so the wire tests do not depend on ``tensorwire.codecs`` (tested in tests/codecs).
"""

from __future__ import annotations

import math
import random
import zlib
from collections.abc import Mapping
from typing import Any

import msgpack
import numpy as np

from tensorwire.errors import CodecDataError, DecompressedSizeMismatch, UnknownCodec
from tensorwire.wire import NEED_DATA, WIRE_DTYPES, Message, MessageStream
from tensorwire.wire.format import PREFIX, VERSION, header_check, pack_prefix
from tensorwire.wire.tensors import flatten


class ZlibTestCodec:
    """zlib, decoding exactly into ``out`` and never inflating past its size."""

    codec_id = "test-zlib"

    def __init__(self, level: int = 1) -> None:
        self.level = level

    def encode(self, buf: Any) -> bytes:
        return zlib.compress(buf, self.level)

    def decode(self, buf: Any, out: Any = None) -> Any:
        d = zlib.decompressobj()
        limit = len(out) if out is not None else 1 << 30
        try:
            data = d.decompress(buf, limit + 1)  # bounded: no decompression bomb in tests
        except zlib.error as exc:
            raise CodecDataError(f"corrupt zlib stream: {exc}") from None
        if out is None:
            return data
        if len(data) != len(out) or not d.eof:
            raise DecompressedSizeMismatch(f"zlib stream holds another size than {len(out)}")
        memoryview(out)[:] = data
        return out

    def get_config(self) -> dict[str, Any]:
        return {"id": self.codec_id, "level": self.level}


class XorTestCodec:
    """XOR every byte with ``key``: a size-preserving stage for multi-codec chains."""

    codec_id = "test-xor"

    def __init__(self, key: int = 0x5A) -> None:
        self.key = key

    def encode(self, buf: Any) -> bytes:
        return (np.frombuffer(buf, np.uint8) ^ np.uint8(self.key)).tobytes()

    def decode(self, buf: Any, out: Any = None) -> Any:
        src = np.frombuffer(buf, np.uint8)
        if out is None:
            return (src ^ np.uint8(self.key)).tobytes()
        if len(src) != len(out):
            raise DecompressedSizeMismatch(f"{len(src)} bytes do not fill {len(out)}")
        np.bitwise_xor(src, np.uint8(self.key), out=np.frombuffer(out, np.uint8))
        return out

    def get_config(self) -> dict[str, Any]:
        return {"id": self.codec_id, "key": self.key}


class ShortTestCodec:
    """A broken codec: its payload decodes to 1 byte less than the header says (it says so)."""

    codec_id = "test-short"

    def encode(self, buf: Any) -> bytes:
        return bytes(memoryview(buf)[:-1])[:1]

    def decode(self, buf: Any, out: Any = None) -> Any:
        raise DecompressedSizeMismatch(f"payload decodes to {len(out) - 1} bytes, not {len(out)}")

    def get_config(self) -> dict[str, Any]:
        return {"id": self.codec_id}


class FailingTestCodec:
    """A codec whose library raises its own (non-tensorwire) error on decode."""

    codec_id = "test-fail"

    def encode(self, buf: Any) -> bytes:
        return b"x"

    def decode(self, buf: Any, out: Any = None) -> Any:
        raise RuntimeError("library exploded")

    def get_config(self) -> dict[str, Any]:
        return {"id": self.codec_id}


TEST_CODECS = {
    c.codec_id: c for c in (ZlibTestCodec, XorTestCodec, ShortTestCodec, FailingTestCodec)
}


def lookup(config: Mapping[str, Any]) -> Any:
    """A ``CodecLookup`` over the test codecs; ``UnknownCodec`` for anything else."""
    cls = TEST_CODECS.get(config["id"])
    if cls is None:
        raise UnknownCodec(f"unknown codec {config['id']!r}")
    return cls(**{k: v for k, v in config.items() if k != "id"})


def zlib_chain(name: str, arr: np.ndarray) -> list[Any]:
    """A ``CodecSelector``: zlib for every tensor."""
    return [ZlibTestCodec()]


def xor_zlib_chain(name: str, arr: np.ndarray) -> list[Any]:
    """A ``CodecSelector``: a two-stage chain (xor first, then zlib)."""
    return [XorTestCodec(), ZlibTestCodec()]


# --- hand-built messages ----------------------------------------------------------------


def build_message(
    doc: Any, body: bytes = b"", *, digests: bool = False, body_length: int | None = None
) -> bytes:
    """Prefix + msgpack(doc) + body, with a header check that passes."""
    header = msgpack.packb(doc, use_bin_type=True)
    blen = len(body) if body_length is None else body_length
    return pack_prefix(header, blen, digests) + header + body


def build_prefix(
    header: bytes,
    body_length: int,
    *,
    magic: bytes = b"TWIR",
    version: int = VERSION,
    flags: int = 0,
    reserved: int = 0,
    header_length: int | None = None,
) -> bytes:
    """A prefix with every field under the caller's control (the check is computed)."""
    hlen = len(header) if header_length is None else header_length
    return PREFIX.pack(magic, version, flags, reserved, hlen, header_check(header), body_length)


def tensor_entry(name: Any = ("x",), dtype: Any = "uint8", shape: Any = (4,), **extra: Any) -> dict:
    """One header tensor entry, consistent by default (raw, C order)."""
    entry: dict[str, Any] = {"name": list(name), "dtype": dtype, "shape": list(shape)}
    itemsize = WIRE_DTYPES[dtype].itemsize if isinstance(dtype, str) and dtype in WIRE_DTYPES else 1
    nbytes = math.prod(shape) * itemsize
    entry.update(nbytes=nbytes, size=nbytes)
    entry.update(extra)
    return entry


# --- stream feeders ---------------------------------------------------------------------


def drain(stream: MessageStream) -> list[Message]:
    """All complete messages the stream holds (errors propagate)."""
    out = []
    while (event := stream.next_event()) is not NEED_DATA:
        out.append(event)
    return out


def feed_pieces(stream: MessageStream, data: bytes, rng: random.Random, max_piece: int) -> None:
    """``receive_data`` in random-sized pieces (0-length pieces included)."""
    pos = 0
    while pos < len(data):
        n = rng.randint(0, max_piece)
        stream.receive_data(data[pos : pos + n])
        pos += n


def feed_via_buffers(
    stream: MessageStream, data: bytes, rng: random.Random, max_piece: int
) -> None:
    """``next_buffer`` / ``advance`` as a transport's ``recv_into`` loop would, random sizes."""
    pos = 0
    while pos < len(data):
        view = stream.next_buffer()
        assert len(view) > 0
        n = min(len(view), rng.randint(1, max_piece), len(data) - pos)
        view[:n] = data[pos : pos + n]
        stream.advance(n)
        pos += n


def leaves(tensors: Mapping[str, Any]) -> dict[tuple[str, ...], Any]:
    return dict(flatten(tensors))


def assert_same_tensor(got: np.ndarray, want: np.ndarray) -> None:
    """Same dtype (as little-endian), shape and bytes; NaN payloads included."""
    assert isinstance(got, np.ndarray)
    assert got.dtype == want.dtype.newbyteorder("<") or got.dtype == want.dtype
    assert got.shape == want.shape
    want_le = want.astype(got.dtype, copy=False)
    assert np.ascontiguousarray(got).tobytes() == np.ascontiguousarray(want_le).tobytes()


def assert_same_tensors(got: Mapping[str, Any], want: Mapping[str, Any]) -> None:
    g, w = leaves(got), leaves(want)
    assert g.keys() == w.keys()
    for path in w:
        assert_same_tensor(g[path], np.asarray(w[path]))
