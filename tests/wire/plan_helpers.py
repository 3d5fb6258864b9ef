"""Helpers of the header-plan and header-layout tests: a message's header bytes, and a
message read as a stream reads it (through its cached plans and layouts)."""

from __future__ import annotations

from tensorwire.wire import Limits, MessageStream
from tensorwire.wire.format import PREFIX_SIZE, parse_prefix


def header_of(data: bytes) -> bytes:
    prefix = parse_prefix(data, Limits())
    return data[PREFIX_SIZE : PREFIX_SIZE + prefix.header_length]


def streamed(data: bytes):
    from tensorwire.codecs import get_codec

    stream = MessageStream(codec_lookup=get_codec)
    got = stream.receive_one(memoryview(data))
    return got if got is not None else stream.next_event()
