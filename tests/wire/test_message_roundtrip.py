"""Messages survive encode -> bytes -> decode by every decoding route, bit for bit."""

from __future__ import annotations

import random
from typing import Any

import ml_dtypes
import numpy as np
import pytest
import xxhash
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from wire_helpers import (
    assert_same_tensors,
    drain,
    feed_pieces,
    feed_via_buffers,
    leaves,
    lookup,
    xor_zlib_chain,
    zlib_chain,
)

from tensorwire.errors import ChecksumMismatch
from tensorwire.wire import (
    PREFIX_SIZE,
    WIRE_DTYPES,
    EncodedMessage,
    Message,
    MessageStream,
    decode_message,
    encode_message,
)
from tensorwire.wire.format import FLAG_DIGESTS


def decode_all_ways(enc: EncodedMessage, seed: int = 0) -> list[Message]:
    """Decode one encoded message by every route; each must give one message."""
    data = enc.to_bytes()
    assert len(data) == enc.nbytes == len(enc)
    assert b"".join(bytes(b) for seg in enc.segments(segment_bytes=97) for b in seg) == data
    assert b"".join(bytes(b) for seg in enc.segments() for b in seg) == data
    rng = random.Random(seed)
    routes = [
        decode_message(data, codec_lookup=lookup),
        decode_message(bytearray(data), codec_lookup=lookup, copy=True),
        decode_message(memoryview(data), codec_lookup=lookup),
    ]
    s = MessageStream(codec_lookup=lookup)
    feed_pieces(s, data, rng, max_piece=max(len(data) // 5, 1))
    routes += drain(s)
    s = MessageStream(codec_lookup=lookup, max_read=rng.randint(1, 64))
    feed_via_buffers(s, data, rng, max_piece=97)
    routes += drain(s)
    s = MessageStream(codec_lookup=lookup)
    s.receive_data(data)  # all at once
    routes += drain(s)
    s = MessageStream(codec_lookup=lookup)
    for seg in enc.segments(segment_bytes=50):
        for buf in seg:
            s.receive_data(buf)
    routes += drain(s)
    assert len(routes) == 7
    assert not s.in_message and not s.broken
    return routes


def check_roundtrip(tensors: dict[str, Any], meta: dict[str, Any] | None = None, **kw: Any) -> None:
    enc = encode_message(tensors, meta, **kw)
    for msg in decode_all_ways(enc):
        assert_same_tensors(msg.tensors, tensors)
        assert msg.meta == (meta or {})
        assert msg.t0 == enc.t0
        assert msg.kind == kw.get("kind", "data")
        assert msg.nbytes == enc.raw_nbytes
        assert msg.wire_nbytes == enc.nbytes


def sample(dtype: np.dtype, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    n = int(np.prod(shape))
    if dtype == np.bool_:
        return rng.integers(0, 2, n).astype(np.bool_).reshape(shape)
    raw = rng.integers(0, 256, n * dtype.itemsize, dtype=np.uint8)
    return raw.view(dtype).reshape(shape)


# --- dtypes, shapes, layouts ------------------------------------------------------------


@pytest.mark.parametrize("name", list(WIRE_DTYPES))
@pytest.mark.parametrize("checksum", [True, False])
def test_every_dtype_roundtrips_with_its_wire_name(name: str, checksum: bool) -> None:
    rng = np.random.default_rng(1)
    dtype = WIRE_DTYPES[name]
    tensors = {
        "m": sample(dtype, (3, 5), rng),
        "scalar": sample(dtype, (), rng),
        "empty": sample(dtype, (2, 0, 3), rng),
    }
    check_roundtrip(tensors, checksum=checksum)
    msg = decode_message(encode_message(tensors).to_bytes())
    assert msg["m"].dtype == dtype and msg["scalar"].shape == () and msg["empty"].shape == (2, 0, 3)


def test_bfloat16_values_are_the_float32_top_halves() -> None:
    values = np.array([1.0, -2.5, 3.140625, np.inf], np.float32)
    arr = values.astype(ml_dtypes.bfloat16)
    data = encode_message({"b": arr}, checksum=False).to_bytes()
    body = data[-arr.nbytes :]
    assert body == (values.view(np.uint32) >> 16).astype("<u2").tobytes()
    got = decode_message(data)["b"]
    assert got.dtype == np.dtype(ml_dtypes.bfloat16)
    np.testing.assert_array_equal(got.astype(np.float32), values)


def test_zero_dim_and_empty_tensors() -> None:
    tensors = {
        "zero_d": np.float64(3.5),
        "zero_d_array": np.array(7, np.int64),
        "empty": np.zeros((0,), np.float32),
        "empty_2d": np.zeros((4, 0), np.int16),
        "empty_f": np.asfortranarray(np.zeros((0, 3, 2), np.uint8)),
    }
    check_roundtrip(tensors)
    msg = decode_message(encode_message(tensors).to_bytes())
    assert msg["zero_d"].shape == () and msg["zero_d"] == 3.5
    assert msg["empty_2d"].shape == (4, 0)


def test_fortran_order_stays_fortran() -> None:
    a = np.asfortranarray(np.arange(24, dtype=np.float32).reshape(2, 3, 4))
    enc = encode_message({"f": a})
    assert enc.buffers[0].tobytes() == a.tobytes(order="F")  # sent as is, no transpose
    for msg in decode_all_ways(enc):
        got = msg["f"]
        assert got.flags.f_contiguous and not got.flags.c_contiguous
        np.testing.assert_array_equal(got, a)


def test_non_contiguous_inputs_are_made_contiguous_once() -> None:
    base = np.arange(4 * 6 * 5, dtype=np.int32).reshape(4, 6, 5)
    tensors = {
        "step": base[::2, 1:, ::-1],
        "transposed": base.transpose(1, 0, 2),
        "column": base[:, 2, 3],
    }
    check_roundtrip(tensors)
    got = decode_message(encode_message(tensors).to_bytes())["transposed"]
    assert got.flags.c_contiguous


@pytest.mark.parametrize("dtype", [">i4", ">f8", ">u2", ">c8", ">f2"])
def test_big_endian_input_arrives_little_endian(dtype: str) -> None:
    a = np.arange(12).astype(dtype).reshape(3, 4)
    f = np.asfortranarray(a)
    enc = encode_message({"a": a, "f": f, "strided": a[:, ::2]})
    for msg in decode_all_ways(enc):
        for key, want in (("a", a), ("f", f), ("strided", a[:, ::2])):
            assert msg[key].dtype == np.dtype(dtype).newbyteorder("<")
            np.testing.assert_array_equal(msg[key], want)
        assert msg["f"].flags.f_contiguous


def test_nested_names_and_meta() -> None:
    rng = np.random.default_rng(3)
    tensors = {
        "weights": {
            "conv1": {"weight": rng.standard_normal((4, 3, 3, 3), np.float32), "bias": np.zeros(4)},
            "fc": {"weight": rng.standard_normal((10, 8)).astype(np.float16)},
        },
        "step": np.int64(12),
        "a/b": np.ones(2, np.uint8),  # a slash inside one name part is just a character
    }
    meta = {
        "round": np.int64(3),
        "lr": np.float32(0.5),
        "ok": np.bool_(True),
        "client": "dev-3",
        "blob": b"\x00\xff",
        "history": [1, 2.5, "x", None, [True, {"deep": [np.uint16(7)]}]],
        "cfg": {"model": {"layers": [16, 32], "name": "vgg5"}, "empty": {}},
    }
    enc = encode_message(tensors, meta)
    want_meta = {
        **meta,
        "round": 3,
        "lr": 0.5,
        "ok": True,
        "history": [1, 2.5, "x", None, [True, {"deep": [7]}]],
    }
    for msg in decode_all_ways(enc):
        assert_same_tensors(msg.tensors, tensors)
        assert msg.meta == want_meta
        assert type(msg.meta["round"]) is int and type(msg.meta["ok"]) is bool
        assert set(msg.tensors["weights"]) == {"conv1", "fc"}
        assert msg.tensors["weights"]["conv1"]["weight"].shape == (4, 3, 3, 3)


def test_meta_only_message() -> None:
    enc = encode_message(None, {"hello": "world"}, kind="control")
    assert enc.buffers == []
    for msg in decode_all_ways(enc):
        assert msg.tensors == {} and msg.meta == {"hello": "world"} and msg.kind == "control"


def test_empty_sub_mapping_is_no_tensor() -> None:
    msg = decode_message(encode_message({"a": {}, "b": {"c": np.zeros(1)}}).to_bytes())
    assert leaves(msg.tensors).keys() == {("b", "c")}


def test_fixed_t0_is_carried() -> None:
    enc = encode_message({"x": np.zeros(2)}, t0=1234.5)
    assert enc.t0 == 1234.5
    assert decode_message(enc.to_bytes()).t0 == 1234.5


@pytest.mark.parametrize("bad", [{"": np.zeros(1)}, {"a": {"": np.zeros(1)}}, {1: np.zeros(1)}])
def test_names_the_decoder_would_reject_are_refused_when_encoding(bad: dict) -> None:
    with pytest.raises(TypeError, match="non-empty str"):
        encode_message(bad)


@pytest.mark.parametrize("bad", [[1, 2], "text", 3.0, np.array(["a"]), np.zeros(2, object)])
def test_unsendable_tensors_raise_type_error(bad: Any) -> None:
    with pytest.raises(TypeError):
        encode_message({"x": bad})


def test_unsendable_meta_raises_type_error() -> None:
    with pytest.raises(TypeError, match="meta"):
        encode_message({}, {"x": object()})


# --- checksums --------------------------------------------------------------------------


def test_checksum_flag_and_digest_placement() -> None:
    a = np.arange(5, dtype=np.uint8)
    b = np.arange(3, dtype=np.int16)
    on = encode_message({"a": a, "b": b}, checksum=True).to_bytes()
    off = encode_message({"a": a, "b": b}, checksum=False).to_bytes()
    assert on[5] & FLAG_DIGESTS and not off[5] & FLAG_DIGESTS
    assert len(on) == len(off) + 16
    digest = xxhash.xxh3_64_intdigest(a.tobytes()).to_bytes(8, "little")
    assert on[-(16 + b.nbytes) : -(8 + b.nbytes)] == digest  # right after a's bytes
    assert on[-8:] == xxhash.xxh3_64_intdigest(b.tobytes()).to_bytes(8, "little")


def test_corruption_is_caught_only_with_checksums() -> None:
    a = np.arange(100, dtype=np.uint8)
    for checksum in (True, False):
        data = bytearray(encode_message({"a": a}, checksum=checksum).to_bytes())
        data[-9 if checksum else -1] ^= 0x01  # last data byte
        if checksum:
            with pytest.raises(ChecksumMismatch):
                decode_message(data)
        else:
            assert decode_message(data)["a"][-1] == 98


# --- codec chains (test codecs; the real ones are tested in tests/codecs) ----------------


@pytest.mark.parametrize("selector", [zlib_chain, xor_zlib_chain])
@pytest.mark.parametrize("checksum", [True, False])
def test_codec_chains_roundtrip(selector: Any, checksum: bool) -> None:
    tensors = {
        "zeros": np.zeros((64, 64), np.float32),
        "f": np.asfortranarray(np.tile(np.arange(50, dtype=np.int64), (8, 1))),
        "noise": np.random.default_rng(0).integers(0, 256, 2400, np.uint8),  # goes raw
        "empty": np.zeros(0, np.float32),
        "scalar": np.float32(1.5),
    }
    enc = encode_message(tensors, codecs=selector, checksum=checksum)
    assert len(enc.buffers[0]) < tensors["zeros"].nbytes
    assert bytes(enc.buffers[2]) == tensors["noise"].tobytes()
    for msg in decode_all_ways(enc):
        assert_same_tensors(msg.tensors, tensors)
        assert msg["f"].flags.f_contiguous
    assert enc.codec_label == "raw+" + selector("", tensors["zeros"])[0].codec_id


# --- several messages, out= arrays ------------------------------------------------------


def test_back_to_back_messages_in_one_stream() -> None:
    rng = random.Random(5)
    msgs = [
        encode_message({"i": np.full(i, i, np.int32)}, {"n": i}, checksum=i % 2 == 0)
        for i in range(12)
    ]
    msgs.append(encode_message({"z": np.zeros((32, 32))}, {"n": 12}, codecs=zlib_chain))
    data = b"".join(m.to_bytes() for m in msgs)
    for feeder in (feed_pieces, feed_via_buffers):
        s = MessageStream(codec_lookup=lookup)
        feeder(s, data, rng, 40)
        got = drain(s)
        assert [m.meta["n"] for m in got] == list(range(13))
        assert all(m["i"].tolist() == [i] * i for i, m in enumerate(got[:12]))
        assert not s.in_message


def test_stream_reports_need_data_until_the_last_byte() -> None:
    data = encode_message({"x": np.arange(10)}).to_bytes()
    s = MessageStream()
    for i in range(len(data) - 1):
        s.receive_data(data[i : i + 1])
        assert drain(s) == []
        assert s.in_message
    s.receive_data(data[-1:])
    (msg,) = drain(s)
    assert msg["x"].tolist() == list(range(10))
    assert msg.recv_s >= msg.decode_s > 0


def test_stream_accepts_non_byte_memoryviews() -> None:
    data = encode_message({"x": np.arange(6, dtype=np.int32)}).to_bytes()
    pad = (-len(data)) % 4
    as_words = np.frombuffer(data + b"\0" * pad, np.uint32)
    s = MessageStream()
    s.receive_data(memoryview(as_words)[: len(data) // 4])
    s.receive_data(data[len(data) // 4 * 4 :])
    assert drain(s)[0]["x"].tolist() == list(range(6))


@pytest.mark.parametrize("codecs", [None, zlib_chain])
def test_decode_message_fills_matching_out_arrays(codecs: Any) -> None:
    a = np.arange(256, dtype=np.float32).reshape(16, 16) % 4
    f = np.asfortranarray(a.astype(np.int16))
    data = encode_message({"w": {"a": a, "f": f}}, codecs=codecs).to_bytes()
    out_a = np.empty((16, 16), np.float32)
    out_f = np.empty((16, 16), np.int16, order="F")
    msg = decode_message(data, out={("w", "a"): out_a, ("w", "f"): out_f}, codec_lookup=lookup)
    assert msg["w"]["a"] is out_a and msg["w"]["f"] is out_f
    np.testing.assert_array_equal(out_a, a)
    np.testing.assert_array_equal(out_f, f)


@pytest.mark.parametrize("codecs", [None, zlib_chain])
def test_mismatching_out_arrays_are_left_alone(codecs: Any) -> None:
    a = np.zeros((16, 16), np.float32)
    data = encode_message({"a": a}, codecs=codecs).to_bytes()
    readonly = np.full((16, 16), 9, np.float32)
    readonly.flags.writeable = False
    candidates = [
        np.full((16, 15), 9, np.float32),  # shape
        np.full((16, 16), 9, np.float64),  # dtype
        np.full((16, 16), 9, np.float32, order="F"),  # order
        readonly,
        np.full((16, 32), 9, np.float32)[:, ::2],  # not contiguous
        [[9.0] * 16] * 16,  # not an array
    ]
    for bad in candidates:
        msg = decode_message(data, out={("a",): bad}, codec_lookup=lookup)
        assert msg["a"] is not bad
        np.testing.assert_array_equal(msg["a"], a)
        assert np.all(np.asarray(bad) == 9)


def test_stream_out_arrays_apply_to_the_next_message_only() -> None:
    a = np.arange(12, dtype=np.float64).reshape(3, 4)
    data = encode_message({"a": a}).to_bytes()
    target = np.empty((3, 4))
    s = MessageStream()
    s.set_out({("a",): target})
    s.receive_data(data + data)
    first, second = drain(s)
    assert first["a"] is target
    assert second["a"] is not target
    np.testing.assert_array_equal(second["a"], a)
    s.set_out({("a",): np.empty((4, 3))})  # mismatch: falls back
    s.receive_data(data)
    np.testing.assert_array_equal(drain(s)[0]["a"], a)


def test_reused_out_arrays_across_rounds() -> None:
    target = np.empty((8, 8), np.float32)
    s = MessageStream(codec_lookup=lookup)
    for r in range(4):
        a = np.full((8, 8), r, np.float32)
        s.set_out({("w",): target})
        s.receive_data(encode_message({"w": a}, {"round": r}, codecs=zlib_chain).to_bytes())
        (msg,) = drain(s)
        assert msg["w"] is target and np.all(target == r)


def test_raw_tensors_are_views_of_the_input_unless_copied() -> None:
    data = bytearray(encode_message({"a": np.arange(4, dtype=np.uint8)}, checksum=False).to_bytes())
    view = decode_message(data)["a"]
    copied = decode_message(data, copy=True)["a"]
    data[-1] = 99
    assert view[-1] == 99 and copied[-1] == 3
    assert not decode_message(bytes(data))["a"].flags.writeable


def test_message_sizes_and_timing_fields() -> None:
    a = np.zeros((10, 10), np.float32)
    enc = encode_message({"a": a}, checksum=True)
    assert enc.raw_nbytes == 400
    assert enc.nbytes == len(enc.head) + 400 + 8
    assert len(enc.head) > PREFIX_SIZE
    msg = decode_message(enc.to_bytes())
    assert msg.nbytes == 400 and msg.wire_nbytes == enc.nbytes
    assert msg.decode_s >= 0 and enc.encode_s >= 0


# --- hypothesis: random messages --------------------------------------------------------

names = st.text(st.characters(codec="utf-8"), min_size=1, max_size=6)
shapes = st.lists(st.integers(0, 5), min_size=0, max_size=4).map(tuple)
scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=8)
    | st.binary(max_size=8)
)
metas = st.dictionaries(
    st.text(max_size=6),
    st.recursive(
        scalars,
        lambda inner: (
            st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
        ),
        max_leaves=8,
    ),
    max_size=4,
)


@st.composite
def tensor_trees(draw: st.DrawFn) -> dict[str, Any]:
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)

    def leaf() -> np.ndarray:
        dtype = WIRE_DTYPES[draw(st.sampled_from(sorted(WIRE_DTYPES)))]
        arr = sample(dtype, draw(shapes), rng)
        layout = draw(st.sampled_from(["C", "F", "strided", "big"]))
        if layout == "F":
            arr = np.asfortranarray(arr)
        elif layout == "strided" and arr.ndim:
            arr = np.repeat(arr, 2, axis=0)[::2]
        elif layout == "big" and arr.dtype.itemsize > 1 and arr.dtype.kind != "V":
            arr = arr.astype(arr.dtype.newbyteorder(">"))
        return arr

    def tree(depth: int) -> dict[str, Any]:
        keys = draw(st.lists(names, min_size=1, max_size=4, unique=True))
        return {k: tree(depth + 1) if depth < 2 and draw(st.booleans()) else leaf() for k in keys}

    return tree(0)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tensors=tensor_trees(), meta=metas, checksum=st.booleans(), seed=st.integers(0, 1000))
def test_random_messages_roundtrip(
    tensors: dict[str, Any], meta: dict[str, Any], checksum: bool, seed: int
) -> None:
    enc = encode_message(tensors, meta, checksum=checksum, codecs=zlib_chain if seed % 3 else None)
    for msg in decode_all_ways(enc, seed):
        assert_same_tensors(msg.tensors, tensors)
        assert msg.meta == meta
        for path, arr in leaves(msg.tensors).items():
            src = np.asarray(leaves(tensors)[path])
            if src.flags.f_contiguous and not src.flags.c_contiguous:
                assert arr.flags.f_contiguous


def test_stream_takes_pieces_bigger_than_its_read_size():
    from tensorwire.wire import MessageStream, encode_message

    arr = np.arange(1 << 20, dtype=np.float64)  # 8 MiB, bigger than max_read
    data = encode_message({"x": arr}).to_bytes()
    stream = MessageStream(max_read=1 << 16)
    stream.receive_data(data[:12345])
    stream.receive_data(data[12345:])
    np.testing.assert_array_equal(stream.next_event()["x"], arr)
