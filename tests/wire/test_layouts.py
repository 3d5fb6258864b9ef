"""Header layouts: a header that comes again (its ``tensors`` table known, ``t0`` and
``meta`` free to change) is read from a cached layout instead of being unpacked; these
tests hold what the layouts return against a plain unpack, check a layout's message as any
other (digests, limits, ``out`` arrays) and keep the layout caches bounded whatever a peer
sends.
"""

from __future__ import annotations

import ml_dtypes
import msgpack
import numpy as np
import pytest
from plan_helpers import header_of, streamed
from wire_helpers import build_prefix

from tensorwire.errors import HeaderCheckMismatch, MalformedHeader, MessageTooLarge
from tensorwire.wire import Limits, MessageStream, decode_message, encode_message, plans
from tensorwire.wire.format import PREFIX_SIZE, parse_prefix


@pytest.fixture(autouse=True)
def fresh_caches() -> None:
    """Each test starts from empty header caches: a table or header another test in this
    process streamed (an empty ``tensors`` table, say) must not count as seen here."""
    for cache in (plans.TENSOR_TABLES, plans.KNOWN_LAYOUTS, plans.META_LAYOUTS, plans.SEEN_ONCE):
        cache.clear()


def _layout_of(data: bytes):
    from tensorwire.wire.plans import KNOWN_LAYOUTS

    prefix = parse_prefix(data, Limits())
    return KNOWN_LAYOUTS.get(data[PREFIX_SIZE : PREFIX_SIZE + prefix.header_length - 8])


def test_a_header_repeated_but_for_t0_is_read_from_its_layout() -> None:
    tensors = {"a": np.arange(6, dtype=np.int16).reshape(2, 3), "b": np.ones(5, np.float32)}
    first = encode_message(tensors, t0=1.0).to_bytes()
    assert streamed(first)["a"].shape == (2, 3)  # validated: the table is kept
    assert _layout_of(first) is None
    assert streamed(first)["a"].shape == (2, 3)  # a known table: its layout is kept
    assert _layout_of(first) is not None
    for t0 in (2.0, 1e9 + 0.25, -3.5):
        data = encode_message({k: v + 1 for k, v in tensors.items()}, t0=t0).to_bytes()
        assert _layout_of(data) is _layout_of(first)  # only t0 differs: the same layout
        got = streamed(data)
        assert got.t0 == t0 and got.kind == "data" and got.meta == {} and got.n_tensors == 2
        assert (got.nbytes, got.wire_nbytes) == (12 + 20, len(data))
        for name in tensors:
            np.testing.assert_array_equal(got[name], tensors[name] + 1)
            assert got[name].dtype == tensors[name].dtype and got[name].flags.writeable


@pytest.mark.parametrize("where", ["digest", "body", "header", "t0"])
def test_a_layouts_message_is_checked_as_any_other(where: str) -> None:
    from tensorwire.errors import ChecksumMismatch

    x = np.arange(64, dtype=np.uint8)
    for _ in range(2):  # the table, then the layout
        streamed(encode_message({"x": x}).to_bytes())
    good = encode_message({"x": x}).to_bytes()
    assert _layout_of(good) is not None
    bad = bytearray(good)
    prefix = parse_prefix(good, Limits())
    at = {"digest": len(bad) - 1, "body": len(bad) - 20, "header": PREFIX_SIZE + 3}
    at["t0"] = PREFIX_SIZE + prefix.header_length - 2  # inside the value t0's layout leaves out
    bad[at[where]] ^= 1
    stream = MessageStream()
    if where in ("header", "t0"):  # covered by the header check, as before
        with pytest.raises(HeaderCheckMismatch):
            stream.receive_data(bytes(bad) + good)
        return
    stream.receive_data(bytes(bad) + good)
    with pytest.raises(ChecksumMismatch):
        stream.next_event()
    np.testing.assert_array_equal(stream.next_event()["x"], x)


