"""The base class of the lossy tensor compressors, and the checks and helpers they share.

A lossy compressor is a :class:`~tensorwire.codecs.abc.Codec` made for one float dtype
(its ``dtype`` parameter, a wire dtype name): ``encode`` reads a tensor's raw bytes as
elements of that dtype and returns a smaller payload; ``decode`` writes an approximation of
the tensor, in that dtype, into ``out``. Every payload but the casts' starts with the
tensor's element count (u64, little-endian), so a decoder checks the output size and the
payload length before it writes or allocates anything.
"""

from __future__ import annotations

import abc
import math
from typing import Any, ClassVar

import numpy as np

from tensorwire.codecs.abc import DEFAULT_MAX_DECODED_SIZE, Codec, check_choice, short_repr
from tensorwire.codecs.buffers import byte_view, output_for
from tensorwire.errors import CodecConfigError, CodecDataError
from tensorwire.wire.dtypes import WIRE_DTYPES, name_of_dtype

FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64")
"""The dtypes (wire names) every lossy compressor takes."""

LOSSY_MIN_SIZE = 4096
"""Bytes a tensor must have to be compressed lossily by a selector; smaller ones (biases,
norm layers: under 1% of a model's bytes, and the most hurt by sparsification) go raw."""

_U64_LIMIT = 1 << 64


class LossyCodec(Codec):
    """A lossy compressor of the bytes of one tensor of dtype ``dtype`` (a wire dtype name).

    Subclasses implement :meth:`_encode` (elements in, payload out), :meth:`_parse`
    (check a payload's header and length, return its element count and fields) and
    :meth:`_decode_into`. Decoding checks sizes before it allocates anything and the body
    before it writes anything. Arithmetic is done in float32 (float64 for float64 tensors).
    """

    sparse: ClassVar[bool] = False
    """True if a decoded tensor is zero except at the entries the payload carries."""

    def __init__(self, dtype: str) -> None:
        self.dtype = check_choice("dtype", dtype, FLOAT_DTYPES)
        self._dtype = WIRE_DTYPES[dtype]
        self._work = np.dtype(np.float64 if dtype == "float64" else np.float32)

    def for_itemsize(self, itemsize: int) -> LossyCodec:
        """Return ``self``; refuse arrays whose elements are not ``dtype``-sized."""
        if itemsize != self._dtype.itemsize:
            raise CodecConfigError(
                f"{self.codec_id} is set up for {self.dtype} ({self._dtype.itemsize}-byte "
                f"elements), not {itemsize}-byte ones; build one per dtype (lossy_selector does)"
            )
        return self

    def elements(self, buf: Any) -> np.ndarray:
        """Return the tensor bytes ``buf`` (or an array of ``dtype``) as a flat ``dtype`` array."""
        if isinstance(buf, np.ndarray) and buf.dtype not in (np.dtype(np.uint8), self._dtype):
            raise ValueError(
                f"{self.codec_id} is set up for {self.dtype}, got {buf.dtype} elements"
            )
        view = byte_view(buf)
        if view.nbytes % self._dtype.itemsize:
            raise ValueError(f"{view.nbytes} bytes are not a whole number of {self.dtype} elements")
        return np.frombuffer(view, dtype=self._dtype)

    def encode(self, buf: Any) -> np.ndarray:
        """Return the payload (a uint8 array) for the tensor bytes ``buf``."""
        return self._encode(self.elements(buf))

    def decode(self, buf: Any, out: Any = None, *, max_size: int = DEFAULT_MAX_DECODED_SIZE) -> Any:
        """Write the decoded tensor (``dtype`` elements) into ``out``, or a new uint8 array."""
        src = byte_view(buf)
        count, parsed = self._parse(src)
        result, view = output_for(out, count * self._dtype.itemsize, max_size)
        # A hostile payload may hold huge (finite) values: overflow to inf is its problem.
        with np.errstate(all="ignore"):
            self._decode_into(parsed, np.frombuffer(view, dtype=self._dtype))
        return result

    @abc.abstractmethod
    def _encode(self, x: np.ndarray) -> np.ndarray:
        """Return the payload for the flat ``dtype`` array ``x``."""

    @abc.abstractmethod
    def _parse(self, src: memoryview) -> tuple[int, Any]:
        """Check the payload ``src``'s header and length, without allocating much.

        Return its element count and what decoding needs; raise ``CodecDataError`` for
        anything an encoder would not write.
        """

    @abc.abstractmethod
    def _decode_into(self, parsed: Any, target: np.ndarray) -> None:
        """Fill the flat ``dtype`` array ``target`` from what :meth:`_parse` returned.

        Raise ``CodecDataError`` for an invalid body before writing to ``target``.
        """


