"""Decoding one tensor: its output array, its codec chain rebuilt from the header and run
backwards, its digest checked."""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence

import numpy as np

from tensorwire.errors import ChecksumMismatch, CodecDataError, UnknownCodec, WireError
from tensorwire.wire.codec import Codec, CodecLookup
from tensorwire.wire.format import TensorSpec
from tensorwire.wire.pool import BufferPool
from tensorwire.wire.tensors import TensorPath

_U64 = struct.Struct("<Q")

DEFAULT_POOL = BufferPool()
"""Scratch buffers of the decoders given no pool of their own."""


def output_array(spec: TensorSpec, out: Mapping[TensorPath, np.ndarray] | None) -> np.ndarray:
    """The caller's array for this tensor if it matches dtype, shape and order, else a new one."""
    if out is not None:
        arr = out.get(spec.path)
        if (
            isinstance(arr, np.ndarray)
            and arr.dtype == spec.dtype
            and arr.shape == spec.shape
            and arr.flags.writeable
            and (arr.flags.c_contiguous if spec.order == "C" else arr.flags.f_contiguous)
        ):
            return arr
    return np.empty(spec.shape, spec.dtype, order=spec.order)


def resolve_chain(spec: TensorSpec, lookup: CodecLookup | None) -> list[Codec]:
    """Rebuild a tensor's codec chain from its header configs."""
    if not spec.codecs:
        return []
    if lookup is None:
        raise UnknownCodec(
            f"tensor {'/'.join(spec.path)!r} uses codec {spec.codecs[0]['id']!r} but no codec "
            "registry was given (use tensorwire.decode, or pass "
            "codec_lookup=tensorwire.codecs.get_codec)"
        )
    chain = []
    for config in spec.codecs:
        try:
            chain.append(lookup(config))
        except WireError:
            raise
        except Exception as exc:  # e.g. a registered codec rejecting hostile parameters
            raise UnknownCodec(
                f"tensor {'/'.join(spec.path)!r}: cannot build codec {config!r}: {exc}"
            ) from None
    return chain


def decode_chain(
    spec: TensorSpec, chain: Sequence[Codec], encoded: memoryview, out: memoryview, pool: BufferPool
) -> None:
    """Run the chain backwards from ``encoded`` into ``out`` (the tensor's bytes)."""
    sizes = spec.stage_sizes
    src = encoded
    scratch: list[np.ndarray] = []
    try:
        for i in range(len(chain) - 1, -1, -1):
            if i:
                buf = pool.acquire(sizes[i])
                scratch.append(buf)
                dst = buf.data
            else:
                dst = out
            try:
                chain[i].decode(src, out=dst)
            except WireError:
                raise
            except Exception as exc:  # a codec library's own error on corrupt input
                raise CodecDataError(
                    f"tensor {'/'.join(spec.path)!r}: codec {spec.codecs[i]['id']!r} failed: {exc}"
                ) from None
            src = dst
    finally:
        for buf in scratch:
            pool.release(buf)


def check_digest(spec: TensorSpec, computed: int, sent: bytes | bytearray | memoryview) -> None:
    (expected,) = _U64.unpack(sent)
    if computed != expected:
        raise ChecksumMismatch(
            f"tensor {'/'.join(spec.path)!r}: checksum {computed:016x} != sent {expected:016x}; "
            "the bytes were corrupted in transit"
        )
