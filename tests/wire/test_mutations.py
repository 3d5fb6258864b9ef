"""Damaged and hostile bytes: only WireError comes out, and memory stays within the limits."""

from __future__ import annotations

import contextlib
import struct
import tracemalloc
from collections.abc import Callable
from typing import Any

import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from wire_helpers import (
    build_message,
    build_prefix,
    drain,
    lookup,
    tensor_entry,
    xor_zlib_chain,
    zlib_chain,
)

from tensorwire.errors import WireError
from tensorwire.wire import (
    NEED_DATA,
    PREFIX_SIZE,
    ChunkReassembler,
    Limits,
    MessageStream,
    decode_message,
    encode_message,
)
from tensorwire.wire.chunks import CHUNK_HEADER, CHUNK_MAGIC


def _bases() -> list[bytes]:
    rng = np.random.default_rng(7)
    return [
        encode_message({"x": np.arange(6, dtype=np.float32).reshape(2, 3)}, {"r": 1}).to_bytes(),
        encode_message(
            {"w": {"a": rng.standard_normal(20), "b": np.zeros((3, 0))}, "s": np.int64(5)},
            {"client": "d1", "hist": [1, [2, {"k": b"v"}]]},
            checksum=False,
        ).to_bytes(),
        encode_message(
            {"z": np.zeros((40, 40), np.float32), "f": np.asfortranarray(np.ones((5, 4)))},
            codecs=zlib_chain,
        ).to_bytes(),
        encode_message({"z": np.zeros(500, np.int16)}, codecs=xor_zlib_chain).to_bytes(),
        encode_message({}, {"only": "meta"}).to_bytes(),
    ]


BASES = _bases()
GOOD = encode_message({"good": np.arange(4)}, {"good": True}).to_bytes()


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    data = bytearray(draw(st.sampled_from(BASES)))
    for _ in range(draw(st.integers(1, 4))):
        n = len(data)
        # Half the edits land in the prefix and header, where the parsing logic is.
        pos = draw(st.integers(0, max(n - 1, 0)) | st.integers(0, min(n, 80)))
        op = draw(st.sampled_from(["flip", "replace", "insert", "delete", "truncate"]))
        if op == "flip" and n:
            data[pos % n] ^= 1 << draw(st.integers(0, 7))
        elif op == "replace" and n:
            data[pos % n] = draw(st.integers(0, 255))
        elif op == "insert":
            data[pos:pos] = draw(st.binary(min_size=1, max_size=16))
        elif op == "delete":
            del data[pos : pos + draw(st.integers(1, 16))]
        elif op == "truncate":
            del data[pos:]
    return bytes(data)


junk = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats()
    | st.text(max_size=6)
    | st.binary(max_size=6)
    | st.sampled_from(["float32", "C", "F", "test-zlib", "nope", "name"]),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=10,
)


@st.composite
def rewritten_headers(draw: st.DrawFn) -> bytes:
    """A base message whose header map has fields replaced by junk, with a valid header check.

    Bit flips mostly die at the header check; this reaches the validation behind it.
    """
    base = draw(st.sampled_from(BASES))
    (hlen,) = struct.unpack_from("<I", base, 8)
    doc = msgpack.unpackb(base[PREFIX_SIZE : PREFIX_SIZE + hlen])
    body = base[PREFIX_SIZE + hlen :]
    for _ in range(draw(st.integers(1, 3))):
        target = doc
        entries = doc.get("tensors")
        if isinstance(entries, list) and entries and draw(st.booleans()):
            target = entries[draw(st.integers(0, len(entries) - 1))]
            if not isinstance(target, dict):
                continue
        key = draw(st.sampled_from([*target.keys(), "shape", "nbytes", "codecs", "sizes"]))
        if draw(st.integers(0, 4)) == 0:
            target.pop(key, None)
        elif key in ("shape", "nbytes", "size", "sizes") and draw(st.booleans()):
            target[key] = draw(
                st.lists(st.integers(0, 2**64 - 1), max_size=4) | st.integers(0, 2**64 - 1)
            )
        else:
            target[key] = draw(junk)
    if draw(st.booleans()):  # keep the body length consistent with the new header sometimes
        body = body[: draw(st.integers(0, len(body)))]
    header = msgpack.packb(doc, use_bin_type=True)
    flags = base[5]
    return build_prefix(header, len(body), flags=flags) + header + body


