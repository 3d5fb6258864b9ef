"""The message layout: fixed prefix, msgpack header, validation of both against ``Limits``.

Layout (all integers little-endian; ``docs/wire-format.md`` is the normative text)::

    prefix   24 bytes  magic "TWIR" | version u8 | flags u8 | reserved u16
                       | header_length u32 | header_check u32 | body_length u64
    header   header_length bytes of msgpack (a map, see ``build_header``)
    body     per tensor: its encoded bytes, then (flag DIGESTS) 8 bytes xxh3-64 of them
"""

from __future__ import annotations

import math
import struct
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeGuard

import msgpack
import numpy as np
import xxhash

from tensorwire.errors import (
    BadMagic,
    HeaderCheckMismatch,
    HeaderTooLarge,
    MalformedHeader,
    MessageTooLarge,
    ShapeMismatch,
    UnsupportedVersion,
)
from tensorwire.wire.dtypes import dtype_from_name
from tensorwire.wire.plans import TENSOR_TABLES, TensorTable, pack
from tensorwire.wire.tensors import Order, TensorPath

MAGIC = b"TWIR"
VERSION = 1
PREFIX = struct.Struct("<4sBBHIIQ")
PREFIX_SIZE = PREFIX.size  # 24
_F64 = struct.Struct(">d")
DIGEST_SIZE = 8
FLAG_DIGESTS = 0x01
KNOWN_FLAGS = FLAG_DIGESTS

GiB = 1 << 30


@dataclass(frozen=True)
class Limits:
    """Bounds a decoder enforces before it allocates anything (bytes and counts)."""

    # A parsed header can take ~70x its size in Python objects: keep this modest.
    max_header_bytes: int = 8 << 20
    # Decoding one message allocates at most this: its decoded tensors plus the scratch
    # space of its largest compressed tensor.
    max_message_bytes: int = 16 * GiB
    max_tensors: int = 1_000_000
    max_ndim: int = 64


@dataclass(frozen=True)
class TensorSpec:
    """One tensor as the header describes it."""

    path: TensorPath
    dtype: np.dtype
    shape: tuple[int, ...]
    order: Order
    nbytes: int  # decoded size
    size: int  # encoded size on the wire
    codecs: tuple[dict[str, Any], ...] = ()
    sizes: tuple[int, ...] = ()  # byte length between codec stages (len(codecs) - 1 values)

    @property
    def stage_sizes(self) -> tuple[int, ...]:
        """Sizes from decoded to encoded: ``(nbytes, *sizes, size)`` (codec count + 1 values)."""
        return (self.nbytes, *self.sizes, self.size) if self.codecs else (self.nbytes,)

    @property
    def scratch_bytes(self) -> int:
        """Bytes of scratch a decoder needs besides the output (0 for a raw tensor)."""
        return self.size + sum(self.sizes) if self.codecs else 0


@dataclass(slots=True)
class MessagePlan:
    """A validated header: what the body holds and where."""

    kind: str
    meta: dict[str, Any]
    t0: float | None
    table: TensorTable
    digests: bool
    header_length: int
    body_length: int

    @property
    def tensors(self) -> tuple[TensorSpec, ...]:
        """Every tensor's spec, in body order."""
        return self.table.specs

    @property
    def nbytes(self) -> int:
        """Decoded size of all tensors, bytes."""
        return self.table.nbytes

    @property
    def codec_label(self) -> str:
        return self.table.codec_label

    @property
    def wire_nbytes(self) -> int:
        """Size of the whole message on the wire, bytes."""
        return PREFIX_SIZE + self.header_length + self.body_length


@dataclass(slots=True)
class Prefix:
    flags: int
    header_length: int
    header_check: int
    body_length: int
    digests: bool = field(init=False)

    def __post_init__(self) -> None:
        self.digests = bool(self.flags & FLAG_DIGESTS)


def codec_label(chains: Iterable[Sequence[Mapping[str, Any]]]) -> str:
    """Sorted ids of each tensor's first codec (``"raw"`` for none) joined by "+": "lz4+raw"."""
    ids = {chain[0]["id"] if chain else "raw" for chain in chains}
    return "+".join(sorted(ids)) or "raw"


def header_check(header: bytes | memoryview) -> int:
    """The 32-bit check of the header bytes: low 32 bits of xxh3-64."""
    return xxhash.xxh3_64_intdigest(header) & 0xFFFFFFFF


