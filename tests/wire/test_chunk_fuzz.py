"""Fuzzing the chunk path: whatever chunks declare, a reassembler costs what arrived.

Forged counts, sizes, offsets, totals (up to the 16 GiB limit and beyond), indices and
message ids, truncated headers, flipped header bytes, duplicates and reordering from
several sources, with ``expire()`` at random times; legitimate messages interleaved with
that junk must still come out bit-exact. Every loop is bounded and every run seeded.
"""

from __future__ import annotations

import os
import random
import time
import tracemalloc
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest

from tensorwire.errors import ChunkError, MessageTooLarge, WireError
from tensorwire.wire import ChunkReassembler, PartialMessage, iter_chunks
from tensorwire.wire.chunks import CHUNK_HEADER, CHUNK_MAGIC, CHUNK_VERSION
from tensorwire.wire.chunks import pending as chunks_pending

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
LIMIT = 16 * GiB  # the default max_message_bytes
U32 = (1 << 32) - 1
FRAMES = 10_000
TIMEOUT = 5.0  # seconds of the fuzz clock
TICK = 0.002  # fuzz-clock seconds per frame: junk expires after 2500 frames
LEGIT_SOURCES = ("a", "b")
JUNK_SOURCES = ("x", "y", "z", 7, None)
PER_INPUT_SECONDS = 2.0
PER_INPUT_BYTES = 64 * MiB
# What the reassembler may charge per chunk fed beyond 9x its payload: a held copy's
# bookkeeping (256 B) and, for a chunk that opens a message, that message's (2 KiB).
PER_CHUNK_SLACK = 256 + 2 * KiB


def status_bytes(field: str) -> int:
    """A ``kB`` field of /proc/self/status (VmRSS, VmHWM), in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * KiB
    raise AssertionError(f"no {field} in /proc/self/status")


class Meter:
    """Measures one input: tracemalloc is on while it is open, RSS comes from
    /proc/self/statm (read with pread: /proc/self/status costs more than a chunk)."""

    def __init__(self) -> None:
        self._statm = os.open("/proc/self/statm", os.O_RDONLY)
        self._page = os.sysconf("SC_PAGE_SIZE")

    def close(self) -> None:
        os.close(self._statm)

    def rss(self) -> int:
        """Resident bytes (the VmRSS of /proc/self/status)."""
        return int(os.pread(self._statm, 256, 0).split()[1]) * self._page

    def measure(self, fn: Callable[[], Any]) -> tuple[Any, float, int, int]:
        """Run ``fn``: its result or WireError, seconds, traced peak growth and RSS growth
        in bytes."""
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        rss = self.rss()
        start = time.perf_counter()
        try:
            out: Any = fn()
        except WireError as exc:
            out = exc
        seconds = time.perf_counter() - start
        return out, seconds, tracemalloc.get_traced_memory()[1] - base, self.rss() - rss


@contextmanager
def metered() -> Iterator[Meter]:
    meter = Meter()
    tracemalloc.start()
    try:
        yield meter
    finally:
        tracemalloc.stop()
        meter.close()


def chunk(mid: int, index: int, count: int, offset: int, total: int, payload: bytes) -> bytes:
    head = CHUNK_HEADER.pack(CHUNK_MAGIC, CHUNK_VERSION, 0, 0, mid, index, count, offset, total)
    return head + payload


def chunks_of(data: bytes, size: int, mid: int) -> list[bytes]:
    return [b"".join(bytes(p) for p in parts) for parts in iter_chunks([data], mid, size)]


def forged_plausible(rng: random.Random, mid: int) -> bytes:
    """A chunk consistent with itself whose message declares up to 2^64 - 1 bytes."""
    total = rng.choice(
        [LIMIT, LIMIT - 1, LIMIT + 1, 1 << 40, (1 << 64) - 1, rng.randrange(1, LIMIT)]
    )
    least = -(-total // U32)  # the smallest chunk size whose count fits the u32 field
    size = max(least, rng.choice([1, 5, 64, 1432, 4 * KiB, 16 * KiB]))
    count = -(-total // size)
    if count > U32:
        size, count = least, -(-total // least)
    index = rng.choice([0, 1, count // 2, count - 1, rng.randrange(count)]) % count
    n = min(size, total - index * size)
    if n > 64 * KiB:  # a huge last chunk of a huge-chunked message: send a truncated one
        n = rng.randrange(0, 64 * KiB)
    return chunk(mid, index, count, index * size, total, rng.randbytes(n))


def forged_small(rng: random.Random, mid: int) -> bytes:
    """A consistent chunk of a message of up to 256 KiB: enough of it to promote, often."""
    total = rng.randrange(1, 256 * KiB)
    size = rng.choice([total, -(-total // 2), -(-total // 8), -(-total // 9), 1432, 4 * KiB])
    count = -(-total // size)
    index = rng.randrange(count)
    return chunk(
        mid, index, count, index * size, total, rng.randbytes(min(size, total - index * size))
    )


def forged_random(rng: random.Random, mid: int) -> bytes:
    """Random header fields, edge values likely: nearly always malformed or inconsistent."""

    def pick(bits: int) -> int:
        top = (1 << bits) - 1
        return rng.choice([0, 1, 2, top, top - 1, rng.getrandbits(bits), rng.randrange(1 << 12)])

    total = rng.choice([pick(64), LIMIT, LIMIT + 1, rng.randrange(1 << 20)])
    return chunk(mid, pick(32), pick(32), pick(64), total, rng.randbytes(rng.randrange(0, 2048)))


def flipped(rng: random.Random, good: bytes) -> bytes:
    """``good`` with one header byte changed, not in its message id: it stays that message's."""
    at = rng.choice([*range(0, 8), *range(16, 40)])
    bad = bytearray(good)
    bad[at] ^= rng.randrange(1, 256)
    return bytes(bad)


