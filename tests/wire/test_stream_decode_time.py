"""A stream decoder's ``decode_s`` is its own work, not the wait for a message's bytes: a
message that arrives in two parts with a gap between them reports the gap in ``recv_s``
(first byte to last tensor) and not in ``decode_s``, on both of the stream's paths."""

from __future__ import annotations

import time

import numpy as np
import pytest

from tensorwire.wire import MessageStream, encode_message
from tensorwire.wire.decoder.stream import WHOLE_BYTES

GAP_S = 0.2  # the time between the two parts: what a slow link makes a receiver wait


def _two_parts_with_a_gap(data: bytes) -> tuple[list, float]:
    """Feed ``data`` in two parts GAP_S apart; the messages and the seconds the two feeds
    took (all the decoder worked)."""
    stream = MessageStream()
    half = len(data) // 2
    started = time.perf_counter()
    stream.receive_data(data[:half])
    feeding_s = time.perf_counter() - started
    time.sleep(GAP_S)  # not a wait for a state: it is the gap between bytes on a slow link
    started = time.perf_counter()
    stream.receive_data(data[half:])
    feeding_s += time.perf_counter() - started
    msgs = []
    while stream.pending:
        msgs.append(stream.next_event())
    return msgs, feeding_s


@pytest.mark.parametrize(
    "nbytes", [1 << 20, WHOLE_BYTES + (1 << 20)], ids=["whole-buffer", "phases"]
)
@pytest.mark.parametrize("checksum", [True, False])
def test_decode_time_leaves_out_the_wait_for_bytes(nbytes: int, checksum: bool) -> None:
    data = encode_message(
        {"w": np.ones(nbytes // 4, np.float32)}, {"round": 1}, checksum=checksum
    ).to_bytes()
    (msg,), feeding_s = _two_parts_with_a_gap(data)
    assert msg.recv_s >= GAP_S  # from the first byte: the gap is in it
    assert 0.0 < msg.decode_s <= feeding_s  # only work done while bytes were fed
    assert msg.decode_s < GAP_S
