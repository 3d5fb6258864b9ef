"""Turn a mapping of tensors into a header plus a list of buffers, without copying raw data."""

from __future__ import annotations

import math
import struct
import threading
import time
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import xxhash

from tensorwire.wire.codec import CodecSelector
from tensorwire.wire.format import DIGEST_SIZE, assemble_header, pack_prefix
from tensorwire.wire.plans import BUFFER_KINDS, EncodePlan, ShapeKey, array_header, encode_plan
from tensorwire.wire.tensors import Order, TensorPath, flatten, to_numpy

_U64 = struct.Struct("<Q")
_F64 = struct.Struct(">d")  # the value of a msgpack float 64

SEGMENT_BYTES = 1 << 20
"""Pieces a big tensor is hashed and sent in: small enough to stay in cache between the two."""


def byte_view(arr: np.ndarray, order: Order) -> memoryview:
    """A flat uint8 memoryview of a contiguous array's memory, in ``order``, without a copy."""
    if order == "C" and arr.size and arr.dtype.kind in BUFFER_KINDS:
        return arr.data.cast("B")  # the cheap way; numpy's own dtypes only
    return arr.reshape(-1, order=order).view(np.uint8).data


UNLOCKED_COPY_BYTES = 64 << 10
"""A copy this big goes through numpy, which lets go of the interpreter lock while it copies
(and takes the page faults of a fresh destination): a memoryview's copy holds the lock, and
100 threads of a process receiving at once then waited for each other's copies."""


def copy_bytes(dst: memoryview, src: Any) -> None:
    """Copy the bytes of ``src`` into ``dst`` (flat byte views of the same length), the big
    ones without the interpreter lock."""
    if len(dst) < UNLOCKED_COPY_BYTES:
        dst[:] = src
    else:
        np.copyto(np.frombuffer(dst, np.uint8), np.frombuffer(src, np.uint8))


def _as_byte_view(buf: Any) -> memoryview:
    mv = memoryview(buf)
    return mv if mv.format == "B" and mv.ndim == 1 else mv.cast("B")


class EncodedMessage:
    """An encoded message: ``head`` (prefix + header) and one buffer per tensor.

    The per-tensor digests are computed while the message is walked by :meth:`segments`
    (cache-hot, just before each piece is sent) and kept, so a broadcast hashes once.
    Buffers of raw tensors alias the caller's arrays: keep those unchanged until sent.
    """

    __slots__ = (
        "_digest_cache",
        "buffers",
        "codec_label",
        "digests",
        "encode_s",
        "head",
        "nbytes",
        "raw_nbytes",
        "t0",
    )

    def __init__(
        self,
        head: bytes,
        buffers: list[memoryview],
        digests: bool,
        raw_nbytes: int,
        encode_s: float,
        t0: float,
        codec_label: str = "raw",
        body_length: int | None = None,
    ) -> None:
        self.head = head
        self.buffers = buffers
        self.digests = digests
        self.raw_nbytes = raw_nbytes
        self.encode_s = encode_s
        self.t0 = t0
        self.codec_label = codec_label  # e.g. "raw", "lz4", "lz4+raw": what the tensors used
        if body_length is None:
            body_length = sum(map(len, buffers)) + (DIGEST_SIZE * len(buffers) if digests else 0)
        self.nbytes = len(head) + body_length
        # Filled as segments() walks the message; a race only computes a digest twice.
        self._digest_cache: list[bytes | None] = [None] * len(buffers)

    def __len__(self) -> int:
        return self.nbytes

    def _digest(self, i: int) -> bytes:
        d = self._digest_cache[i]
        if d is None:
            d = _U64.pack(xxhash.xxh3_64_intdigest(self.buffers[i]))
            self._digest_cache[i] = d
        return d

    def segments(self, segment_bytes: int = SEGMENT_BYTES) -> Iterator[list[memoryview | bytes]]:
        """Yield lists of buffers, about ``segment_bytes`` each, that together are the message."""
        batch: list[memoryview | bytes] = [self.head]
        batch_len = len(self.head)
        for i, buf in enumerate(self.buffers):
            cached = self._digest_cache[i] is not None or not self.digests
            if len(buf) <= segment_bytes or cached:
                if batch_len + len(buf) > segment_bytes and batch_len:
                    yield batch
                    batch, batch_len = [], 0
                if len(buf) > segment_bytes:  # digest known: big pieces, fewer syscalls
                    yield [buf]
                else:
                    batch.append(buf)
                    batch_len += len(buf)
            else:
                if batch_len:
                    yield batch
                    batch, batch_len = [], 0
                h = xxhash.xxh3_64()
                for start in range(0, len(buf), segment_bytes):
                    piece = buf[start : start + segment_bytes]
                    h.update(piece)
                    yield [piece]
                self._digest_cache[i] = _U64.pack(h.intdigest())
            if self.digests:
                batch.append(self._digest(i))
                batch_len += DIGEST_SIZE
        if batch_len:
            yield batch

    def frames(self) -> list[memoryview | bytes]:
        """The whole message as a flat list of buffers (head, data, digest, data, digest...)."""
        out: list[memoryview | bytes] = [self.head]
        if not self.digests:
            out += self.buffers
            return out
        cache = self._digest_cache
        for i, buf in enumerate(self.buffers):
            d = cache[i]
            if d is None:
                d = cache[i] = _U64.pack(xxhash.xxh3_64_intdigest(buf))
            out.append(buf)
            out.append(d)
        return out

    def to_bytes(self) -> bytes:
        """The whole message as one ``bytes`` object (one copy of every buffer)."""
        return b"".join(self.frames())


