"""Turn a mapping of tensors into a header plus a list of buffers, without copying raw data."""

from __future__ import annotations

import struct
import time
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import xxhash

from tensorwire.wire.codec import CodecSelector
from tensorwire.wire.dtypes import name_of_dtype
from tensorwire.wire.format import DIGEST_SIZE, build_header, codec_label, pack_prefix
from tensorwire.wire.tensors import flatten, to_numpy

_U64 = struct.Struct("<Q")

SEGMENT_BYTES = 1 << 20
"""Pieces a big tensor is hashed and sent in: small enough to stay in cache between the two."""


def byte_view(arr: np.ndarray, order: str) -> memoryview:
    """A flat uint8 memoryview of a contiguous array's memory, in ``order``, without a copy."""
    return memoryview(arr.reshape(-1, order=order).view(np.uint8))


def _as_byte_view(buf: Any) -> memoryview:
    mv = memoryview(buf)
    return mv if mv.format == "B" and mv.ndim == 1 else mv.cast("B")


class EncodedMessage:
    """An encoded message: ``head`` (prefix + header) and one buffer per tensor.

    The per-tensor digests are computed while the message is walked by :meth:`segments`
    (cache-hot, just before each piece is sent) and kept, so a broadcast hashes once.
    Buffers of raw tensors alias the caller's arrays: keep those unchanged until sent.
    """

    def __init__(
        self,
        head: bytes,
        buffers: list[memoryview],
        digests: bool,
        raw_nbytes: int,
        encode_s: float,
        t0: float,
        codec_label: str = "raw",
    ) -> None:
        self.head = head
        self.buffers = buffers
        self.digests = digests
        self.raw_nbytes = raw_nbytes
        self.encode_s = encode_s
        self.t0 = t0
        self.codec_label = codec_label  # e.g. "raw", "lz4", "lz4+raw": what the tensors used
        self.nbytes = (
            len(head)
            + sum(len(b) for b in buffers)
            + (DIGEST_SIZE * len(buffers) if digests else 0)
        )
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
        for i, buf in enumerate(self.buffers):
            out.append(buf)
            if self.digests:
                out.append(self._digest(i))
        return out

    def to_bytes(self) -> bytes:
        """The whole message as one ``bytes`` object (one copy of every buffer)."""
        return b"".join(self.frames())


def _contiguous(arr: np.ndarray) -> tuple[np.ndarray, str]:
    if arr.dtype.byteorder == ">":
        arr = arr.astype(arr.dtype.newbyteorder("<"))
    if arr.flags.c_contiguous:
        return arr, "C"
    if arr.flags.f_contiguous:
        return arr, "F"
    return np.ascontiguousarray(arr), "C"  # the one copy a strided view costs


def encode_message(
    tensors: Mapping[str, Any] | None = None,
    meta: Mapping[str, Any] | None = None,
    *,
    codecs: CodecSelector | None = None,
    checksum: bool = True,
    kind: str = "data",
    t0: float | None = None,
) -> EncodedMessage:
    """Encode a (nested) mapping of names to numpy arrays / torch tensors plus metadata.

    ``codecs`` picks each tensor's codec chain (see ``tensorwire.codecs.resolve_codecs``);
    a chain whose output is not smaller than the raw bytes is dropped and the tensor goes raw.
    ``checksum`` appends an xxh3-64 digest to every tensor's bytes. ``t0`` is the send
    time (seconds since the epoch) put in the header; default now (fix it for test vectors).
    """
    t0 = time.time() if t0 is None else t0
    start = time.perf_counter()
    entries: list[dict[str, Any]] = []
    buffers: list[memoryview] = []
    raw_nbytes = 0
    for path, leaf in flatten(tensors or {}):
        arr, order = _contiguous(to_numpy(leaf, path))
        dtype_name = name_of_dtype(arr.dtype)
        raw = byte_view(arr, order)
        raw_nbytes += arr.nbytes
        entry: dict[str, Any] = {
            "name": list(path),
            "dtype": dtype_name,
            "shape": list(arr.shape),
            "order": order,
            "nbytes": arr.nbytes,
        }
        chain = list(codecs("/".join(path), arr)) if codecs is not None and arr.nbytes else []
        data = raw
        sizes: list[int] = []
        for codec in chain:
            data = _as_byte_view(codec.encode(data))
            sizes.append(len(data))
        if chain and len(data) < len(raw):
            entry["codecs"] = [c.get_config() for c in chain]
            if len(chain) > 1:
                entry["sizes"] = sizes[:-1]
        else:
            data = raw
        entry["size"] = len(data)
        entries.append(entry)
        buffers.append(data)
    header = build_header(kind, dict(meta or {}), t0, entries)
    body_length = sum(len(b) for b in buffers) + (DIGEST_SIZE * len(buffers) if checksum else 0)
    head = pack_prefix(header, body_length, checksum) + header
    return EncodedMessage(
        head,
        buffers,
        checksum,
        raw_nbytes,
        time.perf_counter() - start,
        t0,
        codec_label(e.get("codecs", ()) for e in entries),
    )
