"""The message layout: its constants, and what a validated header describes.

Layout (all integers little-endian; ``docs/wire-format.md`` is the normative text)::

    prefix   24 bytes  magic "TWIR" | version u8 | flags u8 | reserved u16
                       | header_length u32 | header_check u32 | body_length u64
    header   header_length bytes of msgpack (a map, see ``build.build_header``)
    body     per tensor: its encoded bytes, then (flag DIGESTS) 8 bytes xxh3-64 of them
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

from tensorwire.wire.plans import TensorTable
from tensorwire.wire.tensors import Order, TensorPath

MAGIC = b"TWIR"
VERSION = 1
PREFIX = struct.Struct("<4sBBHIIQ")
PREFIX_SIZE = PREFIX.size  # 24
DIGEST_SIZE = 8
FLAG_DIGESTS = 0x01
KNOWN_FLAGS = FLAG_DIGESTS
# msgpack's options for a header: decoders accept only string map keys (strict_map_key)
UNPACK: dict[str, Any] = {"raw": False, "strict_map_key": True, "use_list": True}

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
