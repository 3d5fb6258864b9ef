"""The reference layout read by its bytes: a header whose ``tensors`` array was validated
before is split where that array lies, and only its other fields are unpacked."""

from __future__ import annotations

import struct
from typing import Any

import msgpack

from tensorwire.wire.format.layout import UNPACK
from tensorwire.wire.plans import TENSOR_TABLES, TensorTable

_F64 = struct.Struct(">d")
_TENSORS_KEY_AT = b"\xa7tensors"  # fixstr "tensors": how the reference encoder writes the key
_T0_TAIL = b"\xa2t0\xcb"  # fixstr "t0", then a float 64: the last 12 bytes of its headers
_MAX_KEY_TRIES = 4  # places "tensors" is looked for (a meta string may hold the same bytes)
CACHED = object()  # stands for the unpacked array when the table was found in the cache

_KIND_AT = b"\x84\xa4kind"
_META_EMPTY_TENSORS = b"\xa4meta\x80\xa7tensors"
_META_KEY_AT = b"\xa4meta"


def known_header(header: bytes) -> tuple[str, dict[str, Any], float, bytes, TensorTable] | None:
    """``(kind, meta, t0, tensors bytes, table)`` of a header laid out as the reference encoder
    writes it with a fixstr ``kind``, a ``tensors`` array validated before and a float 64
    ``t0``; None for any other (or a table these limits may refuse: the caller checks
    ``table.fits``). An empty ``meta`` is recognised by its bytes; another is unpacked.

    Why a split found by searching is the header's parse: msgpack values carry their own
    lengths, and a cached array is exactly one value; so if ``meta``'s bytes unpack as
    exactly one value too, the header is exactly those four pairs, wherever in it the
    search found the ``tensors`` key.
    """
    if not header.startswith(_KIND_AT) or len(header) < 21:
        return None
    code = header[6]
    if not 0xA0 <= code <= 0xBF:
        return None
    start = 7 + (code & 0x1F)
    end = len(header)
    if header[end - 12 : end - 8] != _T0_TAIL:
        return None
    if header[start : start + 14] == _META_EMPTY_TENSORS:
        meta: Any = {}
        span = header[start + 14 : end - 12]
        table = TENSOR_TABLES.get(span)  # cached: exactly one valid array, so the split is right
        if table is None:
            return None
    elif header[start : start + 5] == _META_KEY_AT:
        pos = header.rfind(_TENSORS_KEY_AT, start + 6, end - 12)
        if pos < 0:
            return None
        span = header[pos + 8 : end - 12]
        table = TENSOR_TABLES.get(span)
        if table is None:
            return None
        try:
            meta = msgpack.unpackb(header[start + 5 : pos])
        except Exception:  # not exactly one value: not this split
            return None
        if type(meta) is not dict:
            return None
    else:
        return None
    try:
        kind = header[7:start].decode()
    except UnicodeDecodeError:
        return None
    return kind, meta, _F64.unpack_from(header, end - 8)[0], span, table


def meta_cut(key: bytes) -> tuple[int, int] | None:
    """Where the ``meta`` value lies in ``key`` (a header but for its last 8 bytes, laid out as
    :func:`known_header` reads it, with a non-empty ``meta``): ``(start, end)``, its end being
    the last ``tensors`` key; None for any other layout. Whether the split is right is for
    the caller to find out, as :func:`known_header` does: the rest must be a layout's bytes
    and the cut-out bytes must unpack as exactly one map."""
    if not key.startswith(_KIND_AT) or len(key) < 9 or key[-4:] != _T0_TAIL:
        return None
    code = key[6]
    if not 0xA0 <= code <= 0xBF:
        return None
    start = 7 + (code & 0x1F)
    if key[start : start + 5] != _META_KEY_AT or key[start + 5 : start + 6] in (b"", b"\x80"):
        return None
    end = key.rfind(_TENSORS_KEY_AT, start + 6, len(key) - 4)
    return None if end < 0 else (start + 5, end)


def known_meta_bytes(header: bytes, span: bytes) -> bytes:
    """The packed ``meta`` of a header :func:`known_header` read, given its ``tensors``
    bytes: what lies between the ``meta`` key and the ``tensors`` key."""
    return header[12 + (header[6] & 0x1F) : len(header) - 20 - len(span)]


def quick_split(header: bytes) -> tuple[dict[str, Any], bytes, TensorTable, Any] | None:
    """:func:`split_header` for the header :func:`known_header` knows; None for any other."""
    known = known_header(header)
    if known is None:
        return None
    kind, meta, t0, span, table = known
    return {"kind": kind, "meta": meta, "t0": t0}, span, table, CACHED


def split_header(header: bytes) -> tuple[dict[str, Any], bytes, TensorTable | None, Any] | None:
    """Find the ``tensors`` array's bytes in a header of the reference layout.

    Return ``(the header's other fields, the array's bytes, its cached table or None, its
    unpacked value or CACHED)``, or None unless the header is a fixmap whose
    ``tensors`` value comes last but for a float 64 ``t0``. What precedes the key must
    unpack as exactly the other pairs and the array as exactly one value: msgpack values
    carry their own lengths, so this split is the header's one parse.
    """
    if len(header) < 9 or not 0x81 <= header[0] <= 0x8F:
        return None
    pairs = header[0] & 0x0F
    end = len(header)
    t0_tail = pairs >= 2 and header[end - 12 : end - 8] == _T0_TAIL
    stop = end - 12 if t0_tail else end
    before = bytes((0x80 | (pairs - 1 - t0_tail),))
    pos = header.find(_TENSORS_KEY_AT, 1, stop)
    for _ in range(_MAX_KEY_TRIES):
        if pos < 0:
            return None
        span = header[pos + 8 : stop]
        table = TENSOR_TABLES.get(span)
        entries = CACHED
        try:
            if table is None:
                entries = msgpack.unpackb(span, **UNPACK)
            # msgpack >= 1.0's defaults are UNPACK's (spelled out, they cost 0.4 us here)
            doc = msgpack.unpackb(before + header[1:pos])
        except Exception:  # the key is not at pos: look further on
            pos = header.find(_TENSORS_KEY_AT, pos + 1, stop)
            continue
        if t0_tail:
            doc["t0"] = _F64.unpack_from(header, end - 8)[0]
        return doc, span, table, entries
    return None
