"""A decoded Message is a read-only mapping of its top-level names to its tensors (issue 14)."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pytest

from tensorwire.wire import Message, MessageStream, decode_message, encode_message

TENSORS = {
    "weights": {"conv": {"w": np.ones((2, 2), np.float32)}, "b": np.zeros(2)},
    "step": np.int64(7),
}


@pytest.fixture(params=["decode_message", "stream"])
def msg(request: pytest.FixtureRequest) -> Message:
    data = encode_message(TENSORS, {"round": 1}).to_bytes()
    if request.param == "decode_message":
        return decode_message(data)
    stream = MessageStream()
    stream.receive_data(data)
    got = stream.next_event()
    assert isinstance(got, Message)
    return got


def test_a_message_is_a_mapping_of_its_top_level_names(msg: Message) -> None:
    assert isinstance(msg, Mapping)
    assert list(msg) == ["weights", "step"] == list(msg.keys())
    assert len(msg) == 2
    assert "weights" in msg and "step" in msg and "conv" not in msg and 3 not in msg
    assert dict(msg).keys() == {"weights", "step"}
    assert msg["step"] == 7 and msg.get("missing") is None
    np.testing.assert_array_equal(msg["weights"]["conv"]["w"], np.ones((2, 2)))
    assert [k for k, _ in msg.items()] == ["weights", "step"]
    assert msg.meta == {"round": 1}  # metadata is not among the items


def test_a_message_cannot_be_assigned_to(msg: Message) -> None:
    with pytest.raises(TypeError):
        msg["new"] = np.zeros(1)  # type: ignore[index]
    with pytest.raises(TypeError):
        del msg["step"]  # type: ignore[attr-defined]
    with pytest.raises(KeyError):
        msg["missing"]


def test_a_message_can_be_sent_on_as_it_is(msg: Message) -> None:
    again = decode_message(encode_message(msg).to_bytes())
    assert list(again) == list(msg)
    np.testing.assert_array_equal(again["weights"]["b"], msg["weights"]["b"])


def test_an_empty_message_is_an_empty_mapping() -> None:
    msg = decode_message(encode_message(None, {"only": "meta"}).to_bytes())
    assert len(msg) == 0 and dict(msg) == {} and not list(msg)
