"""Chunking for size-capped transports: the chunk format (``chunk``), a message being
reassembled (``pending``) and the reassembler with its budgets (``reassembler``)."""

from tensorwire.wire.chunks.chunk import (
    CHUNK_HEADER,
    CHUNK_HEADER_SIZE,
    CHUNK_MAGIC,
    CHUNK_VERSION,
    ChunkHeader,
    iter_chunks,
    new_message_id,
    parse_chunk,
)
from tensorwire.wire.chunks.pending import PartialMessage
from tensorwire.wire.chunks.reassembler import MAX_MISSING, ChunkReassembler

__all__ = [
    "CHUNK_HEADER",
    "CHUNK_HEADER_SIZE",
    "CHUNK_MAGIC",
    "CHUNK_VERSION",
    "MAX_MISSING",
    "ChunkHeader",
    "ChunkReassembler",
    "PartialMessage",
    "iter_chunks",
    "new_message_id",
    "parse_chunk",
]
