"""Chunking for size-capped transports: split, reorder, duplicate, lose, expire, evict."""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tensorwire.errors import ChunkError, MessageTooLarge
from tensorwire.wire import (
    CHUNK_HEADER_SIZE,
    ChunkReassembler,
    decode_message,
    encode_message,
    iter_chunks,
    new_message_id,
    parse_chunk,
)
from tensorwire.wire.chunks import CHUNK_HEADER, CHUNK_MAGIC, CHUNK_VERSION


def chunks_of(data: bytes, payload: int, message_id: int = 42) -> list[bytes]:
    return [b"".join(bytes(p) for p in parts) for parts in iter_chunks([data], message_id, payload)]


def raw_chunk(
    index: int, count: int, offset: int, total: int, payload: bytes, message_id: int = 42, **kw: int
) -> bytes:
    head = CHUNK_HEADER.pack(
        kw.get("magic", CHUNK_MAGIC),
        kw.get("version", CHUNK_VERSION),
        kw.get("flags", 0),
        kw.get("reserved", 0),
        message_id,
        index,
        count,
        offset,
        total,
    )
    return head + payload


MESSAGE = encode_message(
    {"w": np.arange(1000, dtype=np.float32), "b": np.ones((3, 3), np.int8)}, {"round": 2}
)
DATA = MESSAGE.to_bytes()