def pack_prefix(header: bytes, body_length: int, digests: bool) -> bytes:
    flags = FLAG_DIGESTS if digests else 0
    check = xxhash.xxh3_64_intdigest(header) & 0xFFFFFFFF  # header_check, inline: per message
    return PREFIX.pack(MAGIC, VERSION, flags, 0, len(header), check, body_length)


def parse_prefix(data: bytes | bytearray | memoryview, limits: Limits) -> Prefix:
    """Validate the 24-byte prefix; raise the specific ``WireError`` for what is wrong."""
    magic, version, flags, reserved, hlen, hcheck, blen = PREFIX.unpack_from(data)
    if magic != MAGIC:
        raise BadMagic(f"bad magic {bytes(magic)!r}: not a tensorwire message (expected {MAGIC!r})")
    if version != VERSION:
        raise UnsupportedVersion(
            f"wire-format version {version} is not supported; this build reads version {VERSION}"
        )
    if flags & ~KNOWN_FLAGS or reserved:
        raise MalformedHeader(f"unknown flags 0x{flags:02x} / reserved 0x{reserved:04x} in prefix")
    if hlen > limits.max_header_bytes:
        raise HeaderTooLarge(
            f"header of {hlen} bytes exceeds the limit of {limits.max_header_bytes} bytes "
            "(raise Limits.max_header_bytes if this is expected)"
        )
    if blen > limits.max_message_bytes:
        raise MessageTooLarge(
            f"body of {blen} bytes exceeds the limit of {limits.max_message_bytes} bytes "
            "(raise Limits.max_message_bytes if this is expected)"
        )
    return Prefix(flags, hlen, hcheck, blen)


_KIND_KEY, _META_KEY, _TENSORS_KEY, _T0_KEY = (pack(k) for k in ("kind", "meta", "tensors", "t0"))


def build_header(
    kind: str, meta: dict[str, Any], t0: float | None, tensors: list[dict[str, Any]]
) -> bytes:
    """Pack the header map; ``meta`` must hold only msgpack types (numpy scalars allowed)."""
    try:
        packed = pack(tensors)
    except (TypeError, ValueError, OverflowError) as exc:
        raise TypeError(f"a tensor entry cannot be packed: {exc}") from None
    return assemble_header(kind, meta, t0, packed)


_HEAD_STARTS: dict[str, bytes] = {}  # kind -> the header's bytes up to its tensors, no meta
_MAX_HEAD_STARTS = 16
_T0_F64 = struct.Struct(">Bd")  # msgpack's float 64: 0xcb, then the value big-endian


def assemble_header(kind: str, meta: dict[str, Any], t0: float | None, tensors: bytes) -> bytes:
    """The header map around an already packed ``tensors`` array: the same bytes as packing
    ``{"kind", "meta", "tensors"[, "t0"]}`` in that order (section 4.1's reference layout)."""
    if not meta and type(t0) is float and type(kind) is str:  # most messages: bytes joined
        start = _HEAD_STARTS.get(kind)
        if start is None:
            start = b"\x84" + _KIND_KEY + pack(kind) + _META_KEY + b"\x80" + _TENSORS_KEY
            if len(_HEAD_STARTS) < _MAX_HEAD_STARTS:
                _HEAD_STARTS[kind] = start
        return b"".join((start, tensors, _T0_KEY, _T0_F64.pack(0xCB, t0)))
    _check_str_keys(meta, "meta")
    try:
        parts = [
            b"\x84" if t0 is not None else b"\x83",
            _KIND_KEY,
            pack(kind),
            _META_KEY,
            pack(meta),
            _TENSORS_KEY,
            tensors,
        ]
        if t0 is not None:
            parts += (_T0_KEY, pack(t0))
    except (TypeError, ValueError, OverflowError) as exc:
        raise TypeError(
            f"meta cannot be sent: {exc} (use str, int, float, bool, bytes, lists, dicts)"
        ) from None
    return b"".join(parts)


def _check_str_keys(obj: Any, where: str) -> None:
    """Decoders accept only string map keys (msgpack's strict_map_key): refuse others here."""
    if type(obj) is dict:  # the common meta: str keys to scalars or lists of scalars
        for key, value in obj.items():
            kind = type(value)
            if type(key) is not str or (
                kind not in _SCALARS
                and not (kind in _SEQUENCES and all(type(v) in _SCALARS for v in value))
            ):
                break
        else:
            return
    if isinstance(obj, dict):
        for key, value in obj.items():
            if not isinstance(key, str):
                raise TypeError(f"{where} has the key {key!r}; map keys in meta must be str")
            if isinstance(value, _CONTAINERS):
                _check_str_keys(value, f"{where}.{key}")
    elif isinstance(obj, (list, tuple)):
        for value in obj:
            if isinstance(value, _CONTAINERS):
                _check_str_keys(value, where)


