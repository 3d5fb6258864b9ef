"""The small-message path: a whole message whose header repeats a known layout, its
tensors raw and named flat, read in one function with :func:`decode_message`'s checks."""

from __future__ import annotations

import struct
import time
from collections.abc import Mapping

import msgpack
import numpy as np
import xxhash

from tensorwire.wire.decoder.message import Message
from tensorwire.wire.decoder.tensor import output_array
from tensorwire.wire.encoder import byte_view, copy_bytes
from tensorwire.wire.format import (
    DIGEST_SIZE,
    FLAG_DIGESTS,
    KNOWN_FLAGS,
    MAGIC,
    PREFIX,
    PREFIX_SIZE,
    VERSION,
    Limits,
    known_header,
    known_meta_bytes,
    meta_cut,
)
from tensorwire.wire.plans import KNOWN_LAYOUTS, META_LAYOUTS, SEEN_ONCE, KnownLayout
from tensorwire.wire.tensors import TensorPath

_U64 = struct.Struct("<Q")
_F64 = struct.Struct(">d")  # msgpack float 64, big-endian


def decode_known(
    mv: memoryview, limits: Limits, out: Mapping[TensorPath, np.ndarray] | None
) -> tuple[Message, int] | None:
    """The first message in ``mv`` and its length, when it is whole there, its header is one
    :func:`~tensorwire.wire.format.known_header` knows and its tensors are raw and named
    flat; its arrays are copied out (into ``out``'s where they match). None for any other
    message, and for anything wrong: :func:`decode_message`'s checks then say what.

    The small-message path: the checks are :func:`decode_message`'s, in one function. A
    header that repeats one seen before but for its ``t0`` is read from its cached
    :class:`~tensorwire.wire.plans.KnownLayout` (one lookup instead of a parse).
    """
    start = time.perf_counter()
    magic, version, flags, reserved, hlen, hcheck, blen = PREFIX.unpack_from(mv)
    if magic != MAGIC or version != VERSION or flags & ~KNOWN_FLAGS or reserved:
        return None
    if hlen > limits.max_header_bytes or blen > limits.max_message_bytes:
        return None
    end_header = PREFIX_SIZE + hlen
    total = end_header + blen
    if len(mv) < total:
        return None
    if xxhash.xxh3_64_intdigest(mv[PREFIX_SIZE:end_header]) & 0xFFFFFFFF != hcheck:
        return None
    key = bytes(mv[PREFIX_SIZE : end_header - 8])
    layout = KNOWN_LAYOUTS.get(key)
    meta = None
    if layout is None:  # a meta beside tensors, cut out: see META_LAYOUTS
        cut = meta_cut(key)
        layout = None if cut is None else META_LAYOUTS.get(key[: cut[0]] + key[cut[1] :])
        if layout is None:
            return _decode_first_known(mv, limits, out, start, flags, end_header, total)
        assert cut is not None
        try:  # exactly one map, or the split is not the header's parse
            meta = msgpack.unpackb(key[cut[0] : cut[1]])
        except Exception:
            return None
        if type(meta) is not dict:
            return None
    if layout.limits is not limits:  # a race only checks twice
        if not layout.table.fits(limits):
            return None
        layout.limits = limits
    digests = flags & FLAG_DIGESTS
    if blen != (layout.digested_nbytes if digests else layout.encoded_nbytes):
        return None
    tensors = {}
    offset = end_header
    for name, path, size, dtype, shape in layout.tensors:
        end = offset + size
        encoded = mv[offset:end]
        if digests:
            if xxhash.xxh3_64_intdigest(encoded) != _U64.unpack_from(mv, end)[0]:
                return None
            end += DIGEST_SIZE
        arr = None if out is None else out.get(path)
        if (
            type(arr) is not np.ndarray
            or arr.shape != shape
            or arr.dtype != dtype
            or not (flags_ := arr.flags).writeable
            or not flags_.c_contiguous
        ):
            arr = np.empty(shape, dtype)
        # C-ordered, of a buffer kind, not empty: its layout
        copy_bytes(arr.data.cast("B"), encoded)
        tensors[name] = arr
        offset = end
    if meta is None:
        meta = {} if layout.meta is None else msgpack.unpackb(layout.meta)
    msg = Message(
        tensors,
        meta,
        layout.kind,
        _F64.unpack_from(mv, end_header - 8)[0],
        layout.nbytes,
        total,
        time.perf_counter() - start,
        0.0,
        len(tensors),
        layout.codec_label,
    )
    return msg, total


def _decode_first_known(
    mv: memoryview,
    limits: Limits,
    out: Mapping[TensorPath, np.ndarray] | None,
    start: float,
    flags: int,
    end_header: int,
    total: int,
) -> tuple[Message, int] | None:
    """:func:`decode_known` of a message whose prefix and header check passed and whose
    header has no layout yet (which it gets here, when it may have one)."""
    header = bytes(mv[PREFIX_SIZE:end_header])
    known = known_header(header)
    if known is None:
        return None
    kind, meta, t0, span, table = known
    names = table.flat_names
    digests = flags & FLAG_DIGESTS
    specs = table.specs
    if table.compressed or names is None or not table.fits(limits):
        return None
    if table.encoded_nbytes + (DIGEST_SIZE * len(specs) if digests else 0) != total - end_header:
        return None
    arrays = []
    offset = end_header
    for spec in specs:
        end = offset + spec.size
        encoded = mv[offset:end]
        if digests:
            if xxhash.xxh3_64_intdigest(encoded) != _U64.unpack_from(mv, end)[0]:
                return None
            end += DIGEST_SIZE
        arr = output_array(spec, out)
        copy_bytes(byte_view(arr, spec.order), encoded)
        arrays.append(arr)
        offset = end
    if KnownLayout.allowed(table):
        key = header[:-8]
        layout = None
        if not meta:
            layout = KnownLayout(kind, table)
        elif not specs:  # meta alone (acknowledgements, control): kept when it comes again
            if SEEN_ONCE.get(key):
                layout = KnownLayout(kind, table, known_meta_bytes(header, span))
            else:
                SEEN_ONCE.put(key, True, len(key))
        elif (cut := meta_cut(key)) is not None:  # meta beside tensors: it changes every time
            stripped, kept = key[: cut[0]] + key[cut[1] :], KnownLayout(kind, table)
            META_LAYOUTS.put(stripped, kept, len(stripped) + kept.cost)
        if layout is not None:
            KNOWN_LAYOUTS.put(key, layout, len(header) + layout.cost)
    msg = Message(
        dict(zip(names, arrays, strict=True)),
        meta,
        kind,
        t0,
        table.nbytes,
        total,
        time.perf_counter() - start,
        0.0,
        len(arrays),
        table.codec_label,
    )
    return msg, total
