"""FlightData as the hub reads and writes it on the gRPC wire, without pyarrow's server.

A FlightData is a protobuf message (Flight.proto): ``flight_descriptor`` (field 1, a
FlightDescriptor: ``type`` 1, ``cmd`` 2, ``path`` 3), ``data_header`` (2, an Arrow IPC
``Message`` flatbuffer), ``app_metadata`` (3) and ``data_body`` (1000, the IPC body). The hub
reads only what ``docs/transports/flight.md`` lets a client send: a descriptor, control
messages in ``app_metadata``, and the schema and record batches of :data:`SCHEMA`, whose
bytes it takes as a view of the received message (:func:`batch_bytes`); anything else in
a header or body is a ``WireError``, never an exception of the parser's own.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from tensorwire.errors import WireError
from tensorwire.transports.flight.batches import batch_of
from tensorwire.transports.flight.options import SCHEMA
from tensorwire.wire import EncodedMessage

CMD = 2  # FlightDescriptor.DescriptorType
PATH = 1
_SCHEMA_HEADER = 1  # the IPC MessageHeader union's members the hub takes
_RECORD_BATCH = 3


@dataclass(frozen=True)
class Descriptor:
    type: int = 0
    cmd: bytes = b""
    path: tuple[bytes, ...] = ()


@dataclass
class FlightData:
    descriptor: Descriptor | None = None
    header: memoryview | None = None
    metadata: memoryview | None = None
    body: memoryview = field(default_factory=lambda: memoryview(b""))


def _varint(buf: memoryview, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(buf) or shift > 63:
            raise WireError("FlightData: a varint runs past the message")
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, pos
        shift += 7


def _fields(buf: memoryview) -> Any:
    """(field number, value) of each field: an int for varints, a view for bytes; fixed
    widths are skipped, groups refused."""
    pos = 0
    while pos < len(buf):
        key, pos = _varint(buf, pos)
        number, kind = key >> 3, key & 7
        if kind == 0:
            value, pos = _varint(buf, pos)
            yield number, value
        elif kind == 2:
            size, pos = _varint(buf, pos)
            if size > len(buf) - pos:
                raise WireError(f"FlightData: field {number} runs past the message")
            yield number, buf[pos : pos + size]
            pos += size
        elif kind in (1, 5):
            pos += 8 if kind == 1 else 4
            if pos > len(buf):
                raise WireError(f"FlightData: field {number} runs past the message")
        else:
            raise WireError(f"FlightData: field {number} has wire type {kind}")


def _descriptor(buf: memoryview) -> Descriptor:
    kind, cmd, path = 0, b"", []
    for number, value in _fields(buf):
        if number == 1 and isinstance(value, int):
            kind = value
        elif number == 2 and isinstance(value, memoryview):
            cmd = bytes(value)
        elif number == 3 and isinstance(value, memoryview):
            path.append(bytes(value))
    return Descriptor(kind, cmd, tuple(path))


def parse(raw: bytes) -> FlightData:
    """The FlightData in ``raw`` (views of it, not copies); ``WireError`` if it is not one."""
    out = FlightData()
    for number, value in _fields(memoryview(raw)):
        if not isinstance(value, memoryview):
            continue
        if number == 1:
            out.descriptor = _descriptor(value)
        elif number == 2:
            out.header = value
        elif number == 3:
            out.metadata = value
        elif number == 1000:
            out.body = value
    return out


def _uvarint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _key_length(number: int, size: int) -> bytes:
    """The key of length-delimited field ``number`` and the length ``size``."""
    return _uvarint((number << 3) | 2) + _uvarint(size)


def _ipc_parts(buf: pa.Buffer) -> tuple[memoryview, memoryview]:
    """An encapsulated IPC message (pyarrow's ``serialize()``) as (flatbuffer, body)."""
    view = memoryview(buf).cast("B")
    (size,) = struct.unpack_from("<i", view, 4)  # after the 0xFFFFFFFF continuation
    return view[8 : 8 + size], view[8 + size :]


def metadata_frame(meta: bytes) -> bytes:
    """A FlightData carrying ``meta`` in ``app_metadata`` and nothing else."""
    return _key_length(3, len(meta)) + meta


SCHEMA_FRAME = (lambda header: _key_length(2, len(header)) + bytes(header))(
    _ipc_parts(SCHEMA.serialize())[0]
)
"""The FlightData that opens a downlink: :data:`SCHEMA` in ``data_header``."""


def batch_frame(batch: pa.RecordBatch) -> bytes:
    """A FlightData carrying ``batch``, as pyarrow serializes it (tests compare with it)."""
    header, body = _ipc_parts(batch.serialize())
    return b"".join((_key_length(2, len(header)), header, _key_length(1000, len(body)), body))


def _value_header_template() -> tuple[bytes, int, int]:
    """The IPC header of a one-value :data:`SCHEMA` batch, and where in it the value's length
    and the body's length sit: pyarrow's own, for two lengths, told apart."""
    a, b = (bytes(_ipc_parts(batch_of(bytes(n)).serialize())[0]) for n in (24, 40))
    spots = [i for i in range(0, len(a) - 7) if a[i : i + 8] != b[i : i + 8]]
    at = {struct.unpack_from("<q", a, i)[0]: i for i in spots}
    return a, at[24], at[32]


_TEMPLATE, _VALUE_AT, _BODY_AT = _value_header_template()


def value_frame(parts: list[Any]) -> bytes:
    """A FlightData whose batch holds one value, ``parts`` back to back: the same bytes as
    pyarrow's serialization of that batch, built with one copy of ``parts``."""
    size = sum(len(p) for p in parts)
    body = 8 + size + (-size % 8)  # the value's offsets (0, size), its bytes, padding
    header = bytearray(_TEMPLATE)
    struct.pack_into("<q", header, _VALUE_AT, size)
    struct.pack_into("<q", header, _BODY_AT, body)
    head = _key_length(2, len(header)) + header + _key_length(1000, body)
    return b"".join((head, struct.pack("<ii", 0, size), *parts, bytes(-size % 8)))


def message_frames(enc: EncodedMessage, batch_bytes: int) -> Iterator[bytes]:
    """``enc`` as FlightData of one value each, each at most ``batch_bytes`` of the message
    (the hub's sender: it copies a message once, into frames any number of peers share)."""
    parts: list[Any] = []
    size = 0
    for segment in enc.segments(batch_bytes):  # hashes each big tensor piece by piece
        for buf in segment:
            view = memoryview(buf).cast("B")
            while len(view):
                take = view[: batch_bytes - size]
                parts.append(take)
                size += len(take)
                view = view[len(take) :]
                if size == batch_bytes:
                    yield value_frame(parts)
                    parts, size = [], 0
    if parts:
        yield value_frame(parts)


# -- the IPC flatbuffer of a record batch ---------------------------------------------------


class _Table:
    """A flatbuffer table at ``pos`` of ``buf``, read with bounds checked by struct."""

    def __init__(self, buf: memoryview, pos: int) -> None:
        self.buf, self.pos = buf, pos
        (back,) = struct.unpack_from("<i", buf, pos)
        self.vtable = pos - back
        if pos < 0 or self.vtable < 0:  # struct would read from the end
            raise struct.error("offset before the buffer")
        (self.vsize,) = struct.unpack_from("<H", buf, self.vtable)

    def _at(self, slot: int) -> int:
        if 4 + 2 * slot + 2 > self.vsize:
            return 0
        (off,) = struct.unpack_from("<H", self.buf, self.vtable + 4 + 2 * slot)
        return self.pos + off if off else 0

    def scalar(self, slot: int, fmt: str, default: int = 0) -> int:
        at = self._at(slot)
        return struct.unpack_from(fmt, self.buf, at)[0] if at else default

    def ref(self, slot: int) -> int:
        """Where the table or vector in ``slot`` starts (0: absent)."""
        at = self._at(slot)
        return at + struct.unpack_from("<I", self.buf, at)[0] if at else 0


def _structs(buf: memoryview, at: int) -> list[tuple[int, int]]:
    """A vector of 16-byte structs of two int64 (FieldNode, Buffer)."""
    if not at:
        return []
    (count,) = struct.unpack_from("<I", buf, at)
    if count > 16:
        raise WireError(f"record batch lists {count} nodes or buffers; SCHEMA has 3")
    return [struct.unpack_from("<qq", buf, at + 4 + 16 * i) for i in range(count)]


def header_kind(header: memoryview) -> int:
    """The IPC message's header type: 1 a schema, 3 a record batch (others are refused)."""
    try:
        (root,) = struct.unpack_from("<I", header, 0)
        return _Table(header, root).scalar(1, "<B")
    except struct.error:
        raise WireError("data_header is not an Arrow IPC message") from None


def is_schema(header: memoryview) -> bool:
    return header_kind(header) == _SCHEMA_HEADER


def batch_bytes(header: memoryview, body: memoryview) -> memoryview:
    """The bytes a record batch of :data:`SCHEMA` carries (its values back to back), as a
    view of ``body``; ``WireError`` for any other message, or offsets out of bounds."""
    try:
        (root,) = struct.unpack_from("<I", header, 0)
        msg = _Table(header, root)
        if msg.scalar(1, "<B") != _RECORD_BATCH:
            raise WireError("data_header is an IPC message but not a record batch")
        at = msg.ref(2)
        if not at:
            raise WireError("record batch header missing")
        batch = _Table(header, at)
        rows = batch.scalar(0, "<q")
        nodes = _structs(header, batch.ref(1))
        buffers = _structs(header, batch.ref(2))
        compressed = batch.ref(3)
    except struct.error:
        raise WireError("data_header is not an Arrow IPC message") from None
    if compressed:
        raise WireError("compressed record batches are not taken (SCHEMA's are plain)")
    if len(nodes) != 1 or len(buffers) != 3:
        raise WireError(
            f"expected batches of one binary column, got {len(nodes)} columns, "
            f"{len(buffers)} buffers"
        )
    length, nulls = nodes[0]
    if nulls or length != rows or rows < 0:
        raise WireError(f"record batch has {nulls} null values in {length} of {rows} rows")
    views = []
    for offset, size in buffers:
        if offset < 0 or size < 0 or offset + size > len(body):
            raise WireError("record batch buffer out of the body's bounds")
        views.append(body[offset : offset + size])
    _, offsets, data = views
    if rows == 0:
        return memoryview(b"")
    if len(offsets) < 4 * (rows + 1):
        raise WireError("record batch offsets are shorter than its rows")
    bounds = np.frombuffer(offsets, "<i4", count=rows + 1)
    first, last = int(bounds[0]), int(bounds[-1])
    if first < 0 or last > len(data) or bool((np.diff(bounds) < 0).any()):
        raise WireError("record batch offsets go backwards or out of its data's bounds")
    return data[first:last]