def check_decode_message(data: bytes) -> None:
    for copy in (False, True):
        try:
            msg = decode_message(data, codec_lookup=lookup, copy=copy)
        except WireError:
            continue
        assert isinstance(msg.tensors, dict) and isinstance(msg.meta, dict)


def check_stream(data: bytes) -> None:
    """Only messages, WireError or NEED_DATA; after a recoverable error the next message decodes."""
    s = MessageStream(codec_lookup=lookup)
    recoverable_error = False
    try:
        s.receive_data(data)
    except WireError:
        assert s.broken
        return
    while True:
        try:
            event = s.next_event()
        except WireError:
            recoverable_error = True
            assert not s.broken
            continue
        if event is NEED_DATA:
            break
    if s.in_message:
        return  # the damaged message is waiting for more bytes: nothing else to check
    s.receive_data(GOOD)
    msg = s.next_event()
    assert msg is not NEED_DATA and msg.meta == {"good": True}, recoverable_error


SETTINGS = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(data=mutated())
def test_mutated_bytes_raise_only_wire_errors(data: bytes) -> None:
    check_decode_message(data)


@SETTINGS
@given(data=mutated())
def test_stream_on_mutated_bytes(data: bytes) -> None:
    check_stream(data)


@SETTINGS
@given(data=rewritten_headers())
def test_rewritten_headers_raise_only_wire_errors(data: bytes) -> None:
    check_decode_message(data)
    check_stream(data)


@settings(max_examples=200, deadline=None)
@given(data=st.binary(max_size=200), prefix_ok=st.booleans())
def test_random_bytes_raise_only_wire_errors(data: bytes, prefix_ok: bool) -> None:
    if prefix_ok and len(data) >= PREFIX_SIZE:
        data = b"TWIR\x01" + data[5:]
    check_decode_message(data)
    check_stream(data)


def test_every_single_byte_flip_of_a_message_is_caught() -> None:
    """With digests on, any one flipped bit anywhere gives a WireError or an intact message."""
    base = encode_message({"x": np.arange(8, dtype=np.int32)}, {"r": 1}).to_bytes()
    for i in range(len(base)):
        for bit in (0, 7):
            data = bytearray(base)
            data[i] ^= 1 << bit
            with pytest.raises(WireError):
                decode_message(bytes(data))


# --- allocation bound -------------------------------------------------------------------

MiB = 1 << 20
SMALL = Limits(max_message_bytes=MiB, max_header_bytes=64 << 10)
SLACK = 256 << 10  # headers, Python objects, the pool's size-class rounding


def peak_bytes(fn: Callable[[], Any]) -> int:
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        with contextlib.suppress(WireError):
            fn()
        return tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()


def _stream_feed(data: bytes) -> Callable[[], None]:
    def run() -> None:
        s = MessageStream(codec_lookup=lookup, limits=SMALL)
        s.receive_data(data)
        drain(s)

    return run


def _hostile() -> dict[str, bytes]:
    f32 = "float32"
    return {
        "shape 2**40": build_message({"tensors": [tensor_entry(("x",), f32, (2**40,))]}),
        "shape 2**40 with a small body": build_message(
            {"tensors": [tensor_entry(("x",), f32, (2**40,))]}, bytes(100), body_length=100
        ),
        "compressed claims 2**40": build_message(
            {
                "tensors": [
                    tensor_entry(("x",), f32, (2**40,), size=3, codecs=[{"id": "test-zlib"}])
                ]
            },
            b"abc",
        ),
        "many tensors just under the limit each": build_message(
            {
                "tensors": [
                    tensor_entry(
                        (str(i),), "uint8", (900_000,), size=1, codecs=[{"id": "test-zlib"}]
                    )
                    for i in range(50)
                ]
            },
            bytes(50),
        ),
        "huge scratch stage": build_message(
            {
                "tensors": [
                    tensor_entry(
                        ("x",),
                        "uint8",
                        (10,),
                        size=1,
                        codecs=[{"id": "test-xor"}, {"id": "test-zlib"}],
                        sizes=[2**40],
                    )
                ]
            },
            bytes(1),
        ),
        "empty with huge dims": build_message(
            {"tensors": [tensor_entry(("x",), f32, (0, 2**62, 2**62))]}
        ),
        "prefix claims 1 TiB body": build_prefix(b"\x80", 1 << 40) + b"\x80",
        "prefix claims a 60 KiB header": build_prefix(b"", 0, header_length=60 << 10),
    }


