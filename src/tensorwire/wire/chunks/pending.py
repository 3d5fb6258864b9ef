"""A message being reassembled from its chunks, and what is handed out of one that stopped.

What a message holds is bounded by the bytes that arrived, never by what a chunk declares
(``count`` and ``total_length`` are the sender's word):

- sparse: while less than 1/8 of a message's ``total_length`` has arrived, it is held as
  copies of its chunks: those from chunk 0 on without a gap in one buffer whose capacity
  doubles, the others in a dict by index. That is at most 2x its arrived payload bytes, plus
  ``_ENTRY_OVERHEAD`` (256) bytes per chunk in the dict; missing chunks are the gaps between
  the held indices, reported as (start, stop) ranges;
- dense: at 1/8 it gets its one ``total_length``-byte buffer (the copies move in once) and a
  bitmap of ``count / 8 <= total_length / 8`` bytes, and is written in place from then on:
  at most 9x its arrived payload bytes. So a pending message holds at most 9x its arrived
  payload bytes + 256 bytes per held chunk + ``_MESSAGE_OVERHEAD`` (2 KiB), whatever it
  declares; that footprint is what a reassembler's budgets count.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator
from typing import Any

import numpy as np

_PROMOTE_AT = 8  # a message gets its whole buffer once 1/_PROMOTE_AT of its bytes arrived
_ENTRY_OVERHEAD = 256  # bytes charged per chunk held as a copy: its dict entry and objects
_MESSAGE_OVERHEAD = 2048  # bytes charged per pending message: its objects and keys
_GAP_SCAN = 1 << 20  # chunk indices per numpy pass over a bitmap (bounds its temporaries)
_EMPTY = np.empty(0, np.uint8)


class PartialMessage:
    """A message whose chunks stopped coming (or that was evicted to make room).

    ``missing`` holds its lost (byte offset, byte length) ranges, one per gap between the
    runs of chunks that came, in order. ``data`` is the whole message (``total_length``
    bytes, uint8; the bytes in the gaps are unspecified), made on first access when less than
    1/8 of it had arrived, so a dropped message that declared a huge size costs only what
    arrived until a caller reads its bytes.
    """

    __slots__ = ("_data", "_pieces", "message_id", "missing", "source", "total_length")

    def __init__(
        self,
        source: Hashable,
        message_id: int,
        total_length: int,
        missing: list[tuple[int, int]],
        data: np.ndarray | None,
        pieces: list[tuple[int, Any]],
    ) -> None:
        self.source = source
        self.message_id = message_id
        self.total_length = total_length
        self.missing = missing
        self._data = data
        self._pieces = pieces  # (byte offset, bytes) of what arrived, while ``_data`` is None

    @property
    def data(self) -> np.ndarray:
        """The whole message as one contiguous uint8 array of ``total_length`` bytes."""
        if self._data is None:
            data = np.zeros(self.total_length, np.uint8)  # calloc: untouched gaps cost no RSS
            for offset, piece in self._pieces:
                data[offset : offset + len(piece)] = np.frombuffer(piece, np.uint8)
            self._data, self._pieces = data, []
        return self._data

    def __repr__(self) -> str:
        return (
            f"PartialMessage(source={self.source!r}, message_id={self.message_id:#x}, "
            f"total_length={self.total_length}, missing={len(self.missing)} ranges)"
        )


def _bit_gaps(bits: bytearray, count: int, start: int) -> Iterator[tuple[int, int]]:
    """The runs of clear bits at indices [start, count) of a little-endian bitmap, as
    [start, stop), in order; the bits below ``start`` must be set."""
    carried: int | None = None  # start of a gap that reaches the end of the previous pass
    for lo in range(start - start % 8, count, _GAP_SCAN):
        hi = min(lo + _GAP_SCAN, count)
        packed = np.frombuffer(bits, np.uint8, -(-(hi - lo) // 8), lo // 8)
        clear = np.unpackbits(packed, count=hi - lo, bitorder="little") == 0
        edges = [lo, *(np.flatnonzero(clear[1:] != clear[:-1]) + lo + 1).tolist(), hi]
        if carried is not None and not clear[0]:
            yield carried, lo
            carried = None
        for k in range(0 if clear[0] else 1, len(edges) - 1, 2):
            a, b = edges[k], edges[k + 1]
            if carried is not None:  # only the first run of this pass can continue it
                a, carried = carried, None
            if b == hi < count:
                carried = a
            else:
                yield a, b


class Pending:
    """A message being reassembled: which chunks came, and their bytes.

    Sparse (less than 1/8 arrived): chunks ``[0, lead)`` are copied into ``head`` (its
    capacity doubles), the others into ``pieces``. Dense: ``data`` is the whole message,
    written in place, and ``bits`` has a bit per chunk index (set: received); ``lead`` is
    then only advanced when asked for.
    """

    __slots__ = (
        "arrived",
        "bits",
        "charged",
        "chunk_payload",
        "count",
        "data",
        "head",
        "head_len",
        "last_seen",
        "lead",
        "message_id",
        "n_received",
        "pieces",
        "pieces_bytes",
        "source",
        "total",
    )

    def __init__(
        self, source: Hashable, message_id: int, count: int, total: int, now: float
    ) -> None:
        self.source = source
        self.message_id = message_id
        self.count = count
        self.total = total
        self.chunk_payload: int | None = None
        self.last_seen = now
        self.n_received = 0
        self.arrived = 0  # payload bytes of the distinct chunks received
        self.charged = 0  # bytes this message is charged in the budgets
        self.lead = 0  # chunks [0, lead) have all come
        self.head = _EMPTY
        self.head_len = 0
        self.pieces: dict[int, bytes] = {}
        self.pieces_bytes = 0
        self.data: np.ndarray | None = None
        self.bits: bytearray | None = None

    def add(self, index: int, offset: int, payload: memoryview) -> int | None:
        """Record chunk ``index`` and keep its bytes; return by how many bytes that changed
        :meth:`footprint`, or None if the chunk had come already."""
        n = len(payload)
        bits = self.bits
        if bits is not None and self.data is not None:  # the hot path of a big message
            if bits[index >> 3] >> (index & 7) & 1:
                return None
            bits[index >> 3] |= 1 << (index & 7)
            self.data[offset : offset + n] = payload
            self.n_received += 1
            self.arrived += n
            return 0
        if index < self.lead or index in self.pieces:
            return None
        before = self.footprint()
        self.n_received += 1
        self.arrived += n
        if index == self.lead:  # extends the run from chunk 0: append it and what it joins
            self._append_head(payload)
            lead = index + 1
            while lead in self.pieces:
                piece = self.pieces.pop(lead)
                self.pieces_bytes -= len(piece)
                self._append_head(memoryview(piece))
                lead += 1
            self.lead = lead
        else:
            self.pieces[index] = bytes(payload)
            self.pieces_bytes += n
        if self.arrived * _PROMOTE_AT >= self.total:
            self._promote()
        return self.footprint() - before

    def _append_head(self, piece: memoryview) -> None:
        end = self.head_len + len(piece)
        if end > len(self.head):
            grown = np.empty(min(self.total, max(2 * len(self.head), end)), np.uint8)
            grown[: self.head_len] = self.head[: self.head_len]
            self.head = grown
        self.head[self.head_len : end] = piece
        self.head_len = end

    def _promote(self) -> None:
        """Move the held copies into one ``total``-byte buffer; write in place from now on."""
        size = self.chunk_payload or 0
        data = np.empty(self.total, np.uint8)
        data[: self.head_len] = self.head[: self.head_len]
        bits = bytearray(-(-self.count // 8))
        full, rest = divmod(self.lead, 8)
        bits[:full] = b"\xff" * full
        if rest:
            bits[full] = (1 << rest) - 1
        for j, piece in self.pieces.items():
            data[j * size : j * size + len(piece)] = np.frombuffer(piece, np.uint8)
            bits[j >> 3] |= 1 << (j & 7)
        self.data, self.bits = data, bits
        self.head, self.head_len, self.pieces, self.pieces_bytes = _EMPTY, 0, {}, 0

    def footprint(self) -> int:
        """Bytes this message holds: its data or copies, and its bookkeeping (estimated)."""
        if self.data is not None and self.bits is not None:
            return self.data.nbytes + len(self.bits) + _MESSAGE_OVERHEAD
        held = self.head.nbytes + self.pieces_bytes
        return held + _ENTRY_OVERHEAD * len(self.pieces) + _MESSAGE_OVERHEAD

    def _advance_lead(self) -> int:
        """Move ``lead`` past the chunks received since (dense); each bit is passed once."""
        bits, lead = self.bits, self.lead
        if bits is not None:
            while lead < self.count:
                byte = bits[lead >> 3]
                if byte == 0xFF and not lead & 7:
                    lead += 8
                elif byte >> (lead & 7) & 1:
                    lead += 1
                else:
                    break
            self.lead = lead = min(lead, self.count)
        return lead

    def gaps(self) -> Iterator[tuple[int, int]]:
        """The runs of missing chunk indices, as [start, stop), in order."""
        lead = self._advance_lead()
        if self.bits is not None:
            yield from _bit_gaps(self.bits, self.count, lead)
            return
        prev = lead
        for index in sorted(self.pieces):
            if index > prev:
                yield prev, index
            prev = index + 1
        if prev < self.count:
            yield prev, self.count

    def leading_bytes(self) -> memoryview:
        buf = self.head if self.data is None else self.data
        end = min(self._advance_lead() * (self.chunk_payload or 0), self.total)
        return buf.data[:end]

    def to_partial(self) -> PartialMessage:
        size = self.chunk_payload or 0
        missing = []
        for start, stop in self.gaps():
            offset = start * size
            missing.append((offset, min(stop * size, self.total) - offset))
        pieces: list[tuple[int, Any]] = []
        if self.data is None:
            pieces.append((0, self.head[: self.head_len]))
            pieces.extend((j * size, piece) for j, piece in self.pieces.items())
        return PartialMessage(self.source, self.message_id, self.total, missing, self.data, pieces)