def _contiguous(arr: np.ndarray) -> tuple[np.ndarray, Order]:
    if arr.dtype.byteorder == ">":
        arr = arr.astype(arr.dtype.newbyteorder("<"))
    if arr.flags.c_contiguous:
        return arr, "C"
    if arr.flags.f_contiguous:
        return arr, "F"
    return np.ascontiguousarray(arr), "C"  # the one copy a strided view costs


def _flat_leaves(tensors: dict[str, Any]) -> tuple[list[np.ndarray], EncodePlan] | None:
    """The arrays and plan of a flat dict of C-ordered numpy arrays with a known shape (the
    common small message: FL rounds, ping-pongs, stream batches); None for any other."""
    key = []
    arrays = []
    for name, arr in tensors.items():
        if type(arr) is not np.ndarray or not arr.flags.c_contiguous:
            return None
        key.append((name, arr.dtype, arr.shape))
        arrays.append(arr)
    plan = _FLAT_PLANS.get(tuple(key))
    if plan is None:  # first of its shape, or names / orders the general path checks
        return None
    return arrays, plan


def _remember_flat(key: ShapeKey, plan: EncodePlan) -> None:
    """Let :func:`_flat_leaves` find ``plan`` when every tensor is a top-level C-ordered
    array of a byte order and dtype the buffer protocol exports as is."""
    flat_key = []
    for path, dtype, shape, order in key:
        if len(path) != 1 or order != "C" or dtype.byteorder == ">":
            return
        if dtype.kind not in BUFFER_KINDS or not math.prod(shape):
            return
        flat_key.append((path[0], dtype, shape))
    with _FLAT_LOCK:  # lookups take no lock; evicting iterates, which another insert breaks
        if len(_FLAT_PLANS) >= _MAX_FLAT_PLANS:
            _FLAT_PLANS.pop(next(iter(_FLAT_PLANS)), None)
        _FLAT_PLANS[tuple(flat_key)] = plan


_FLAT_PLANS: dict[tuple[tuple[str, np.dtype, tuple[int, ...]], ...], EncodePlan] = {}
_MAX_FLAT_PLANS = 256
_FLAT_LOCK = threading.Lock()


def _leaves(tensors: Mapping[str, Any]) -> tuple[list[np.ndarray], ShapeKey]:
    """Every tensor as a contiguous array, and the message's shape key (``plans``)."""
    arrays: list[np.ndarray] = []
    key: list[tuple[TensorPath, np.dtype, tuple[int, ...], Order]] = []
    for path, leaf in flatten(tensors):
        arr = leaf if type(leaf) is np.ndarray else to_numpy(leaf, path)
        flags = arr.flags
        if flags.c_contiguous and arr.dtype.byteorder != ">":
            order: Order = "C"
        else:
            arr, order = _contiguous(arr)
        arrays.append(arr)
        key.append((path, arr.dtype, arr.shape, order))
    return arrays, tuple(key)


