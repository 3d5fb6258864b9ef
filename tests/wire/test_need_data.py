"""NEED_DATA: one sentinel object that prints as its name (a one-member enum for type checkers)."""

from __future__ import annotations

import numpy as np

import tensorwire.wire.decoder as decoder
from tensorwire.wire import NEED_DATA, MessageStream, encode_message


def test_need_data_prints_as_its_name_and_is_one_object() -> None:
    assert repr(NEED_DATA) == str(NEED_DATA) == f"{NEED_DATA}" == "NEED_DATA"
    assert NEED_DATA is decoder.NEED_DATA
    assert NEED_DATA  # truthy, as before: callers test it with `is`, never by truth value


def test_stream_returns_need_data_until_a_message_is_whole() -> None:
    data = encode_message({"w": np.arange(6, dtype=np.float32)}, meta={"round": 1}).to_bytes()
    stream = MessageStream()
    assert stream.next_event() is NEED_DATA
    stream.receive_data(data[:-1])
    assert stream.next_event() is NEED_DATA
    stream.receive_data(data[-1:])
    event = stream.next_event()
    assert event is not NEED_DATA
    assert event.meta == {"round": 1}
    np.testing.assert_array_equal(event["w"], np.arange(6, dtype=np.float32))
    assert stream.next_event() is NEED_DATA
