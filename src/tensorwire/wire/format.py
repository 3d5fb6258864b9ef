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
from typing import Any

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
from tensorwire.wire.tensors import TensorPath

MAGIC = b"TWIR"
VERSION = 1
PREFIX = struct.Struct("<4sBBHIIQ")
PREFIX_SIZE = PREFIX.size  # 24
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
    order: str  # "C" or "F"
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


@dataclass(frozen=True)
class MessagePlan:
    """A validated header: what the body holds and where."""

    kind: str
    meta: dict[str, Any]
    t0: float | None
    tensors: list[TensorSpec]
    digests: bool
    header_length: int
    body_length: int

    @property
    def nbytes(self) -> int:
        """Decoded size of all tensors, bytes."""
        return sum(t.nbytes for t in self.tensors)

    @property
    def codec_label(self) -> str:
        return codec_label(t.codecs for t in self.tensors)

    @property
    def wire_nbytes(self) -> int:
        """Size of the whole message on the wire, bytes."""
        return PREFIX_SIZE + self.header_length + self.body_length


@dataclass
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
    return PREFIX.pack(MAGIC, VERSION, flags, 0, len(header), header_check(header), body_length)


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


def build_header(
    kind: str, meta: dict[str, Any], t0: float | None, tensors: list[dict[str, Any]]
) -> bytes:
    """Pack the header map; ``meta`` must hold only msgpack types (numpy scalars allowed)."""
    _check_str_keys(meta, "meta")
    doc: dict[str, Any] = {"kind": kind, "meta": meta, "tensors": tensors}
    if t0 is not None:
        doc["t0"] = t0
    try:
        return msgpack.packb(doc, default=_meta_default, use_bin_type=True)
    except (TypeError, ValueError, OverflowError) as exc:
        raise TypeError(
            f"meta cannot be sent: {exc} (use str, int, float, bool, bytes, lists, dicts)"
        ) from None


def _check_str_keys(obj: Any, where: str) -> None:
    """Decoders accept only string map keys (msgpack's strict_map_key): refuse others here."""
    if isinstance(obj, dict):
        for key, value in obj.items():
            if not isinstance(key, str):
                raise TypeError(f"{where} has the key {key!r}; map keys in meta must be str")
            _check_str_keys(value, f"{where}.{key}")
    elif isinstance(obj, (list, tuple)):
        for value in obj:
            _check_str_keys(value, where)


def _meta_default(obj: Any) -> Any:
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, tuple):
        return list(obj)
    raise TypeError(f"{type(obj).__name__} is not a msgpack type")


def verify_header(data: bytes | memoryview, prefix: Prefix) -> None:
    """Raise ``HeaderCheckMismatch`` unless the header bytes match the prefix's check."""
    if header_check(data) != prefix.header_check:
        raise HeaderCheckMismatch("header check mismatch: the header (or prefix) bytes are corrupt")


def parse_header(data: bytes | memoryview, prefix: Prefix, limits: Limits) -> MessagePlan:
    """Unpack a verified header; every inconsistency raises a ``WireError`` subclass."""
    try:
        doc = msgpack.unpackb(data, raw=False, strict_map_key=True, use_list=True)
    except Exception as exc:  # msgpack raises several unrelated types on bad input
        raise MalformedHeader(f"header is not valid msgpack: {exc}") from None
    if not isinstance(doc, dict):
        raise MalformedHeader(f"header must be a map, got {type(doc).__name__}")
    kind = doc.get("kind", "data")
    meta = doc.get("meta", {})
    t0 = doc.get("t0")
    entries = doc.get("tensors", [])
    if not isinstance(kind, str):
        raise MalformedHeader("header field 'kind' must be a string")
    if not isinstance(meta, dict):
        raise MalformedHeader("header field 'meta' must be a map")
    if t0 is not None and not isinstance(t0, (int, float)):
        raise MalformedHeader("header field 't0' must be a number")
    if not isinstance(entries, list):
        raise MalformedHeader("header field 'tensors' must be an array")
    if len(entries) > limits.max_tensors:
        raise MessageTooLarge(f"{len(entries)} tensors exceed the limit of {limits.max_tensors}")

    specs = [_parse_tensor(i, e, limits) for i, e in enumerate(entries)]
    _check_paths(specs)
    digest_bytes = DIGEST_SIZE * len(specs) if prefix.digests else 0
    body = sum(s.size for s in specs) + digest_bytes
    if body != prefix.body_length:
        # The prefix is outside the header check, so this is where a corrupt one shows.
        raise HeaderCheckMismatch(
            f"tensors account for {body} body bytes but the prefix declares {prefix.body_length}"
        )
    decoded = sum(s.nbytes for s in specs)
    scratch = max((s.scratch_bytes for s in specs), default=0)
    if decoded + scratch > limits.max_message_bytes:
        raise MessageTooLarge(
            f"decoding needs {decoded + scratch} bytes ({decoded} decoded + {scratch} scratch), "
            f"over the limit of {limits.max_message_bytes} bytes"
        )
    return MessagePlan(
        kind=kind,
        meta=meta,
        t0=float(t0) if t0 is not None else None,
        tensors=specs,
        digests=prefix.digests,
        header_length=prefix.header_length,
        body_length=prefix.body_length,
    )


def _is_count(value: Any) -> bool:
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


def _check_paths(specs: list[TensorSpec]) -> None:
    seen = {s.path for s in specs}
    if len(seen) != len(specs):
        raise MalformedHeader("two tensors have the same name")
    for s in specs:
        for i in range(1, len(s.path)):
            if s.path[:i] in seen:
                raise MalformedHeader(
                    f"name {'/'.join(s.path)!r} runs through tensor {'/'.join(s.path[:i])!r}"
                )
