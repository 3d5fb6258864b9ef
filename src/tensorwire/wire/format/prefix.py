"""The 24-byte prefix: packed, parsed and checked against ``Limits``, and the header's check."""

from __future__ import annotations

from dataclasses import dataclass, field

import xxhash

from tensorwire.errors import (
    BadMagic,
    HeaderCheckMismatch,
    HeaderTooLarge,
    MalformedHeader,
    MessageTooLarge,
    UnsupportedVersion,
)
from tensorwire.wire.format.layout import FLAG_DIGESTS, KNOWN_FLAGS, MAGIC, PREFIX, VERSION, Limits


@dataclass(slots=True)
class Prefix:
    flags: int
    header_length: int
    header_check: int
    body_length: int
    digests: bool = field(init=False)

    def __post_init__(self) -> None:
        self.digests = bool(self.flags & FLAG_DIGESTS)


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


def verify_header(data: bytes | memoryview, prefix: Prefix) -> None:
    """Raise ``HeaderCheckMismatch`` unless the header bytes match the prefix's check."""
    if header_check(data) != prefix.header_check:
        raise HeaderCheckMismatch("header check mismatch: the header (or prefix) bytes are corrupt")