def encode_message(
    tensors: Mapping[str, Any] | None = None,
    meta: Mapping[str, Any] | None = None,
    *,
    codecs: CodecSelector | None = None,
    checksum: bool = True,
    kind: str = "data",
    t0: float | None = None,
    raw_below: float = 0,
) -> EncodedMessage:
    """Encode a (nested) mapping of names to numpy arrays / torch tensors plus metadata.

    ``codecs`` picks each tensor's codec chain (see ``tensorwire.codecs.resolve_codecs``);
    a chain whose output is not smaller than the raw bytes is dropped and the tensor goes raw.
    A selector with an ``observe(name, array, chain, encoded_nbytes, seconds=)`` method is
    told what each chain it chose achieved, and in how many wall seconds. ``checksum``
    appends an xxh3-64 digest to every tensor's bytes. ``t0`` is the send time (seconds
    since the epoch) put in the header; default now (fix it for test vectors).
    ``raw_below``: the size in bytes under which ``codecs`` always answers raw (its
    ``min_size``); a message whose tensors are all smaller does not ask it.

    The header pieces of a message shape (names, dtypes, shapes, orders) are built once and
    reused while the shape repeats (:mod:`tensorwire.wire.plans`).
    """
    t0 = time.time() if t0 is None else t0
    start = time.perf_counter()
    if tensors is None:  # meta alone (acknowledgements, control): the empty shape's plan
        tensors = {}
    flat = _flat_leaves(tensors) if type(tensors) is dict else None
    if flat is not None:
        arrays, plan = flat
        if codecs is None or plan.max_nbytes < raw_below:  # every tensor goes raw as it is
            buffers = []
            for arr in arrays:  # a loop, not a comprehension: no frame of its own (3.11)
                buffers.append(arr.data.cast("B"))
            if not meta and kind == "data" and type(t0) is float:
                return _framed_data(buffers, plan, t0, checksum, start)
            return _framed(plan.raw_tensors, "raw", buffers, plan, kind, meta, t0, checksum, start)
        key = plan.key
    else:
        arrays, key = _leaves(tensors)
        plan = encode_plan(key)
        if plan.key is key:  # just built
            _remember_flat(key, plan)
    if plan.max_nbytes < raw_below:
        codecs = None
    buffers = []
    entries: list[bytes] | None = None  # only once a tensor is compressed
    chain_ids: set[str] = set()  # first codec of each compressed tensor
    observe = getattr(codecs, "observe", None)
    for i, arr in enumerate(arrays):
        raw = byte_view(arr, key[i][3])
        nbytes = plan.nbytes[i]
        chain = list(codecs(plan.names[i], arr)) if codecs is not None and nbytes else None
        if chain:
            data = raw
            sizes: list[int] = []
            began = time.perf_counter()
            for codec in chain:
                data = _as_byte_view(codec.encode(data))
                sizes.append(len(data))
            if observe is not None:
                observe(plan.names[i], arr, chain, len(data), seconds=time.perf_counter() - began)
            if len(data) < nbytes:
                configs = [c.get_config() for c in chain]
                chain_ids.add(configs[0]["id"])
                if entries is None:
                    entries = list(plan.raw_entries)
                entries[i] = plan.entry(i, configs, sizes[:-1], len(data))
                buffers.append(data)
                continue
        buffers.append(raw)
    if entries is None:
        table, label = plan.raw_tensors, "raw"
    else:
        table = array_header(len(entries)) + b"".join(entries)
        if any(e is r for e, r in zip(entries, plan.raw_entries, strict=True)):
            chain_ids.add("raw")
        label = "+".join(sorted(chain_ids))
    return _framed(table, label, buffers, plan, kind, meta, t0, checksum, start)


def _framed(
    table: bytes,
    label: str,
    buffers: list[memoryview],
    plan: EncodePlan,
    kind: str,
    meta: Mapping[str, Any] | None,
    t0: float,
    checksum: bool,
    start: float,
) -> EncodedMessage:
    """The message around its packed ``tensors`` table and its tensors' buffers."""
    header = assemble_header(kind, dict(meta) if meta else {}, t0, table)
    body_length = sum(map(len, buffers)) + (DIGEST_SIZE * len(buffers) if checksum else 0)
    head = pack_prefix(header, body_length, checksum) + header
    return EncodedMessage(
        head,
        buffers,
        checksum,
        plan.total_nbytes,
        time.perf_counter() - start,
        t0,
        label,
        body_length,
    )


def _framed_data(
    buffers: list[memoryview], plan: EncodePlan, t0: float, checksum: bool, start: float
) -> EncodedMessage:
    """:func:`_framed` of a data message with no meta whose tensors all go raw (most small
    messages): its header is the plan's, up to the value of ``t0``."""
    head = plan.data_head
    if head is None:
        head = plan.data_head = assemble_header("data", {}, 0.0, plan.raw_tensors)[:-8]
    header = head + _F64.pack(t0)
    body_length = plan.total_nbytes + (DIGEST_SIZE * len(buffers) if checksum else 0)
    return EncodedMessage(
        pack_prefix(header, body_length, checksum) + header,
        buffers,
        checksum,
        plan.total_nbytes,
        time.perf_counter() - start,
        t0,
        "raw",
        body_length,
    )