def test_chunk_header_layout() -> None:
    assert CHUNK_HEADER_SIZE == 40
    head = bytes(next(iter_chunks([DATA], 0x0102030405060708, 1000))[0])
    assert head[:4] == b"TWCK" and head[4] == 1 and head[5:8] == b"\0\0\0"
    assert head[8:16] == (0x0102030405060708).to_bytes(8, "little")
    assert int.from_bytes(head[16:20], "little") == 0  # index
    assert int.from_bytes(head[20:24], "little") == -(-len(DATA) // 1000)  # count
    assert int.from_bytes(head[24:32], "little") == 0  # offset
    assert int.from_bytes(head[32:40], "little") == len(DATA)  # total


def test_iter_chunks_views_the_frames_without_copies() -> None:
    frames = MESSAGE.frames()
    chunks = list(iter_chunks(frames, 1, 700))
    for parts in chunks:
        assert sum(len(p) for p in parts[1:]) <= 700
        assert all(isinstance(p, memoryview) for p in parts[1:] if len(p) > 100)
    assert b"".join(bytes(p) for parts in chunks for p in parts[1:]) == DATA
    sizes = [sum(len(p) for p in parts[1:]) for parts in chunks]
    assert sizes[:-1] == [700] * (len(chunks) - 1) and 0 < sizes[-1] <= 700


def test_iter_chunks_counts_bytes_of_non_byte_memoryviews() -> None:
    words = np.arange(10, dtype=np.uint32)
    (parts,) = list(iter_chunks([memoryview(words)], 1, 100))
    header, payload = parse_chunk(b"".join(bytes(p) for p in parts))
    assert header.total_length == 40 and bytes(payload) == words.tobytes()


def test_iter_chunks_of_nothing_is_one_empty_chunk() -> None:
    (only,) = list(iter_chunks([b""], 9, 10))
    head, payload = parse_chunk(b"".join(bytes(p) for p in only))
    assert (head.index, head.count, head.total_length, len(payload)) == (0, 1, 0, 0)
    assert ChunkReassembler().feed(b"".join(bytes(p) for p in only), 0.0).tobytes() == b""


def test_iter_chunks_rejects_a_non_positive_payload() -> None:
    with pytest.raises(ValueError):
        list(iter_chunks([DATA], 1, 0))


def test_reassembly_in_shuffled_order_with_duplicates() -> None:
    rng = random.Random(3)
    chunks = chunks_of(DATA, 333)
    feed = chunks + rng.sample(chunks, 5)
    rng.shuffle(feed)
    r = ChunkReassembler()
    results = [r.feed(c, now=1.0) for c in feed]
    done = [x for x in results if x is not None]
    assert len(done) == 1
    assert done[0].tobytes() == DATA
    assert len(r) == 0
    assert decode_message(done[0]).meta == {"round": 2}
    assert all(r.feed(c, now=2.0) is None for c in chunks)  # late duplicates are dropped
    assert len(r) == 0 and r.expire(now=100.0) == []
    assert r.feed(chunks[0], now=101.0) is None  # after the timeout the id may be reused
    assert len(r) == 1


def test_last_chunk_first() -> None:
    chunks = chunks_of(DATA, 256)
    r = ChunkReassembler()
    for c in [chunks[-1], *chunks[:-1][::-1]]:
        out = r.feed(c, 0.0)
    assert out is not None and out.tobytes() == DATA


def test_lost_chunk_expires_with_exactly_the_missing_ranges() -> None:
    payload = 300
    chunks = chunks_of(DATA, payload)
    lost = {1, 4, len(chunks) - 1}
    r = ChunkReassembler(timeout=5.0)
    for i, c in enumerate(chunks):
        if i not in lost:
            assert r.feed(c, now=10.0) is None
    assert r.missing(42) == sorted(lost)
    assert r.missing(43) == []
    assert r.expire(now=14.9) == []
    (partial,) = r.expire(now=15.0)
    last_len = len(DATA) - (len(chunks) - 1) * payload
    assert partial.message_id == 42 and partial.source is None
    assert partial.missing == [
        (1 * payload, payload),
        (4 * payload, payload),
        ((len(chunks) - 1) * payload, last_len),
    ]
    kept = np.ones(len(DATA), bool)
    for start, n in partial.missing:
        kept[start : start + n] = False
    assert partial.data[kept].tobytes() == np.frombuffer(DATA, np.uint8)[kept].tobytes()
    assert len(r) == 0 and r.expire(now=100.0) == []


def test_any_chunk_refreshes_the_timeout() -> None:
    chunks = chunks_of(DATA, 500)
    r = ChunkReassembler(timeout=5.0)
    r.feed(chunks[0], now=0.0)
    r.feed(chunks[0], now=4.0)  # a duplicate still shows the sender is alive
    assert r.expire(now=8.0) == []
    assert len(r.expire(now=9.0)) == 1


def test_sources_are_kept_apart() -> None:
    a = chunks_of(DATA, 400, message_id=7)
    other = encode_message({"x": np.zeros(300)}).to_bytes()
    b = chunks_of(other, 400, message_id=7)
    r = ChunkReassembler()
    out = {}
    for ca, cb in zip(a, b, strict=False):
        out["a"] = r.feed(ca, 0.0, source="a") if out.get("a") is None else out["a"]
        out["b"] = r.feed(cb, 0.0, source="b") if out.get("b") is None else out["b"]
    for c in a[len(b) :]:
        out["a"] = r.feed(c, 0.0, source="a")
    for c in b[len(a) :]:
        out["b"] = r.feed(c, 0.0, source="b")
    assert out["a"].tobytes() == DATA and out["b"].tobytes() == other
    assert r.missing(7, source="a") == []


def test_max_pending_evicts_the_oldest() -> None:
    r = ChunkReassembler(max_pending=2)
    first = [chunks_of(DATA, 500, message_id=m)[0] for m in (1, 2, 3)]
    r.feed(first[0], now=1.0)
    r.feed(first[1], now=2.0)
    r.feed(first[0], now=3.0)  # message 1 is now the most recent
    r.feed(first[2], now=4.0)  # evicts message 2
    assert len(r) == 2
    assert r.missing(2) == [] and r.missing(1) != [] and r.missing(3) != []
    (evicted,) = r.expire(now=4.0)
    assert evicted.message_id == 2
    assert evicted.missing == [(500, len(DATA) - 500)]  # one range per gap, not per chunk


def test_a_bad_first_chunk_neither_registers_nor_evicts() -> None:
    r = ChunkReassembler(max_pending=1)
    good = chunks_of(DATA, 500, message_id=1)
    r.feed(good[0], now=0.0)
    with pytest.raises(ChunkError):
        r.feed(raw_chunk(0, 3, 0, 25, bytes(5), message_id=2), now=1.0)
    assert len(r) == 1 and r.expire(now=1.0) == []
    for c in good[1:]:
        out = r.feed(c, now=2.0)
    assert out.tobytes() == DATA


def test_total_over_the_limit_is_refused() -> None:
    r = ChunkReassembler(max_message_bytes=1000)
    with pytest.raises(MessageTooLarge):
        r.feed(raw_chunk(0, 3, 0, 1001, bytes(400)), 0.0)
    assert len(r) == 0
    assert r.feed(raw_chunk(0, 1, 0, 1000, bytes(1000)), 0.0) is not None


@pytest.mark.parametrize(
    ("chunk", "match"),
    [
        (b"TWCK" + bytes(10), "shorter"),
        (raw_chunk(0, 1, 0, 4, b"abcd", magic=b"TWIR"), "magic"),
        (raw_chunk(0, 1, 0, 4, b"abcd", version=2), "version"),
        (raw_chunk(0, 1, 0, 4, b"abcd", flags=1), "version"),
        (raw_chunk(0, 1, 0, 4, b"abcd", reserved=1), "version"),
        (raw_chunk(0, 0, 0, 4, b"abcd"), "out of range"),
        (raw_chunk(2, 2, 0, 4, b"abcd"), "out of range"),
        (raw_chunk(0, 1, 2, 4, b"abcd"), "past the message end"),
        (raw_chunk(0, 5, 0, 4, b"a"), "cannot carry"),
        (raw_chunk(0, 2**32 - 1, 0, 100, b""), "cannot carry"),
    ],
)
def test_malformed_chunks(chunk: bytes, match: str) -> None:
    with pytest.raises(ChunkError, match=match):
        parse_chunk(chunk)
    with pytest.raises(ChunkError):
        ChunkReassembler().feed(chunk, 0.0)


@pytest.mark.parametrize(
    "siblings",
    [
        [raw_chunk(0, 3, 0, 25, bytes(10)), raw_chunk(1, 4, 10, 25, bytes(10))],  # count
        [raw_chunk(0, 3, 0, 25, bytes(10)), raw_chunk(1, 3, 10, 26, bytes(10))],  # total
        [raw_chunk(0, 3, 0, 25, bytes(10)), raw_chunk(1, 3, 10, 25, bytes(9))],  # size
        [raw_chunk(0, 3, 0, 25, bytes(10)), raw_chunk(1, 3, 11, 25, bytes(10))],  # offset
        [raw_chunk(0, 3, 0, 25, bytes(10)), raw_chunk(2, 3, 20, 25, bytes(4))],  # last end
        [raw_chunk(2, 3, 20, 25, bytes(5)), raw_chunk(0, 3, 0, 25, bytes(9))],  # vs last
        [raw_chunk(2, 3, 21, 25, bytes(4))],  # last offset not index x size
        [raw_chunk(0, 3, 0, 25, bytes(0))],  # non-last chunk without payload
        [raw_chunk(0, 3, 0, 25, bytes(5))],  # 3 chunks of 5 cannot make 25 bytes
        [raw_chunk(0, 2, 0, 25, bytes(10))],  # 2 chunks of 10 cannot make 25 bytes
        [raw_chunk(1, 2, 0, 25, bytes(25))],  # last chunk at offset 0
    ],
)
def test_inconsistent_chunks_raise_chunk_error(siblings: list[bytes]) -> None:
    r = ChunkReassembler()
    *ok, bad = siblings
    for c in ok:
        assert r.feed(c, 0.0) is None
    with pytest.raises(ChunkError):
        r.feed(bad, 0.0)


def test_new_message_ids_are_64_bit_and_distinct() -> None:
    ids = {new_message_id() for _ in range(1000)}
    assert len(ids) == 1000 and all(0 <= i < 2**64 for i in ids)


@settings(max_examples=100, deadline=None)
@given(
    size=st.integers(0, 3000),
    payload=st.integers(1, 700),
    seed=st.integers(0, 2**32 - 1),
    dup=st.integers(0, 5),
    drop=st.booleans(),
)
def test_any_chunk_size_and_order(size: int, payload: int, seed: int, dup: int, drop: bool) -> None:
    rng = random.Random(seed)
    data = rng.randbytes(size)
    chunks = chunks_of(data, payload, message_id=seed)
    assert len(chunks) == max(-(-size // payload), 1)
    for c in chunks:
        assert len(c) - CHUNK_HEADER_SIZE <= payload
    order = chunks + [rng.choice(chunks) for _ in range(dup)]
    rng.shuffle(order)
    lost = rng.randrange(len(chunks)) if drop else None
    r = ChunkReassembler(timeout=1.0)
    done = []
    for c in order:
        if lost is not None and c == chunks[lost]:
            continue
        out = r.feed(c, 0.0)
        if out is not None:
            done.append(out.tobytes())
    if lost is None:
        assert done == [data]
        assert r.expire(10.0) == []  # late duplicates may reopen, but nothing is lost
    elif len(chunks) == 1:
        assert done == [] and len(r) == 0
    else:
        assert done == [] and r.missing(seed) == [lost]
        (partial,) = r.expire(1.0)
        start = lost * payload
        assert partial.missing == [(start, min(payload, size - start))]
