"""The broker transports' base without a broker: graces (sans-IO) and timed reassembly."""

from __future__ import annotations

import time

import pytest

from tensorwire.errors import ChunkError, MessageTooLarge
from tensorwire.transports.broker import Graces, Inflow, lone_chunk, one_chunk
from tensorwire.wire import encode_message, iter_chunks


def test_a_grace_counts_from_the_first_suspicion_and_restarts_when_the_medium_is_back():
    graces = Graces(10.0)
    graces.suspect("a", "will came", now=100.0)
    graces.suspect("b", "no consumer", now=100.0)
    graces.suspect("b", "no consumer", now=105.0, again=False)  # b's clock keeps running
    graces.suspect("c", "will came", now=100.0)
    graces.clear("c")  # it said hello
    assert graces.due(109.9) == [] and "c" not in graces
    assert sorted(graces.due(110.0)) == [("a", "will came"), ("b", "no consumer")]
    assert "a" not in graces and "b" not in graces
    graces.suspect("d", "will came", now=200.0)
    graces.restart(now=250.0)  # the medium was lost meanwhile: a whole grace again
    assert graces.due(259.9) == [] and graces.due(260.0) == [("d", "will came")]


def test_inflow_dates_messages_drops_repeats_and_bounds_what_it_holds():
    enc = encode_message(None, {"n": 1})
    small = one_chunk(enc)
    inflow = Inflow(max_message_bytes=1 << 20, timeout=0.05)
    before = time.perf_counter()
    body, first = inflow.feed(small, "s")
    assert bytes(body) == enc.to_bytes() and first >= before
    assert inflow.feed(small, "s") is None  # a repeated message id is delivered once
    assert bytes(lone_chunk(small)) == enc.to_bytes()
    data = bytes(range(256)) * 64
    chunks = [b"".join(c) for c in iter_chunks([data], 7, 1024)]
    assert all(inflow.feed(c, "s") is None for c in chunks[:-1])
    whole, started = inflow.feed(chunks[-1], "s")
    assert bytes(whole) == data and started < time.perf_counter()
    assert inflow.feed(chunks[0], "t") is None  # another source's half message ...
    time.sleep(0.06)
    (source, error), *_ = inflow.expire()
    assert source == "t" and isinstance(error, ChunkError) and "never arrived" in str(error)
    tiny = Inflow(max_message_bytes=16, timeout=1.0)
    with pytest.raises(MessageTooLarge):
        tiny.feed(small, "s")
