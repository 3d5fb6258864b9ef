"""The tensorwire message format, sans-IO: encode to buffers, decode from bytes or a stream.

Nothing here touches a socket; every transport drives these same objects.
"""

from tensorwire.wire.chunks import (
    CHUNK_HEADER_SIZE,
    ChunkReassembler,
    PartialMessage,
    iter_chunks,
    new_message_id,
    parse_chunk,
)
from tensorwire.wire.codec import Codec, CodecLookup, CodecSelector
from tensorwire.wire.decoder import NEED_DATA, Message, MessageStream, decode_message
from tensorwire.wire.dtypes import WIRE_DTYPES
from tensorwire.wire.encoder import EncodedMessage, encode_message
from tensorwire.wire.format import PREFIX_SIZE, VERSION, Limits, MessagePlan, TensorSpec
from tensorwire.wire.pool import BufferPool

__all__ = [
    "CHUNK_HEADER_SIZE",
    "NEED_DATA",
    "PREFIX_SIZE",
    "VERSION",
    "WIRE_DTYPES",
    "BufferPool",
    "ChunkReassembler",
    "Codec",
    "CodecLookup",
    "CodecSelector",
    "EncodedMessage",
    "Limits",
    "Message",
    "MessagePlan",
    "MessageStream",
    "PartialMessage",
    "TensorSpec",
    "decode_message",
    "encode_message",
    "iter_chunks",
    "new_message_id",
    "parse_chunk",
]
