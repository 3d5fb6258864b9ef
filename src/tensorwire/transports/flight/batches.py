"""A message as record batches of one binary column, and back: the bytes of a data message
travel as :data:`SCHEMA` batches; control messages as a FlightData's ``app_metadata``."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa

from tensorwire.codecs import get_codec
from tensorwire.errors import WireError
from tensorwire.transports.flight.options import FEED_BYTES, JOIN_BELOW, SCHEMA
from tensorwire.wire import EncodedMessage, Limits, Message, MessageStream, decode_message


def pieces(enc: EncodedMessage, batch_bytes: int) -> Iterator[Any]:
    """``enc`` as buffers of at most ``batch_bytes``: big ones as views, small ones joined."""
    join_below = min(JOIN_BELOW, batch_bytes)
    small: list[Any] = []
    size = 0
    for segment in enc.segments(batch_bytes):  # hashes each big tensor piece by piece
        for buf in segment:
            if len(buf) < join_below:
                if small and size + len(buf) > batch_bytes:
                    yield b"".join(small)
                    small, size = [], 0
                small.append(buf)
                size += len(buf)
                continue
            if small:
                yield b"".join(small)
                small, size = [], 0
            view = memoryview(buf)
            for start in range(0, len(view), batch_bytes):
                yield view[start : start + batch_bytes]
    if small:
        yield b"".join(small)


def batch_of(buf: Any) -> pa.RecordBatch:
    """``buf``'s bytes as the one value of a :data:`SCHEMA` batch, without copying them."""
    offsets = pa.py_buffer(np.array([0, len(buf)], np.int32))
    column = pa.Array.from_buffers(pa.binary(), 1, [None, offsets, pa.py_buffer(buf)])
    return pa.RecordBatch.from_arrays([column], schema=SCHEMA)


def bytes_of(batch: pa.RecordBatch) -> memoryview:
    """The bytes a received batch carries (its values back to back), as a view of its buffer.

    Raises ``WireError`` if the batch is not of :data:`SCHEMA` or is malformed.
    """
    if batch.num_columns != 1 or batch.column(0).type != pa.binary():
        raise WireError(f"expected batches of one binary column, got schema {batch.schema}")
    column = batch.column(0)
    try:
        column.validate(full=True)  # offsets in bounds before they are used to slice
    except pa.ArrowException as exc:
        raise WireError(f"malformed record batch: {exc}") from None
    if column.null_count:
        raise WireError(f"record batch has {column.null_count} null values")
    _, offsets, data = column.buffers()
    if data is None or not len(column):
        return memoryview(b"")
    bounds = np.frombuffer(offsets, np.int32, count=len(column) + 1, offset=4 * column.offset)
    return memoryview(data).cast("B")[int(bounds[0]) : int(bounds[-1])]


def feed(stream: MessageStream, data: memoryview) -> Message | None:
    """Feed a received batch's bytes (:func:`bytes_of`) to ``stream``, a cache-sized piece at
    a time; return the message when they are one whole message of at most ``FEED_BYTES``
    that starts where the stream is at a message's start (decoded in one pass:
    :meth:`MessageStream.receive_one`), else None (the stream's events say what the bytes
    completed)."""
    if len(data) <= FEED_BYTES:
        return stream.receive_one(data)
    for start in range(0, len(data), FEED_BYTES):
        stream.receive_data(data[start : start + FEED_BYTES])
    return None


def control_message(meta: pa.Buffer, limits: Limits) -> Message:
    """The whole message an ``app_metadata`` carries; ``WireError`` if it is none."""
    return decode_message(meta, limits=limits, codec_lookup=get_codec)