def check_partial(part: PartialMessage, live: set[tuple[Any, int]]) -> None:
    assert (part.source, part.message_id) not in live, "a legitimate message was dropped"
    assert part.missing, "a partial message with nothing missing"
    end = 0
    for offset, length in part.missing:
        assert length > 0 and offset >= end and offset + length <= part.total_length
        end = offset + length + 1  # gaps are merged: the next starts past a received byte
    if part.total_length <= MiB:
        assert part.data.dtype == np.uint8 and len(part.data) == part.total_length


class _Legit:
    """A legitimate message: its chunks in a shuffled order with some duplicates."""

    def __init__(self, rng: random.Random, source: str) -> None:
        self.source = source
        self.mid = rng.getrandbits(64)
        self.data = rng.randbytes(rng.choice([0, 1, 999, rng.randrange(200 * KiB)]))
        size = max(rng.choice([1000, 1432, 4 * KiB, 64 * KiB]), -(-len(self.data) // 150))
        self.chunks = chunks_of(self.data, size, self.mid)
        order = self.chunks + [rng.choice(self.chunks) for _ in range(rng.randrange(4))]
        rng.shuffle(order)
        self.todo = order
        self.fed_any = False
        self.done = False


@pytest.mark.parametrize(
    "budgets",
    [
        {},
        {"max_pending": 8, "max_pending_bytes_per_source": 4 * MiB, "max_pending_bytes": 8 * MiB},
    ],
    ids=["defaults", "tight"],
)
def test_fuzz_costs_only_what_arrived(budgets: dict[str, int]) -> None:
    rng = random.Random(20240607)
    r = ChunkReassembler(timeout=TIMEOUT, **budgets)
    budget = budgets.get("max_pending_bytes")
    now = 0.0
    legit = {s: _Legit(rng, s) for s in LEGIT_SOURCES}
    delivered = 0
    partials = 0  # evicted or expired junk messages
    junk_ids = [rng.getrandbits(64) for _ in range(40)]
    replay: list[tuple[bytes, Any]] = []
    fed_bytes = 0  # payload bytes of every chunk fed, and chunks fed: the accounted bound
    fed_chunks = 0
    worst = {"seconds": 0.0, "traced": 0, "rss": 0}
    kinds: dict[str, int] = {}
    rss_start, hwm_start = status_bytes("VmRSS"), status_bytes("VmHWM")

    def run(fn: Callable[[], Any]) -> Any:
        out, seconds, traced_bytes, rss = meter.measure(fn)
        worst["seconds"] = max(worst["seconds"], seconds)
        worst["traced"] = max(worst["traced"], traced_bytes)
        worst["rss"] = max(worst["rss"], rss)
        assert seconds < PER_INPUT_SECONDS
        assert traced_bytes < PER_INPUT_BYTES and rss < PER_INPUT_BYTES
        assert r.pending_bytes <= 9 * fed_bytes + PER_CHUNK_SLACK * fed_chunks
        if budget is not None:  # over by at most the message just fed (its data fits)
            assert r.pending_bytes <= budget + 4 * MiB + PER_CHUNK_SLACK * 512
        return out

    with metered() as meter:
        for _ in range(FRAMES):
            now += TICK
            roll = rng.random()
            if roll < 0.3:  # a legitimate chunk, now and then a flipped copy of one
                m = legit[rng.choice(LEGIT_SOURCES)]
                if m.fed_any and not m.done and rng.random() < 0.1:
                    bad = flipped(rng, rng.choice(m.chunks))
                    kinds["flipped"] = kinds.get("flipped", 0) + 1
                    assert isinstance(
                        run(lambda b=bad, m=m, t=now: r.feed(b, t, m.source)), ChunkError
                    )
                    continue
                c = m.todo.pop()
                fed_bytes += len(c) - 40
                fed_chunks += 1
                out = run(lambda c=c, m=m, t=now: r.feed(c, t, m.source))
                assert not isinstance(out, WireError), out
                m.fed_any = True
                if out is not None:
                    assert not m.done
                    assert out.dtype == np.uint8 and out.flags.c_contiguous
                    assert out.tobytes() == m.data
                    m.done = True
                if not m.todo:
                    assert m.done, "a legitimate message did not come out"
                    delivered += 1
                    legit[m.source] = _Legit(rng, m.source)
                continue
            if roll < 0.32:
                live = {(s, m.mid) for s, m in legit.items() if m.fed_any and not m.done}
                for part in run(lambda t=now: r.expire(t)):
                    partials += 1
                    check_partial(part, live)
                continue
            source = rng.choice(JUNK_SOURCES)
            mid = rng.choice(junk_ids) if rng.random() < 0.5 else rng.getrandbits(64)
            kind = rng.choice(["plausible", "small", "random", "truncated", "garbage", "replay"])
            kinds[kind] = kinds.get(kind, 0) + 1
            if kind == "plausible":
                frame = forged_plausible(rng, mid)
            elif kind == "small":
                frame = forged_small(rng, mid)
            elif kind == "random":
                frame = forged_random(rng, mid)
            elif kind == "truncated":
                frame = forged_plausible(rng, mid)[: rng.randrange(40)]
            elif kind == "garbage":
                frame = rng.randbytes(rng.randrange(120))
            else:
                frame, source = rng.choice(replay) if replay else (b"", source)
            if len(replay) < 512:
                replay.append((frame, source))
            else:
                replay[rng.randrange(512)] = (frame, source)
            fed_bytes += max(len(frame) - 40, 0)
            fed_chunks += 1
            out = run(lambda f=frame, s=source, t=now: r.feed(f, t, s))
            if isinstance(out, WireError):
                assert isinstance(out, ChunkError | MessageTooLarge), repr(out)
                if kind in ("truncated", "garbage"):
                    assert isinstance(out, ChunkError)
            elif kind == "plausible" and mid not in junk_ids:  # a done id drops it unread
                assert CHUNK_HEADER.unpack_from(frame)[-1] <= LIMIT  # beyond it is refused
        for m in legit.values():  # finish what is in flight
            outs = [r.feed(c, now, m.source) for c in reversed(m.todo)]
            done = [o.tobytes() for o in outs if o is not None]
            assert done == ([] if m.done else [m.data])
            delivered += 1
        now += 2 * TIMEOUT
        for part in run(lambda: r.expire(now)):
            partials += 1
            check_partial(part, set())
    assert len(r) == 0 and r.pending_bytes == 0
    assert delivered >= 20 and partials >= 100
    assert all(kinds.get(k, 0) > 200 for k in ("plausible", "flipped"))
    grown = status_bytes("VmRSS") - rss_start
    hwm = status_bytes("VmHWM") - hwm_start
    print(
        f"\n{FRAMES} frames, {delivered} delivered, {partials} partial; worst input:"
        f" {worst['seconds']:.4f} s, traced peak +{worst['traced'] / MiB:.2f} MiB,"
        f" RSS +{worst['rss'] / MiB:.2f} MiB; whole run: RSS +{grown / MiB:.1f} MiB,"
        f" VmHWM +{hwm / MiB:.1f} MiB; kinds {kinds}"
    )


@pytest.mark.parametrize("size", [4 * KiB, 5], ids=["4KiB-chunks", "5B-chunks"])
def test_three_chunks_declaring_16_gib_cost_nothing(size: int) -> None:
    count = -(-LIMIT // size)
    assert count <= U32
    frames = [
        chunk(mid, index, count, index * size, LIMIT, bytes(min(size, LIMIT - index * size)))
        for mid, index in ((1, 0), (2, count // 2), (3, count - 1))
    ]
    r = ChunkReassembler(timeout=1.0)

    def attack() -> list[PartialMessage]:
        for f in frames:
            assert r.feed(f, 0.0, "mallory") is None
        assert len(r.missing(2, "mallory", limit=1000)) == 1000
        assert r.missing_ranges(2, "mallory") == [(0, count // 2), (count // 2 + 1, count)]
        assert len(r.leading_bytes(1, "mallory")) == size
        return r.expire(1.0)

    with metered() as meter:
        parts, seconds, traced_bytes, rss = meter.measure(attack)
    assert seconds < 0.5 and traced_bytes < 16 * MiB and rss < 16 * MiB
    assert [(p.message_id, p.total_length) for p in parts] == [(m, LIMIT) for m in (1, 2, 3)]
    assert parts[0].missing == [(size, LIMIT - size)]
    assert parts[1].missing == [
        (0, count // 2 * size),
        ((count // 2 + 1) * size, LIMIT - (count // 2 + 1) * size),
    ]
    assert parts[2].missing == [(0, (count - 1) * size)]
    assert len(r) == 0 and r.pending_bytes == 0


def half_of(r: ChunkReassembler, data: bytes, source: str, mid: int) -> list[bytes]:
    """Feed the even chunks of ``data`` (64 KiB each); return the odd ones, still to come."""
    chunks = chunks_of(data, 64 * KiB, mid)
    for c in chunks[::2]:
        assert r.feed(c, 0.0, source) is None
    return chunks[1::2]


def test_a_flooding_source_evicts_only_its_own_messages() -> None:
    r = ChunkReassembler(
        max_pending=4, max_pending_bytes_per_source=4 * MiB, max_pending_bytes=64 * MiB
    )
    data = random.Random(1).randbytes(MiB + 123)
    rest = half_of(r, data, "A", 1)
    small, big = bytes(4 * KiB), bytes(128 * KiB)
    for mid in range(2, 402):  # more messages than B may have, then more bytes (1 MiB each)
        first = chunk(mid, 0, 8, 0, 32 * KiB, small) if mid < 200 else chunk(mid, 0, 8, 0, MiB, big)
        assert r.feed(first, 1.0, "B") is None
        assert r.is_pending(1, "A")
    assert len(r) == 1 + 3  # A's, and the three of 1 MiB that fit B's budget
    assert r.pending_bytes < 4 * MiB + 2 * MiB  # B's budget, and A's half-received message
    evicted = r.expire(1.0)
    assert len(evicted) == 400 - 3 and {p.source for p in evicted} == {"B"}
    for c in rest:
        out = r.feed(c, 2.0, "A")
    assert out is not None and out.tobytes() == data


def test_over_the_total_budget_the_heaviest_source_is_cut() -> None:
    r = ChunkReassembler(max_pending=1000, max_pending_bytes=8 * MiB)
    data = random.Random(2).randbytes(256 * KiB)
    rest = half_of(r, data, "A", 1)
    for mid in range(2, 202):  # one heavy source, then many lighter ones
        r.feed(chunk(mid, 0, 8, 0, 512 * KiB, bytes(64 * KiB)), 1.0, "B")
    for n in range(200):
        r.feed(chunk(n, 0, 8, 0, 512 * KiB, bytes(64 * KiB)), 1.0, f"C{n}")
    assert r.pending_bytes <= 8 * MiB
    evicted = {p.source for p in r.expire(1.0)}
    assert "B" in evicted and any(str(s).startswith("C") for s in evicted) and "A" not in evicted
    assert r.is_pending(1, "A")
    for c in rest:
        out = r.feed(c, 2.0, "A")
    assert out is not None and out.tobytes() == data


def test_memory_follows_what_arrived_and_a_big_message_is_written_in_place() -> None:
    data = np.random.default_rng(3).integers(0, 256, 8 * MiB, dtype=np.uint8)
    chunks = chunks_of(data.tobytes(), 64 * KiB, 9)
    order = chunks[1::2] + chunks[::2]  # sparse first: no chunk extends the run from chunk 0
    r = ChunkReassembler()
    arrived = 0
    for c in order[:-1]:
        assert r.feed(c, 0.0) is None
        arrived += len(c) - 40
        assert r.pending_bytes <= 9 * arrived + 256 * 128 + 2 * KiB
        if arrived * 8 < len(data):
            assert r.pending_bytes <= 2 * arrived + 256 * 128 + 2 * KiB
            assert len(r.leading_bytes(9)) == 0
    assert r.pending_bytes < len(data) + 4 * KiB  # promoted: one buffer and a bitmap
    assert len(r.leading_bytes(9)) == 126 * 64 * KiB and r.missing_ranges(9) == [(126, 127)]
    out = r.feed(order[-1], 0.0)
    assert out is not None and out.flags.c_contiguous and np.array_equal(out, data)
    assert r.pending_bytes == 0


def runs_of(indices: list[int]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for i in indices:
        if out and out[-1][1] == i:
            out[-1] = (out[-1][0], i + 1)
        else:
            out.append((i, i + 1))
    return out


@pytest.mark.parametrize("scan", [8, 64, 1 << 20], ids=["scan-8", "scan-64", "scan-default"])
def test_gaps_match_the_chunks_that_came(monkeypatch: pytest.MonkeyPatch, scan: int) -> None:
    monkeypatch.setattr(chunks_pending, "_GAP_SCAN", scan)  # gaps that span numpy passes
    rng = random.Random(scan)
    for trial in range(60):
        count = rng.randrange(2, 700)
        data = rng.randbytes(count * 3 - rng.randrange(3))
        frames = chunks_of(data, 3, trial)
        keep = sorted(rng.sample(range(count), rng.randrange(1, count)))
        r = ChunkReassembler(timeout=1.0)
        for i in keep:
            assert r.feed(frames[i], 0.0) is None
        lost = runs_of(sorted(set(range(count)) - set(keep)))
        assert r.missing_ranges(trial) == lost
        assert r.missing_ranges(trial, limit=2) == lost[:2]
        assert r.missing(trial, limit=5) == [i for i in range(count) if i not in keep][:5]
        lead = lost[0][0]
        assert bytes(r.leading_bytes(trial)) == data[: lead * 3]
        (part,) = r.expire(1.0)
        assert part.missing == [(a * 3, min(b * 3, len(data)) - a * 3) for a, b in lost]
        got = part.data.tobytes()
        assert all(got[i * 3 : i * 3 + 3] == data[i * 3 : i * 3 + 3] for i in keep)
