"""The sparse payload of ``topk`` and ``dgc``: chosen entries as values and 16-bit index gaps.

Payload (little-endian)::

    offset          size            field
    0               8   u64         n       elements of the tensor, n < 2**32
    8               4   u32         k       entries sent, k <= n
    12              4               zero    reserved, must be 0
    16              k × itemsize    values  the entries, in the tensor's dtype, in index order
    16 + k·itemsize 2 × k   u16[k]  gaps    gap_i = idx_i - idx_(i-1) - 1, with idx_(-1) = -1

The payload is exactly ``16 + k × (itemsize + 2)`` bytes. The indices
``idx_i = Σ_(j<=i) (gap_j + 1) - 1`` increase strictly by construction; the last must be
below ``n``. Decoding writes zeros, then ``values[i]`` at ``idx_i``. Where two chosen
entries are more than 65536 apart, the encoder bridges the gap with zero-valued entries
every 65536 positions (at most ``n / 65536`` of them, counted in ``k``), so two bytes
always index an entry: a quarter fewer than absolute u32 indices.
"""

from __future__ import annotations

import struct

import numpy as np

from tensorwire.codecs.lossy.base import payload_length, read_fields
from tensorwire.errors import CodecDataError

HEADER = struct.Struct("<QI4x")
"""n (u64), k (u32), four zero bytes: 16 bytes, so values start aligned."""

MAX_ELEMENTS = (1 << 32) - 1
_SPAN = 1 << 16  # positions one u16 gap reaches


def pack_sparse(n: int, indices: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Return the sparse payload for the strictly increasing ``indices`` among ``n`` elements."""
    if n > MAX_ELEMENTS:
        raise ValueError(f"sparse payloads index at most {MAX_ELEMENTS} elements, got {n}")
    gaps = np.diff(indices, prepend=-1) - 1
    bridges = gaps // _SPAN  # zero-valued entries needed before each chosen one
    if bridges.any():
        ends = np.cumsum(bridges + 1) - 1  # where each chosen entry lands
        filled = np.zeros(ends[-1] + 1, dtype=values.dtype)
        filled[ends] = values
        values = filled
        stored = np.full(filled.size, _SPAN - 1, dtype=np.int64)
        stored[ends] = gaps % _SPAN
        gaps = stored
    k = values.size
    payload = np.empty(HEADER.size + values.nbytes + 2 * k, dtype=np.uint8)
    HEADER.pack_into(payload.data, 0, n, k)
    payload[HEADER.size : HEADER.size + values.nbytes] = values.view(np.uint8)
    payload[HEADER.size + values.nbytes :].view("<u2")[:] = gaps
    return payload


def parse_sparse(
    src: memoryview, dtype: np.dtype, what: str
) -> tuple[int, tuple[np.ndarray, np.ndarray, str]]:
    """Check a sparse payload's header and length; return ``(n, (gaps, values, what))``."""
    n, k = read_fields(src, HEADER, what)
    if src[12:16] != b"\0\0\0\0":
        raise CodecDataError(f"a {what} payload's reserved bytes are not zero")
    if k > n:
        raise CodecDataError(f"a {what} payload sends {k} entries of a {n}-element tensor")
    values_size = k * dtype.itemsize
    payload_length(src, HEADER.size + values_size + 2 * k, what)
    values = np.frombuffer(src, dtype=dtype, count=k, offset=HEADER.size)
    gaps = np.frombuffer(src, dtype="<u2", offset=HEADER.size + values_size)
    return n, (gaps, values, what)


def scatter(parsed: tuple[np.ndarray, np.ndarray, str], target: np.ndarray) -> None:
    """Fill ``target`` with zeros and the parsed entries; raise if an index is out of range."""
    gaps, values, what = parsed
    indices = np.cumsum(gaps, dtype=np.int64)  # k < 2**32 gaps below 2**16: no overflow
    indices += np.arange(gaps.size, dtype=np.int64)
    if indices.size and indices[-1] >= target.size:
        raise CodecDataError(f"a {what} payload indexes element {indices[-1]} of {target.size}")
    target[...] = 0
    target[indices] = values