HOSTILE = _hostile()


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_headers_stay_within_the_limit(name: str) -> None:
    data = HOSTILE[name]
    assert peak_bytes(lambda: decode_message(data, limits=SMALL, codec_lookup=lookup)) < SLACK
    assert peak_bytes(lambda: decode_message(data, limits=SMALL, copy=True)) < SLACK
    assert peak_bytes(_stream_feed(data)) < (64 << 10) + SLACK


def test_header_memory_is_bounded_by_the_header_limit() -> None:
    """msgpack objects cost at most ~72 bytes per header byte (an empty map); the header
    limit, not the message limit, bounds them."""
    n = 20_000
    header = msgpack.packb({"meta": {"a": [{}] * n, "b": [[[[[]]]]] * n}})
    data = build_prefix(header, 0) + header
    assert peak_bytes(lambda: decode_message(data, limits=SMALL)) < 80 * len(header)
    assert peak_bytes(_stream_feed(data)) < 81 * len(header)
    tight = Limits(max_header_bytes=len(header) - 1)
    assert peak_bytes(lambda: decode_message(data, limits=tight)) < 4096


def test_hostile_chunks_stay_within_the_limit() -> None:
    def chunk(count: int, total: int) -> bytes:
        return CHUNK_HEADER.pack(CHUNK_MAGIC, 1, 0, 0, 7, 0, count, 0, total)

    r = ChunkReassembler(max_message_bytes=MiB)
    for data in (chunk(2**32 - 1, 100), chunk(2**32 - 1, MiB), chunk(2, 1 << 40)):
        assert peak_bytes(lambda d=data: r.feed(d, 0.0)) < SLACK
    assert peak_bytes(lambda: r.feed(chunk(1000, MiB) + bytes(1024), 0.0)) < MiB + SLACK


def _big_base() -> bytes:
    rng = np.random.default_rng(11)
    return encode_message(
        {
            "w": rng.standard_normal((300, 300)).astype(np.float32),  # 360 KB raw
            "x": np.arange(50_000, dtype=np.int32) % 7,  # 200 KB through xor + zlib
        },
        {"round": 3},
        codecs=lambda name, a: xor_zlib_chain(name, a) if name == "x" else [],
    ).to_bytes()


BIG = _big_base()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    edits=st.lists(
        st.tuples(st.integers(0, 200) | st.integers(0, len(BIG) - 1), st.integers(0, 255)),
        min_size=1,
        max_size=3,
    ),
    cut=st.none() | st.integers(0, len(BIG)),
)
def test_mutated_big_messages_stay_within_the_limit(
    edits: list[tuple[int, int]], cut: int | None
) -> None:
    data = bytearray(BIG)
    for pos, value in edits:
        data[pos] = value
    data = bytes(data[:cut])
    bound = MiB + SLACK
    assert (
        peak_bytes(lambda: decode_message(data, limits=SMALL, codec_lookup=lookup, copy=True))
        < bound
    )
    assert peak_bytes(_stream_feed(data)) < bound


def test_the_big_base_message_is_near_the_limit() -> None:
    msg = decode_message(BIG, limits=SMALL, codec_lookup=lookup)
    assert 0.5 * MiB < msg.nbytes + msg["x"].nbytes <= MiB  # decoded + scratch