_CONTAINERS = (dict, list, tuple)
_SEQUENCES = frozenset((list, tuple))
_SCALARS = frozenset((str, int, float, bool, bytes, type(None)))


def verify_header(data: bytes | memoryview, prefix: Prefix) -> None:
    """Raise ``HeaderCheckMismatch`` unless the header bytes match the prefix's check."""
    if header_check(data) != prefix.header_check:
        raise HeaderCheckMismatch("header check mismatch: the header (or prefix) bytes are corrupt")


_UNPACK: dict[str, Any] = {"raw": False, "strict_map_key": True, "use_list": True}
_TENSORS_KEY_AT = b"\xa7tensors"  # fixstr "tensors": how the reference encoder writes the key
_T0_TAIL = b"\xa2t0\xcb"  # fixstr "t0", then a float 64: the last 12 bytes of its headers
_MAX_KEY_TRIES = 4  # places "tensors" is looked for (a meta string may hold the same bytes)
_CACHED = object()  # stands for the unpacked array when the table was found in the cache


def parse_header(data: bytes | memoryview, prefix: Prefix, limits: Limits) -> MessagePlan:
    """Unpack a verified header; every inconsistency raises a ``WireError`` subclass.

    A header laid out as the reference encoder writes it has its ``tensors`` array looked
    up, by its bytes, among the tables validated before (``plans.TENSOR_TABLES``): then
    only its ``kind``, ``meta`` and ``t0`` are unpacked. Any other header is unpacked and
    validated in full.
    """
    header = bytes(data)
    split = _quick_split(header) or _split_header(header)
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
        if entries is _CACHED and span is not None:  # cached, over these limits: say why
            entries = msgpack.unpackb(span, **_UNPACK)
        table = _validate_tensors(entries, limits)
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
        doc = msgpack.unpackb(header, **_UNPACK)
    except Exception as exc:  # msgpack raises several unrelated types on bad input
        raise MalformedHeader(f"header is not valid msgpack: {exc}") from None
    if not isinstance(doc, dict):
        raise MalformedHeader(f"header must be a map, got {type(doc).__name__}")
    return doc


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


def _quick_split(header: bytes) -> tuple[dict[str, Any], bytes, TensorTable, Any] | None:
    """:func:`_split_header` for the header :func:`known_header` knows; None for any other."""
    known = known_header(header)
    if known is None:
        return None
    kind, meta, t0, span, table = known
    return {"kind": kind, "meta": meta, "t0": t0}, span, table, _CACHED


