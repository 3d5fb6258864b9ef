"""Decoding one whole message held in a buffer."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import numpy as np
import xxhash

from tensorwire.errors import MalformedHeader, TruncatedMessage
from tensorwire.wire.codec import CodecLookup
from tensorwire.wire.decoder.message import Message, message_tensors
from tensorwire.wire.decoder.tensor import (
    DEFAULT_POOL,
    check_digest,
    decode_chain,
    output_array,
    resolve_chain,
)
from tensorwire.wire.encoder import byte_view, copy_bytes
from tensorwire.wire.format import (
    DIGEST_SIZE,
    PREFIX_SIZE,
    Limits,
    Prefix,
    parse_header,
    parse_prefix,
    verify_header,
)
from tensorwire.wire.pool import BufferPool
from tensorwire.wire.tensors import TensorPath


def decode_message(
    buf: Any,
    *,
    limits: Limits = Limits(),
    codec_lookup: CodecLookup | None = None,
    out: Mapping[TensorPath, np.ndarray] | None = None,
    copy: bool = False,
    pool: BufferPool | None = None,
) -> Message:
    """Decode one whole message held in ``buf`` (any bytes-like object).

    Raw tensors are returned as views of ``buf`` (read-only if ``buf`` is) unless ``copy``
    is true or ``out`` holds a matching array for them; compressed ones are decoded into
    new arrays (or into ``out``). Every malformed input raises a ``WireError`` subclass.
    """
    start = time.perf_counter()
    mv = memoryview(buf)
    if mv.ndim != 1 or mv.format != "B":
        mv = mv.cast("B")
    if len(mv) < PREFIX_SIZE:
        raise TruncatedMessage(f"{len(mv)} bytes is shorter than the {PREFIX_SIZE}-byte prefix")
    prefix = parse_prefix(mv, limits)
    return decode_whole(mv, prefix, start, limits, codec_lookup, out, copy, pool or DEFAULT_POOL)


def decode_whole(
    mv: memoryview,
    prefix: Prefix,
    start: float,
    limits: Limits,
    codec_lookup: CodecLookup | None,
    out: Mapping[TensorPath, np.ndarray] | None,
    copy: bool,
    pool: BufferPool,
) -> Message:
    """:func:`decode_message` once the prefix is parsed."""
    end_header = PREFIX_SIZE + prefix.header_length
    total = end_header + prefix.body_length
    if len(mv) < total:
        raise TruncatedMessage(f"message is {total} bytes but only {len(mv)} were given")
    if len(mv) > total:
        raise MalformedHeader(f"{len(mv) - total} bytes follow the end of the message")
    header = mv[PREFIX_SIZE:end_header]
    verify_header(header, prefix)
    plan = parse_header(header, prefix, limits)
    table = plan.table
    chains = None
    if table.compressed:
        chains = [resolve_chain(spec, codec_lookup) for spec in table.specs]
    arrays: list[np.ndarray] = []
    offset = end_header
    digests = plan.digests
    for i, spec in enumerate(table.specs):
        encoded = mv[offset : offset + spec.size]
        offset += spec.size
        if digests:
            check_digest(spec, xxhash.xxh3_64_intdigest(encoded), mv[offset : offset + DIGEST_SIZE])
            offset += DIGEST_SIZE
        chain = chains[i] if chains is not None else None
        if not chain and not copy and (out is None or spec.path not in out):
            arr = np.frombuffer(encoded, spec.dtype).reshape(spec.shape, order=spec.order)
        else:
            arr = output_array(spec, out)
            if chain:
                decode_chain(spec, chain, encoded, byte_view(arr, spec.order), pool)
            else:
                copy_bytes(byte_view(arr, spec.order), encoded)
        arrays.append(arr)
    return Message(
        tensors=message_tensors(table, arrays),
        meta=plan.meta,
        kind=plan.kind,
        t0=plan.t0,
        nbytes=table.nbytes,
        wire_nbytes=plan.wire_nbytes,
        decode_s=time.perf_counter() - start,
        n_tensors=len(arrays),
        codec_label=table.codec_label,
    )
