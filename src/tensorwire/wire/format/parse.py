"""Parsing a verified header into a ``MessagePlan``, its ``tensors`` array validated once."""

from __future__ import annotations

from typing import Any

import msgpack

from tensorwire.errors import HeaderCheckMismatch, MalformedHeader
from tensorwire.wire.format.entries import validate_tensors
from tensorwire.wire.format.known import CACHED, quick_split, split_header
from tensorwire.wire.format.layout import DIGEST_SIZE, UNPACK, Limits, MessagePlan
from tensorwire.wire.format.prefix import Prefix
from tensorwire.wire.plans import TENSOR_TABLES


def parse_header(data: bytes | memoryview, prefix: Prefix, limits: Limits) -> MessagePlan:
    """Unpack a verified header; every inconsistency raises a ``WireError`` subclass.

    A header laid out as the reference encoder writes it has its ``tensors`` array looked
    up, by its bytes, among the tables validated before (``plans.TENSOR_TABLES``): then
    only its ``kind``, ``meta`` and ``t0`` are unpacked. Any other header is unpacked and
    validated in full.
    """
    header = bytes(data)
    split = quick_split(header) or split_header(header)
    if split is None:
        doc = _unpack_header(header)
        span, table, entries = None, None, doc.get("tensors", [])
    else:
        doc, span, table, entries = split
    kind = doc.get("kind", "data")
    meta = doc.get("meta", {})
    t0 = doc.get("t0")
    if not isinstance(kind, str):
        raise MalformedHeader("header field 'kind' must be a string")
    if not isinstance(meta, dict):
        raise MalformedHeader("header field 'meta' must be a map")
    if t0 is not None and not isinstance(t0, (int, float)):
        raise MalformedHeader("header field 't0' must be a number")
    if table is None or not table.fits(limits):
        if entries is CACHED and span is not None:  # cached, over these limits: say why
            entries = msgpack.unpackb(span, **UNPACK)
        table = validate_tensors(entries, limits)
        if span is not None:
            TENSOR_TABLES.put(span, table, len(span))
    digest_bytes = DIGEST_SIZE * len(table.specs) if prefix.digests else 0
    body = table.encoded_nbytes + digest_bytes
    if body != prefix.body_length:
        # The prefix is outside the header check, so this is where a corrupt one shows.
        raise HeaderCheckMismatch(
            f"tensors account for {body} body bytes but the prefix declares {prefix.body_length}"
        )
    return MessagePlan(
        kind,
        meta,
        float(t0) if t0 is not None else None,
        table,
        prefix.digests,
        prefix.header_length,
        prefix.body_length,
    )


def _unpack_header(header: bytes) -> dict[str, Any]:
    try:
        doc = msgpack.unpackb(header, **UNPACK)
    except Exception as exc:  # msgpack raises several unrelated types on bad input
        raise MalformedHeader(f"header is not valid msgpack: {exc}") from None
    if not isinstance(doc, dict):
        raise MalformedHeader(f"header must be a map, got {type(doc).__name__}")
    return doc