def _split_header(header: bytes) -> tuple[dict[str, Any], bytes, TensorTable | None, Any] | None:
    """Find the ``tensors`` array's bytes in a header of the reference layout.

    Return ``(the header's other fields, the array's bytes, its cached table or None, its
    unpacked value or _CACHED)``, or None unless the header is a fixmap whose
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
        entries = _CACHED
        try:
            if table is None:
                entries = msgpack.unpackb(span, **_UNPACK)
            # msgpack >= 1.0's defaults are _UNPACK's (spelled out, they cost 0.4 us here)
            doc = msgpack.unpackb(before + header[1:pos])
        except Exception:  # the key is not at pos: look further on
            pos = header.find(_TENSORS_KEY_AT, pos + 1, stop)
            continue
        if t0_tail:
            doc["t0"] = _F64.unpack_from(header, end - 8)[0]
        return doc, span, table, entries
    return None


def _validate_tensors(entries: Any, limits: Limits) -> TensorTable:
    if not isinstance(entries, list):
        raise MalformedHeader("header field 'tensors' must be an array")
    if len(entries) > limits.max_tensors:
        raise MessageTooLarge(f"{len(entries)} tensors exceed the limit of {limits.max_tensors}")
    specs = tuple(_parse_tensor(i, e, limits) for i, e in enumerate(entries))
    _check_paths(specs)
    decoded = sum(s.nbytes for s in specs)
    scratch = max((s.scratch_bytes for s in specs), default=0)
    if decoded + scratch > limits.max_message_bytes:
        raise MessageTooLarge(
            f"decoding needs {decoded + scratch} bytes ({decoded} decoded + {scratch} scratch), "
            f"over the limit of {limits.max_message_bytes} bytes"
        )
    flat = all(len(s.path) == 1 for s in specs)
    return TensorTable(
        specs=specs,
        encoded_nbytes=sum(s.size for s in specs),
        nbytes=decoded,
        scratch_nbytes=scratch,
        max_ndim=max((len(s.shape) for s in specs), default=0),
        codec_label=codec_label(s.codecs for s in specs),
        compressed=any(s.codecs for s in specs),
        flat_names=tuple(s.path[0] for s in specs) if flat else None,
    )


def _is_count(value: Any) -> TypeGuard[int]:
    return type(value) is int and value >= 0


def _parse_tensor(index: int, e: Any, limits: Limits) -> TensorSpec:
    # Hot for small messages: no message is formatted unless something is wrong.
    if type(e) is not dict:
        raise MalformedHeader(f"tensor #{index} must be a map")
    path = e.get("name")
    if type(path) is not list or not path or not all(type(p) is str and p for p in path):
        raise MalformedHeader(
            f"tensor #{index}: 'name' must be a non-empty array of non-empty strings"
        )
    dtype = dtype_from_name(e.get("dtype"))
    shape = e.get("shape")
    if type(shape) is not list or len(shape) > limits.max_ndim or not all(map(_is_count, shape)):
        raise MalformedHeader(
            f"tensor {'/'.join(path)!r}: 'shape' must be an array of at most {limits.max_ndim} "
            f"non-negative integers, got {shape!r}"
        )
    order = e.get("order", "C")
    if order != "C" and order != "F":
        raise MalformedHeader(
            f"tensor {'/'.join(path)!r}: 'order' must be 'C' or 'F', got {order!r}"
        )
    nbytes = e.get("nbytes")
    size = e.get("size")
    if not (_is_count(nbytes) and _is_count(size)):
        raise MalformedHeader(
            f"tensor {'/'.join(path)!r}: 'nbytes' and 'size' must be non-negative integers, "
            f"got {nbytes!r} and {size!r}"
        )
    expected = math.prod(shape) * dtype.itemsize
    if expected != nbytes:
        raise ShapeMismatch(
            f"tensor {'/'.join(path)!r}: shape {shape} of {dtype.name} is {expected} bytes, "
            f"header says {nbytes}"
        )
    if not expected and math.prod(d for d in shape if d) * dtype.itemsize > sys.maxsize:
        # numpy refuses such a shape even for an empty array (its size must fit an intp)
        raise MalformedHeader(f"tensor {'/'.join(path)!r}: shape {shape} is too big for an array")
    codecs = e.get("codecs", ())
    sizes = e.get("sizes", ())
    if codecs:
        if type(codecs) is not list or not all(
            type(c) is dict and type(c.get("id")) is str for c in codecs
        ):
            raise MalformedHeader(
                f"tensor {'/'.join(path)!r}: 'codecs' must be an array of maps with an 'id'"
            )
        if (
            type(sizes) not in (list, tuple)
            or len(sizes) != len(codecs) - 1
            or not all(map(_is_count, sizes))
        ):
            raise MalformedHeader(
                f"tensor {'/'.join(path)!r}: 'sizes' must hold one non-negative size per inner "
                "codec stage"
            )
    elif sizes or type(codecs) not in (list, tuple) or type(sizes) not in (list, tuple):
        raise MalformedHeader(
            f"tensor {'/'.join(path)!r}: 'sizes' without 'codecs', or bad 'codecs'"
        )
    elif size != nbytes:
        raise ShapeMismatch(
            f"tensor {'/'.join(path)!r}: raw tensor of {nbytes} bytes declares {size} on the wire"
        )
    return TensorSpec(
        tuple(path), dtype, tuple(shape), order, nbytes, size, tuple(codecs), tuple(sizes)
    )


def _check_paths(specs: Sequence[TensorSpec]) -> None:
    seen = {s.path for s in specs}
    if len(seen) != len(specs):
        raise MalformedHeader("two tensors have the same name")
    for s in specs:
        for i in range(1, len(s.path)):
            if s.path[:i] in seen:
                raise MalformedHeader(
                    f"name {'/'.join(s.path)!r} runs through tensor {'/'.join(s.path[:i])!r}"
                )
