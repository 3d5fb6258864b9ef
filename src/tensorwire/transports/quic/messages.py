"""A message on a QUIC stream of its own: its bytes as they arrive, one on its way out, and
decoding a stream's bytes into a message."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from tensorwire.codecs import get_codec
from tensorwire.errors import WireError
from tensorwire.wire import EncodedMessage, Limits, Message, MessageStream

PIECE = 1 << 20
"""Most bytes handed to the connection in one call."""


@dataclass(eq=False)
class IncomingMessage:
    """A message arriving on one stream: its bytes as they came, checked against the limits."""

    chunks: list[bytes] = field(default_factory=list)
    size: int = 0
    total: int | None = None  # what its prefix declares, once known


@dataclass(eq=False)
class SendJob:
    """One message on its way out on a stream of its own; ``done`` is set once every byte and
    the FIN are with the connection (``error`` unset) or the send failed (``error`` set)."""

    pieces: Iterator[memoryview | bytes]
    nbytes: int
    stream_id: int = -1
    done: threading.Event = field(default_factory=threading.Event)
    error: Exception | None = None
    written: bool = False  # every byte and the FIN are with the connection

    @classmethod
    def of(cls, enc: EncodedMessage) -> SendJob:
        return cls(_pieces(enc), len(enc))


def _pieces(enc: EncodedMessage) -> Iterator[memoryview | bytes]:
    for batch in enc.segments():
        for buf in batch:
            view = memoryview(buf).cast("B")
            for start in range(0, len(view), PIECE):
                yield view[start : start + PIECE]


def decode_stream(chunks: list[bytes], limits: Limits, out: Any = None) -> Message:
    """The message one stream carried in ``chunks`` (decoded into ``out`` where it fits);
    WireError for bytes that are no whole message."""
    stream = MessageStream(limits=limits, codec_lookup=get_codec)
    stream.set_out(out)
    for chunk in chunks:
        stream.receive_data(chunk)
    event = stream.next_event()
    if not isinstance(event, Message):
        raise WireError("a stream ended inside its message")
    return event
