"""Every kind of bad input raises its own WireError subclass, from both decoders.

A bad message must never take a stream down unless framing is lost: errors found after a
verified header are raised in the message's place and the next message decodes; errors in
the prefix or header check break the stream (``broken``), and it says so from then on.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgpack
import numpy as np
import pytest
import xxhash
from wire_helpers import (
    ZlibTestCodec,
    build_message,
    build_prefix,
    drain,
    lookup,
    tensor_entry,
)

from tensorwire.errors import (
    BadMagic,
    ChecksumMismatch,
    CodecDataError,
    DecompressedSizeMismatch,
    HeaderCheckMismatch,
    HeaderTooLarge,
    MalformedHeader,
    MessageTooLarge,
    ShapeMismatch,
    TensorwireError,
    TruncatedMessage,
    UnknownCodec,
    UnknownDtype,
    UnsupportedVersion,
    WireError,
)
from tensorwire.wire import PREFIX_SIZE, Limits, MessageStream, decode_message, encode_message

GOOD = encode_message({"ok": np.arange(3, dtype=np.int16)}, {"good": True}).to_bytes()


def one_tensor(entry: dict[str, Any], body: bytes | None = None, **kw: Any) -> bytes:
    """A message with one tensor entry; body defaults to ``entry['size']`` bytes."""
    size = entry.get("size")
    if body is None:
        body = bytes(size) if isinstance(size, int) and size > 0 else b""
    return build_message({"tensors": [entry]}, body, **kw)


def with_digests(entry: dict[str, Any], data: bytes, digest: bytes) -> bytes:
    return build_message({"tensors": [entry]}, data + digest, digests=True)


@dataclass
class Case:
    data: bytes
    error: type[WireError]
    framing: bool  # True: the stream cannot find the next message and breaks
    limits: Limits = field(default_factory=Limits)
    lookup: Callable | None = lookup
    match: str | None = None


def _bad_version() -> bytes:
    header = msgpack.packb({"tensors": []})
    return build_prefix(header, 0, version=2) + header


def _corrupt_header_byte() -> bytes:
    data = bytearray(encode_message({"x": np.zeros(3)}, {"k": "v"}).to_bytes())
    data[PREFIX_SIZE + 3] ^= 0x20
    return bytes(data)


def _corrupt_data_byte() -> bytes:
    data = bytearray(encode_message({"x": np.arange(40, dtype=np.uint8)}).to_bytes())
    data[-20] ^= 0x01
    return bytes(data)


def _corrupt_digest_byte() -> bytes:
    data = bytearray(encode_message({"x": np.arange(40, dtype=np.uint8)}).to_bytes())
    data[-1] ^= 0x80
    return bytes(data)


def _compressed(entry_extra: dict[str, Any], payload: bytes) -> bytes:
    entry = tensor_entry(("z",), "uint8", (1000,), size=len(payload), **entry_extra)
    return one_tensor(entry, payload)


def _compressed_claim(shape: tuple[int, ...]) -> bytes:
    """A 3-byte 'compressed' tensor whose header claims ``shape`` of float32."""
    entry = tensor_entry(("big",), "float32", shape, size=3, codecs=[{"id": "test-zlib"}])
    return one_tensor(entry, b"abc")


ZLIB_1000 = ZlibTestCodec().encode(bytes(1000))
ZLIB_999 = ZlibTestCodec().encode(bytes(999))

CASES: dict[str, Case] = {
    # prefix: framing errors
    "bad magic": Case(b"TWIX" + GOOD[4:], BadMagic, True),
    "not tensorwire at all": Case(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", BadMagic, True),
    "unknown version": Case(_bad_version(), UnsupportedVersion, True),
    "unknown flag": Case(GOOD[:5] + bytes([GOOD[5] | 0x80]) + GOOD[6:], MalformedHeader, True),
    "reserved set": Case(GOOD[:6] + b"\x01\x00" + GOOD[8:], MalformedHeader, True),
    "header over limit": Case(
        encode_message({}, {"pad": "x" * 300}).to_bytes(),
        HeaderTooLarge,
        True,
        Limits(max_header_bytes=300),
    ),
    "body over limit": Case(
        encode_message({"x": np.zeros(100)}).to_bytes(),
        MessageTooLarge,
        True,
        Limits(max_message_bytes=500),
    ),
    "header check": Case(_corrupt_header_byte(), HeaderCheckMismatch, True),
    "body length in prefix disagrees with header": Case(
        one_tensor(tensor_entry(), bytes(5), body_length=5), HeaderCheckMismatch, True
    ),
    "digest flag flipped": Case(
        GOOD[:5] + bytes([GOOD[5] ^ 0x01]) + GOOD[6:], HeaderCheckMismatch, True
    ),
    # header validated: the message is skipped, the stream goes on
    "not msgpack": Case(
        build_prefix(b"\xc1\xc1\xc1", 0) + b"\xc1\xc1\xc1",
        MalformedHeader,
        False,
        match="msgpack",
    ),
    "trailing msgpack": Case(
        build_prefix(b"\x80\x80", 0) + b"\x80\x80", MalformedHeader, False, match="msgpack"
    ),
    "header not a map": Case(build_message([1, 2, 3]), MalformedHeader, False, match="map"),
    "int map key": Case(build_message({1: 2}), MalformedHeader, False),
    "kind not str": Case(build_message({"kind": 3}), MalformedHeader, False, match="kind"),
    "meta not map": Case(build_message({"meta": [1]}), MalformedHeader, False, match="meta"),
    "t0 not number": Case(build_message({"t0": "now"}), MalformedHeader, False, match="t0"),
    "tensors not array": Case(build_message({"tensors": {}}), MalformedHeader, False),
    "tensor not map": Case(build_message({"tensors": [[1]]}), MalformedHeader, False),
    "name missing": Case(
        one_tensor({k: v for k, v in tensor_entry().items() if k != "name"}),
        MalformedHeader,
        False,
        match="name",
    ),
    "name empty": Case(one_tensor(tensor_entry(name=())), MalformedHeader, False, match="name"),
    "name part empty": Case(one_tensor(tensor_entry(name=("a", ""))), MalformedHeader, False),
    "name not strings": Case(one_tensor(tensor_entry(name=("a", 1))), MalformedHeader, False),
    "duplicate names": Case(
        build_message({"tensors": [tensor_entry(), tensor_entry()]}, bytes(8)),
        MalformedHeader,
        False,
        match="same name",
    ),
    "name runs through a tensor": Case(
        build_message({"tensors": [tensor_entry(("a",)), tensor_entry(("a", "b"))]}, bytes(8)),
        MalformedHeader,
        False,
        match="runs through",
    ),
    "unknown dtype": Case(one_tensor(tensor_entry(dtype="float128")), UnknownDtype, False),
    "dtype not a string": Case(one_tensor(tensor_entry(dtype=["f4"])), UnknownDtype, False),
    "numpy dtype string": Case(one_tensor(tensor_entry(dtype="<f4")), UnknownDtype, False),
    "shape not array": Case(
        one_tensor({**tensor_entry(), "shape": 4}), MalformedHeader, False, match="shape"
    ),
    "negative dim": Case(one_tensor({**tensor_entry(), "shape": [-4]}), MalformedHeader, False),
    "bool dim": Case(one_tensor({**tensor_entry(), "shape": [True]}), MalformedHeader, False),
    "float dim": Case(one_tensor({**tensor_entry(), "shape": [4.0]}), MalformedHeader, False),
    "too many dims": Case(
        one_tensor(tensor_entry(shape=(1,) * 9)), MalformedHeader, False, Limits(max_ndim=8)
    ),
    "empty but numpy cannot shape it": Case(
        one_tensor(tensor_entry(dtype="float32", shape=(0, 2**62, 2**62))),
        MalformedHeader,
        False,
        match="too big",
    ),
    "bad order": Case(one_tensor(tensor_entry(order="A")), MalformedHeader, False, match="order"),
    "nbytes missing": Case(
        one_tensor({k: v for k, v in tensor_entry().items() if k != "nbytes"}),
        MalformedHeader,
        False,
        match="nbytes",
    ),
    "size negative": Case(one_tensor({**tensor_entry(), "size": -1}), MalformedHeader, False),
    "shape vs nbytes": Case(
        one_tensor(tensor_entry(dtype="float32", shape=(2, 3), nbytes=20, size=20)),
        ShapeMismatch,
        False,
    ),
    "raw size vs nbytes": Case(
        one_tensor(tensor_entry(dtype="float32", shape=(2, 3), size=20)), ShapeMismatch, False
    ),
    "codecs not array": Case(one_tensor(tensor_entry(codecs={"id": "x"})), MalformedHeader, False),
    "codecs nil": Case(one_tensor(tensor_entry(codecs=None)), MalformedHeader, False),
    "sizes nil": Case(one_tensor(tensor_entry(sizes=None)), MalformedHeader, False),
    "sizes without codecs": Case(one_tensor(tensor_entry(sizes=[4])), MalformedHeader, False),
    "codec without id": Case(
        one_tensor(tensor_entry(codecs=[{"level": 1}], size=2)), MalformedHeader, False
    ),
    "sizes count": Case(
        _compressed({"codecs": [{"id": "test-zlib", "level": 1}], "sizes": [5]}, ZLIB_1000),
        MalformedHeader,
        False,
        match="sizes",
    ),
    "too many tensors": Case(
        build_message({"tensors": [tensor_entry((str(i),)) for i in range(3)]}, bytes(12)),
        MessageTooLarge,
        False,
        Limits(max_tensors=2),
    ),
    "decoded size over limit": Case(
        _compressed_claim((2**40,)), MessageTooLarge, False, Limits(max_message_bytes=1 << 20)
    ),
    "scratch over limit": Case(
        build_message(
            {
                "tensors": [
                    tensor_entry(
                        ("s",),
                        "uint8",
                        (600_000,),
                        size=10,
                        codecs=[{"id": "test-xor"}, {"id": "test-zlib"}],
                        sizes=[600_000],
                    )
                ]
            },
            bytes(10),
        ),
        MessageTooLarge,
        False,
        Limits(max_message_bytes=1 << 20),
    ),
    "unknown codec": Case(
        _compressed({"codecs": [{"id": "nope"}]}, ZLIB_1000), UnknownCodec, False, match="nope"
    ),
    "codec but no lookup": Case(
        _compressed({"codecs": [{"id": "test-zlib"}]}, ZLIB_1000),
        UnknownCodec,
        False,
        lookup=None,
        match="no codec registry",
    ),
    "codec config rejected": Case(
        _compressed({"codecs": [{"id": "test-zlib", "bogus": 1}]}, ZLIB_1000), UnknownCodec, False
    ),
    # body: the stream skips the rest of the message
    "checksum of data": Case(_corrupt_data_byte(), ChecksumMismatch, False),
    "checksum digest": Case(_corrupt_digest_byte(), ChecksumMismatch, False),
    "decompressed size (codec says)": Case(
        _compressed({"codecs": [{"id": "test-zlib"}]}, ZLIB_999), DecompressedSizeMismatch, False
    ),
    "decompressed size (short codec)": Case(
        _compressed({"codecs": [{"id": "test-short"}]}, b"x"), DecompressedSizeMismatch, False
    ),
    "codec data": Case(
        _compressed({"codecs": [{"id": "test-zlib"}]}, b"not zlib"), CodecDataError, False
    ),
    "codec library error": Case(
        _compressed({"codecs": [{"id": "test-fail"}]}, b"x"),
        CodecDataError,
        False,
        match="library exploded",
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_decode_message_raises_the_specific_error(name: str) -> None:
    case = CASES[name]
    with pytest.raises(case.error, match=case.match) as info:
        decode_message(case.data, limits=case.limits, codec_lookup=case.lookup)
    assert type(info.value) is case.error  # not a parent or a sibling


@pytest.mark.parametrize("name", list(CASES))
def test_stream_raises_the_same_error_and_recovers_unless_framing_is_lost(name: str) -> None:
    case = CASES[name]
    s = MessageStream(limits=case.limits, codec_lookup=case.lookup)
    s.receive_data(GOOD)
    if case.framing:
        with pytest.raises(case.error) as info:
            s.receive_data(case.data + GOOD)
        assert type(info.value) is case.error
        assert s.broken
        assert drain(s)[0].meta == {"good": True}  # the message before is still delivered
        with pytest.raises(WireError, match="broken"):
            s.receive_data(GOOD)
        with pytest.raises(WireError, match="broken"):
            s.next_buffer()
    else:
        s.receive_data(case.data + GOOD)
        assert not s.broken
        assert s.next_event().meta == {"good": True}
        with pytest.raises(case.error, match=case.match) as info:
            s.next_event()
        assert type(info.value) is case.error
        assert s.next_event().meta == {"good": True}
        assert drain(s) == [] and not s.in_message


def test_every_design_error_class_is_exercised() -> None:
    needed = {
        BadMagic,
        UnsupportedVersion,
        HeaderTooLarge,
        MessageTooLarge,
        UnknownDtype,
        UnknownCodec,
        ShapeMismatch,
        ChecksumMismatch,
        DecompressedSizeMismatch,
        TruncatedMessage,
        HeaderCheckMismatch,
        MalformedHeader,
        CodecDataError,
    }
    assert needed - {c.error for c in CASES.values()} == {TruncatedMessage}  # tested below


# --- truncation -------------------------------------------------------------------------


@pytest.mark.parametrize("cut", [0, 1, 10, PREFIX_SIZE - 1, PREFIX_SIZE, PREFIX_SIZE + 5, -9, -1])
def test_truncated_input_raises_truncated_message(cut: int) -> None:
    data = encode_message({"x": np.arange(10)}, {"m": 1}).to_bytes()
    with pytest.raises(TruncatedMessage):
        decode_message(data[:cut])


def test_truncated_stream_waits_for_more_data() -> None:
    data = encode_message({"x": np.arange(10)}).to_bytes()
    s = MessageStream()
    s.receive_data(data[:-1])
    assert drain(s) == [] and s.in_message and not s.broken


def test_bytes_after_the_message_are_refused_by_decode_message() -> None:
    with pytest.raises(MalformedHeader, match="follow the end"):
        decode_message(GOOD + b"\x00")


def test_decode_message_checks_the_prefix_before_the_length() -> None:
    with pytest.raises(BadMagic):
        decode_message(b"XXXX" + bytes(40))
    header = b"\x80"
    huge = build_prefix(header, 1 << 30) + header
    with pytest.raises(MessageTooLarge):
        decode_message(huge, limits=Limits(max_message_bytes=1 << 20))
    with pytest.raises(TruncatedMessage):
        decode_message(huge)


def test_error_messages_say_what_to_do() -> None:
    with pytest.raises(HeaderTooLarge, match=r"raise Limits\.max_header_bytes"):
        decode_message(GOOD, limits=Limits(max_header_bytes=8))
    with pytest.raises(UnknownDtype, match="this build reads: bool"):
        decode_message(CASES["unknown dtype"].data)


def test_errors_are_value_errors_and_tensorwire_errors() -> None:
    with pytest.raises(ValueError):
        decode_message(b"nope" * 10)
    with pytest.raises(TensorwireError):
        decode_message(b"nope" * 10)


def test_digest_layout_is_u64_little_endian() -> None:
    entry = tensor_entry(("x",), "uint8", (4,))
    good = struct.pack("<Q", xxhash.xxh3_64_intdigest(b"abcd"))
    assert decode_message(with_digests(entry, b"abcd", good))["x"].tobytes() == b"abcd"
    with pytest.raises(ChecksumMismatch):
        decode_message(with_digests(entry, b"abcd", good[::-1]))