def test_a_layout_is_checked_against_each_streams_limits() -> None:
    data = encode_message({"a": np.zeros((2, 2, 2)), "b": np.zeros(100)}).to_bytes()
    for _ in range(2):
        streamed(data)
    assert _layout_of(data) is not None
    for limits, error in (
        (Limits(max_tensors=1), MessageTooLarge),
        (Limits(max_ndim=2), MalformedHeader),
        (Limits(max_message_bytes=800), MessageTooLarge),
    ):
        stream = MessageStream(limits=limits)
        with pytest.raises(error):
            stream.receive_data(data)
            stream.next_event()
    assert streamed(data).n_tensors == 2  # and the default limits still take it


def test_a_layouts_message_fills_only_the_out_arrays_that_fit() -> None:
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    data = encode_message({"x": x}).to_bytes()
    for _ in range(2):
        streamed(data)
    assert _layout_of(data) is not None
    read_only = np.zeros((3, 4), np.float32)
    read_only.flags.writeable = False
    fits = np.zeros((3, 4), np.float32)
    for out, taken in (
        (fits, True),
        (np.zeros((3, 4), np.float64), False),
        (np.zeros((4, 3), np.float32), False),
        (np.asfortranarray(np.zeros((3, 4), np.float32)), False),
        (read_only, False),
        ([[0.0] * 4] * 3, False),
    ):
        stream = MessageStream()
        stream.set_out({("x",): out})
        got = _streamed_into(stream, data)
        np.testing.assert_array_equal(got["x"], x)
        assert (got["x"] is out) == taken and got["x"].flags.c_contiguous
    assert not read_only.any()


def _streamed_into(stream: MessageStream, data: bytes):
    got = stream.receive_one(memoryview(data))
    return got if got is not None else stream.next_event()


def test_no_layout_for_codecs_nesting_or_other_dtypes() -> None:
    z = np.zeros(4096, np.float32)
    for tensors, codecs in (
        ({"x": {"y": np.arange(4, dtype=np.int8)}}, None),
        ({"x": np.zeros(4, ml_dtypes.bfloat16)}, None),
        ({"x": z}, "zlib"),
    ):
        selector = None if codecs is None else _fixed(codecs)
        data = encode_message(tensors, codecs=selector).to_bytes()
        for _ in range(3):
            got = streamed(data)
            assert got.keys() == tensors.keys()
        assert _layout_of(data) is None


def test_a_header_of_meta_alone_gets_a_layout_when_it_comes_again() -> None:
    tensors: dict = {}
    meta = {"ack": True, "round": 3, "who": ["a", 1.5]}
    datas = [encode_message(tensors, meta, t0=float(t0)).to_bytes() for t0 in range(5)]
    streamed(datas[0])  # validates the table
    streamed(datas[1])  # seen once
    assert _layout_of(datas[1]) is None
    got = streamed(datas[2])
    assert _layout_of(datas[2]) is not None and _layout_of(datas[2]).meta is not None
    got.meta["round"] = 99  # a message's meta is its own: the next one is unpacked anew
    for t0, data in enumerate(datas[3:], start=3):
        again = streamed(data)
        assert again.meta == meta and again.t0 == t0 and again.keys() == tensors.keys()
        assert again.meta is not got.meta


def test_a_meta_that_changes_every_time_churns_only_the_small_cache() -> None:
    from tensorwire.wire.plans import KNOWN_LAYOUTS, SEEN_ONCE

    x = np.arange(4, dtype=np.int8)
    for _ in range(3):
        streamed(encode_message({"x": x}).to_bytes())
    kept = _layout_of(encode_message({"x": x}).to_bytes())
    assert kept is not None
    for seq in range(1000):
        data = encode_message(None, {"seq": seq}).to_bytes()
        assert streamed(data).meta == {"seq": seq}
        assert _layout_of(data) is None
    with_tensors = encode_message({"x": x}, {"round": 1}).to_bytes()
    for _ in range(3):  # meta with tensors: not kept, however often it repeats
        assert streamed(with_tensors).meta == {"round": 1}
    assert _layout_of(with_tensors) is None
    assert len(SEEN_ONCE) <= SEEN_ONCE.max_entries
    assert _layout_of(encode_message({"x": x}).to_bytes()) is kept  # not evicted by them
    assert len(KNOWN_LAYOUTS) <= KNOWN_LAYOUTS.max_entries


def _fixed(name: str):
    from tensorwire.codecs import resolve_codecs

    return resolve_codecs(name)