def float_dtype_name(array: np.ndarray, min_size: int) -> str | None:
    """Return ``array``'s wire dtype name if a lossy selector compresses it, else None.

    It does if the dtype is one of :data:`FLOAT_DTYPES` and the array has at least
    ``min_size`` bytes (and at least one element).
    """
    if array.nbytes < max(min_size, 1):
        return None
    try:
        name = name_of_dtype(array.dtype)
    except TypeError:
        return None
    return name if name in FLOAT_DTYPES else None


def check_fraction(name: str, value: Any) -> float:
    """Return ``value`` as a float if it is a number in (0, 1], else raise ``CodecConfigError``."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not 0.0 < value <= 1.0  # also rejects NaN
    ):
        raise CodecConfigError(f"{name} must be a number in (0, 1], got {short_repr(value)}")
    return float(value)


def check_seed(value: Any) -> int | None:
    """Return ``value`` if it is None or an int in [0, 2**64), else raise ``CodecConfigError``."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < _U64_LIMIT:
        raise CodecConfigError(
            f"seed must be None or an int in [0, 2**64), got {short_repr(value)}"
        )
    return value


def kept_count(ratio: float, n: int) -> int:
    """Return ``ceil(ratio * n)`` (at least 1 if ``n``), ignoring float noise: 0.07 * 100 is 7."""
    if n == 0:
        return 0
    return min(n, max(1, math.ceil(ratio * n - 1e-6)))


def require_finite(values: np.ndarray, codec_id: str) -> None:
    """Raise ``ValueError`` if a scale or norm computed from the tensor is NaN or infinite."""
    if not np.isfinite(values).all():
        raise ValueError(
            f"{codec_id} cannot encode a tensor with NaN or infinite values (or whose "
            "squares overflow); send it raw or fix the values"
        )


def block_starts(n: int, block_size: int) -> np.ndarray:
    """Return the first index of every block of ``block_size`` elements among ``n``."""
    return np.arange(0, n, block_size)


def block_rows(a: np.ndarray, block_size: int) -> list[tuple[np.ndarray, slice]]:
    """Split the flat array ``a`` into 2-D views of whole blocks and of the shorter last one.

    Each item is ``(rows, blocks)``: a ``(nrows, width)`` view and the slice of block
    numbers its rows are, so that per-block factors broadcast as ``factors[blocks, None]``.
    """
    full = a.size // block_size
    parts = []
    if full:
        parts.append((a[: full * block_size].reshape(full, block_size), slice(0, full)))
    if a.size % block_size:
        parts.append((a[full * block_size :].reshape(1, -1), slice(full, full + 1)))
    return parts


def payload_length(src: memoryview, expected: int, what: str) -> None:
    """Raise ``CodecDataError`` unless the payload ``src`` is exactly ``expected`` bytes."""
    if src.nbytes != expected:
        raise CodecDataError(f"a {what} payload should be {expected} bytes here, got {src.nbytes}")


def read_fields(src: memoryview, layout: Any, what: str) -> tuple[Any, ...]:
    """Unpack the fixed-size ``struct`` ``layout`` at the start of ``src``, or raise."""
    if src.nbytes < layout.size:
        raise CodecDataError(f"a {what} payload is at least {layout.size} bytes, got {src.nbytes}")
    return layout.unpack_from(src)


def read_scales(src: memoryview, offset: int, count: int, what: str) -> np.ndarray:
    """Return ``count`` float32 scales at ``offset``; raise unless all are finite and >= 0."""
    scales = np.frombuffer(src, dtype="<f4", count=count, offset=offset)
    if not (scales >= 0).all() or not np.isfinite(scales).all():
        raise CodecDataError(f"a {what} payload holds a negative or non-finite scale")
    return scales
