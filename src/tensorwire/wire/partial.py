"""Decoding a message some of whose bytes were lost (best-effort datagrams), sans-IO.

The prefix and header must have arrived: without them nothing says where a tensor starts,
so the message is lost (``TruncatedMessage``). Each tensor then is

- received whole: decoded as usual, its checksum checked (when its digest arrived too);
- raw and partly received: the received byte ranges are copied into its ``out`` array (the
  receiver's previous values, which stay in place for the lost ranges; a zero-filled array
  when there is none) and its checksum is skipped, since it cannot match;
- compressed and partly received: undecodable, so its ``out`` array is kept as it is.

The loss report gives, per tensor (``"a/b"`` path), the fraction of its bytes that did not
get this message's values: the lost fraction of a raw tensor, 1.0 for a lost compressed one.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import xxhash

from tensorwire.errors import MalformedHeader, TruncatedMessage
from tensorwire.wire.codec import CodecLookup
from tensorwire.wire.decoder.message import Message
from tensorwire.wire.decoder.tensor import (
    DEFAULT_POOL,
    check_digest,
    decode_chain,
    output_array,
    resolve_chain,
)
from tensorwire.wire.encoder import _as_byte_view, byte_view, copy_bytes
from tensorwire.wire.format import (
    DIGEST_SIZE,
    PREFIX_SIZE,
    Limits,
    TensorSpec,
    parse_header,
    parse_prefix,
    verify_header,
)
from tensorwire.wire.tensors import TensorPath, unflatten


class _Holes:
    """The missing byte ranges of a buffer, merged and sorted, for range queries."""

    def __init__(self, ranges: Iterable[tuple[int, int]], total: int) -> None:
        spans = sorted((max(o, 0), min(o + n, total)) for o, n in ranges if n > 0)
        starts: list[int] = []
        ends: list[int] = []
        for a, b in spans:
            if a >= b:
                continue
            if ends and a <= ends[-1]:
                ends[-1] = max(ends[-1], b)
            else:
                starts.append(a)
                ends.append(b)
        self.starts = np.asarray(starts, np.int64)
        self.ends = np.asarray(ends, np.int64)

    def within(self, a: int, b: int) -> tuple[np.ndarray, np.ndarray]:
        """The holes overlapping ``[a, b)``, clipped to it, as (starts, ends) arrays."""
        i0 = int(np.searchsorted(self.ends, a, side="right"))
        i1 = int(np.searchsorted(self.starts, b, side="left"))
        return np.maximum(self.starts[i0:i1], a), np.minimum(self.ends[i0:i1], b)

    def lost(self, a: int, b: int) -> int:
        """How many bytes of ``[a, b)`` are missing."""
        starts, ends = self.within(a, b)
        return int((ends - starts).sum())


def _previous_or_zeros(spec: TensorSpec, out: Mapping[TensorPath, np.ndarray] | None) -> np.ndarray:
    """The caller's array for this tensor (left as it is), else a zero-filled new one."""
    arr = output_array(spec, out)
    if out is None or arr is not out.get(spec.path):
        arr.fill(0)
    return arr


def decode_partial(
    buf: Any,
    missing_ranges: Iterable[tuple[int, int]],
    *,
    out: Mapping[TensorPath, np.ndarray] | None = None,
    limits: Limits = Limits(),
    codec_lookup: CodecLookup | None = None,
) -> tuple[Message, dict[str, float]]:
    """Decode a message held in ``buf`` whose ``missing_ranges`` ((offset, length) in bytes,
    e.g. ``PartialMessage.missing``) never arrived; return it and its loss report.

    ``buf`` is the whole message's length, whatever fills the missing ranges. ``out`` maps
    name-path tuples to the receiver's previous arrays: a tensor that lost bytes is written
    into its array there (where dtype, shape and order match) so lost ranges keep those
    values. The report maps each tensor's ``"a/b"`` path to the fraction (0.0 to 1.0) of
    its bytes this message did not deliver. Raises ``TruncatedMessage`` when bytes of the
    prefix or header are missing, and the usual ``WireError`` for a corrupt received part.
    """
    start = time.perf_counter()
    mv = _as_byte_view(buf)
    holes = _Holes(missing_ranges, len(mv))
    if len(mv) < PREFIX_SIZE or holes.lost(0, PREFIX_SIZE):
        raise TruncatedMessage(
            "the bytes holding the message prefix were lost: the whole message is lost"
        )
    prefix = parse_prefix(mv, limits)
    end_header = PREFIX_SIZE + prefix.header_length
    total = end_header + prefix.body_length
    if len(mv) != total:
        raise MalformedHeader(f"message is {total} bytes but the buffer holds {len(mv)}")
    if holes.lost(PREFIX_SIZE, end_header):
        raise TruncatedMessage(
            "bytes of the message header were lost: without it no tensor can be placed, "
            "so the whole message is lost"
        )
    verify_header(mv[PREFIX_SIZE:end_header], prefix)
    plan = parse_header(mv[PREFIX_SIZE:end_header], prefix, limits)
    chains = [resolve_chain(spec, codec_lookup) for spec in plan.tensors]
    items: list[tuple[TensorPath, np.ndarray]] = []
    loss: dict[str, float] = {}
    offset = end_header
    for spec, chain in zip(plan.tensors, chains, strict=True):
        a, b = offset, offset + spec.size
        offset = b + (DIGEST_SIZE if plan.digests else 0)
        lost = holes.lost(a, b)
        name = "/".join(spec.path)
        if not lost:
            if plan.digests and not holes.lost(b, offset):
                check_digest(spec, xxhash.xxh3_64_intdigest(mv[a:b]), mv[b:offset])
            if not chain and (out is None or spec.path not in out):
                arr = np.frombuffer(mv[a:b], spec.dtype).reshape(spec.shape, order=spec.order)
            else:
                arr = output_array(spec, out)
                if chain:
                    decode_chain(spec, chain, mv[a:b], byte_view(arr, spec.order), DEFAULT_POOL)
                else:
                    copy_bytes(byte_view(arr, spec.order), mv[a:b])
            loss[name] = 0.0
        elif not chain:
            arr = _previous_or_zeros(spec, out)
            dst = byte_view(arr, spec.order)
            gap_starts, gap_ends = holes.within(a, b)
            run_starts = [a, *gap_ends.tolist()]
            run_ends = [*gap_starts.tolist(), b]
            for s, e in zip(run_starts, run_ends, strict=True):
                if s < e:
                    dst[s - a : e - a] = mv[s:e]
            loss[name] = lost / spec.size
        else:
            arr = _previous_or_zeros(spec, out)
            loss[name] = 1.0
        items.append((spec.path, arr))
    msg = Message(
        tensors=unflatten(items),
        meta=plan.meta,
        kind=plan.kind,
        t0=plan.t0,
        nbytes=plan.nbytes,
        wire_nbytes=plan.wire_nbytes,
        decode_s=time.perf_counter() - start,
        n_tensors=len(plan.tensors),
        codec_label=plan.codec_label,
    )
    return msg, loss
