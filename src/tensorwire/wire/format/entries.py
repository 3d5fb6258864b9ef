"""The header's ``tensors`` array, validated entry by entry against ``Limits`` into a table."""

from __future__ import annotations

import math
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, TypeGuard

from tensorwire.errors import MalformedHeader, MessageTooLarge, ShapeMismatch
from tensorwire.wire.dtypes import dtype_from_name
from tensorwire.wire.format.layout import Limits, TensorSpec
from tensorwire.wire.plans import TensorTable


def codec_label(chains: Iterable[Sequence[Mapping[str, Any]]]) -> str:
    """Sorted ids of each tensor's first codec (``"raw"`` for none) joined by "+": "lz4+raw"."""
    ids = {chain[0]["id"] if chain else "raw" for chain in chains}
    return "+".join(sorted(ids)) or "raw"


def validate_tensors(entries: Any, limits: Limits) -> TensorTable:
    if not isinstance(entries, list):
        raise MalformedHeader("header field 'tensors' must be an array")
    if len(entries) > limits.max_tensors:
        raise MessageTooLarge(f"{len(entries)} tensors exceed the limit of {limits.max_tensors}")
    specs = tuple(_parse_tensor(i, e, limits) for i, e in enumerate(entries))
    _check_paths(specs)
    decoded = sum(s.nbytes for s in specs)
    scratch = max((s.scratch_bytes for s in specs), default=0)
    if decoded + scratch > limits.max_message_bytes:
        raise MessageTooLarge(
            f"decoding needs {decoded + scratch} bytes ({decoded} decoded + {scratch} scratch), "
            f"over the limit of {limits.max_message_bytes} bytes"
        )
    flat = all(len(s.path) == 1 for s in specs)
    return TensorTable(
        specs=specs,
        encoded_nbytes=sum(s.size for s in specs),
        nbytes=decoded,
        scratch_nbytes=scratch,
        max_ndim=max((len(s.shape) for s in specs), default=0),
        codec_label=codec_label(s.codecs for s in specs),
        compressed=any(s.codecs for s in specs),
        flat_names=tuple(s.path[0] for s in specs) if flat else None,
    )


def _is_count(value: Any) -> TypeGuard[int]:
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


def _check_paths(specs: Sequence[TensorSpec]) -> None:
    seen = {s.path for s in specs}
    if len(seen) != len(specs):
        raise MalformedHeader("two tensors have the same name")
    for s in specs:
        for i in range(1, len(s.path)):
            if s.path[:i] in seen:
                raise MalformedHeader(
                    f"name {'/'.join(s.path)!r} runs through tensor {'/'.join(s.path[:i])!r}"
                )