def _meta_layout_of(data: bytes):
    from tensorwire.wire.format import meta_cut
    from tensorwire.wire.plans import META_LAYOUTS

    prefix = parse_prefix(data, Limits())
    key = data[PREFIX_SIZE : PREFIX_SIZE + prefix.header_length - 8]
    cut = meta_cut(key)
    return None if cut is None else META_LAYOUTS.get(key[: cut[0]] + key[cut[1] :])


def _batch(seq: int, tensors: dict) -> bytes:
    """A stream batch's message: the same tensors' table, a meta that changes every time."""
    meta = {"tw.stream": ["5f3a", seq, 16, 100.0 + seq], "note": "x" * (seq % 3)}
    return encode_message(tensors, meta, t0=float(seq)).to_bytes()


def test_a_meta_beside_tensors_is_read_with_a_layout_of_the_rest() -> None:
    tensors = {"c0": np.arange(8, dtype=np.int64), "c1": np.ones((2, 3), np.float32)}
    streamed(_batch(0, tensors))  # validates the table
    assert _meta_layout_of(_batch(1, tensors)) is None
    streamed(_batch(1, tensors))  # a known table: the layout of the rest is kept
    kept = _meta_layout_of(_batch(2, tensors))
    assert kept is not None and _layout_of(_batch(2, tensors)) is None
    seen = []
    for seq in range(2, 12):
        data = _batch(seq, {k: v + seq for k, v in tensors.items()})
        assert _meta_layout_of(data) is kept  # whatever the meta, the same layout
        got = streamed(data)
        assert got.meta == msgpack.unpackb(header_of(data))["meta"] and got.t0 == seq
        assert got.kind == "data" and got.keys() == tensors.keys()
        for name in tensors:
            np.testing.assert_array_equal(got[name], tensors[name] + seq)
            assert got[name].flags.writeable
        seen.append(got.meta)
    assert len({id(m) for m in seen}) == len(seen)  # each message's meta is its own


@pytest.mark.parametrize("meta_bytes", ["a list", "two values", "a map cut short"])
def test_a_meta_layout_reads_only_a_meta_that_is_exactly_one_map(meta_bytes: str) -> None:
    """A forged meta around a known layout: the header check passes (it is recomputed), so
    the layout path itself must refuse what the full parse refuses."""
    from tensorwire.wire.decoder import decode_known
    from tensorwire.wire.format import FLAG_DIGESTS, meta_cut

    tensors = {"x": np.arange(16, dtype=np.uint8)}
    for seq in range(3):
        streamed(_batch(seq, tensors))
    good = _batch(3, tensors)
    assert _meta_layout_of(good) is not None
    prefix = parse_prefix(good, Limits())
    header = header_of(good)
    start, end = meta_cut(header[:-8])
    forged_meta = {
        "a list": msgpack.packb([1, 2]),
        "two values": msgpack.packb({"a": 1}) + msgpack.packb(1),
        "a map cut short": msgpack.packb({"k": "v"})[:-1],
    }[meta_bytes]
    forged = header[:start] + forged_meta + header[end:]
    body = good[PREFIX_SIZE + prefix.header_length :]
    data = build_prefix(forged, len(body), flags=FLAG_DIGESTS) + forged + body
    assert _meta_layout_of(data) is _meta_layout_of(good)  # the rest matches the layout
    assert decode_known(memoryview(data), Limits(), None) is None  # left to the full checks
    with pytest.raises(MalformedHeader):
        decode_message(data)
    stream = MessageStream()
    with pytest.raises(MalformedHeader):
        stream.receive_data(data + good)
        stream.next_event()
    assert stream.next_event().meta == msgpack.unpackb(header)["meta"]  # the next one is read


def test_layouts_of_ever_new_tables_beside_a_meta_stay_bounded() -> None:
    from tensorwire.wire.plans import META_LAYOUTS

    for n in range(1, 400):  # a sender of ever new shapes, each with a meta
        for seq in range(2):
            streamed(_batch(seq, {"x": np.zeros(n, np.uint8)}))
    assert _meta_layout_of(_batch(2, {"x": np.zeros(399, np.uint8)})) is not None
    assert len(META_LAYOUTS) <= META_LAYOUTS.max_entries
    assert META_LAYOUTS.max_entries < 400
