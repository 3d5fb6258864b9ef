"""Header pieces precompiled per message shape, reused while the shape repeats (FL rounds do).

Sending: an :class:`EncodePlan` holds, for one sequence of (name, dtype, shape, order), the
msgpack bytes of every tensor entry up to its sizes, and the whole ``tensors`` array for
when every tensor goes raw, so a message of a known shape is framed by joining bytes
instead of building and packing a map per tensor; a data message with no meta adds only its
``t0`` to a header kept whole. Receiving: a :class:`TensorTable` is a validated ``tensors``
array, cached under its exact msgpack bytes, so a header seen before is checked by comparing
bytes instead of validating every entry again; and a :class:`KnownLayout` is a whole header
seen before but for the value of its ``t0``, so the next message of the same shape is read
with one lookup.

Both caches are bounded in entries and in bytes; a peer that sends ever new headers only
evicts older ones, and costs at most those bounds.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import msgpack
import numpy as np

from tensorwire.wire.dtypes import name_of_dtype
from tensorwire.wire.tensors import Order

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

ShapeKey = tuple[tuple[tuple[str, ...], np.dtype, tuple[int, ...], Order], ...]
"""(path, dtype, shape, order) of every tensor of a message, in body order."""

BUFFER_KINDS = frozenset("biufc")  # dtype kinds the buffer protocol exports (not bfloat16's)

_packers = threading.local()  # a Packer keeps state between calls: one per thread


def msgpack_default(obj: Any) -> Any:
    """What msgpack gets for the few non-msgpack types a header may hold."""
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, tuple):
        return list(obj)
    raise TypeError(f"{type(obj).__name__} is not a msgpack type")


def pack(obj: Any) -> bytes:
    """``msgpack.packb(obj)`` as the reference encoder packs (str as str, bytes as bin,
    numpy scalars as their values), without building a packer per call."""
    try:
        packer = _packers.packer
    except AttributeError:
        packer = _packers.packer = msgpack.Packer(use_bin_type=True, default=msgpack_default)
    return packer.pack(obj)


class BoundedCache(Generic[K, V]):
    """A dict that holds at most ``max_entries`` values and ``max_bytes`` of their cost,
    evicting the oldest first. Lookups take no lock (``get`` is the dict's own); inserts do."""

    def __init__(self, max_entries: int, max_bytes: int) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._values: dict[K, V] = {}
        self._costs: dict[K, int] = {}
        self._bytes = 0
        self._lock = threading.Lock()
        self.get: Callable[[K], V | None] = self._values.get  # no Python frame per lookup

    def put(self, key: K, value: V, cost: int) -> None:
        """Keep ``value`` unless its ``cost`` (bytes) alone is over the bound."""
        if cost > self.max_bytes:
            return
        with self._lock:
            self._values.pop(key, None)
            self._bytes -= self._costs.pop(key, 0)
            while self._values and (
                len(self._values) >= self.max_entries or self._bytes + cost > self.max_bytes
            ):
                oldest = next(iter(self._values))
                del self._values[oldest]
                self._bytes -= self._costs.pop(oldest)
            self._values[key] = value
            self._costs[key] = cost
            self._bytes += cost

    def __len__(self) -> int:
        return len(self._values)

    @property
    def nbytes(self) -> int:
        """The summed cost of what is held, bytes."""
        return self._bytes

    def clear(self) -> None:
        with self._lock:
            self._values.clear()
            self._costs.clear()
            self._bytes = 0


# Keys of a tensor entry, packed once (docs/wire-format.md 4.3, in the encoder's order).
_NAME, _DTYPE, _SHAPE, _ORDER, _NBYTES, _CODECS, _SIZES, _SIZE = (
    pack(k) for k in ("name", "dtype", "shape", "order", "nbytes", "codecs", "sizes", "size")
)


class EncodePlan:
    """The header pieces of one message shape (see the module docstring).

    ``names`` are the tensors' "a/b" paths as selectors see them; ``raw_tensors`` is the
    packed ``tensors`` array when every tensor goes raw; :meth:`entry` packs the entry of a
    compressed one.
    """

    __slots__ = (
        "_heads",
        "data_head",
        "key",
        "max_nbytes",
        "names",
        "nbytes",
        "raw_entries",
        "raw_tensors",
        "total_nbytes",
    )

    def __init__(self, key: ShapeKey) -> None:
        self.key = key
        self.names = tuple("/".join(path) for path, _, _, _ in key)
        self.nbytes = tuple(math.prod(shape) * dtype.itemsize for _, dtype, shape, _ in key)
        self.total_nbytes = sum(self.nbytes)
        self.max_nbytes = max(self.nbytes, default=0)
        self._heads = tuple(
            b"".join(
                (
                    _NAME,
                    pack(list(path)),
                    _DTYPE,
                    pack(name_of_dtype(dtype)),
                    _SHAPE,
                    pack(list(shape)),
                    _ORDER,
                    pack(order),
                    _NBYTES,
                    pack(nbytes),
                )
            )
            for (path, dtype, shape, order), nbytes in zip(key, self.nbytes, strict=True)
        )
        # A raw entry has 6 keys: name, dtype, shape, order, nbytes, size (= nbytes).
        self.raw_entries = tuple(
            b"\x86" + head + _SIZE + pack(nbytes)
            for head, nbytes in zip(self._heads, self.nbytes, strict=True)
        )
        self.raw_tensors = array_header(len(key)) + b"".join(self.raw_entries)
        # the header of a data message with no meta and every tensor raw, but for the value
        # of its t0 (the encoder fills it in: the header's assembly is the format's)
        self.data_head: bytes | None = None

    @property
    def cost(self) -> int:
        """Roughly the bytes this plan holds (for the cache's bound)."""
        return 2 * len(self.raw_tensors) + 64 * len(self.names)

    def entry(
        self, i: int, configs: list[dict[str, Any]], sizes: Sequence[int], size: int
    ) -> bytes:
        """The entry of tensor ``i`` sent through a chain with ``configs``; ``sizes`` are
        the byte sizes between its stages (``len(configs) - 1`` values), ``size`` its
        encoded size."""
        if len(configs) > 1:
            tail = (_CODECS, pack(configs), _SIZES, pack(list(sizes)), _SIZE, pack(size))
            return b"\x88" + self._heads[i] + b"".join(tail)
        return b"\x87" + self._heads[i] + _CODECS + pack(configs) + _SIZE + pack(size)


def array_header(n: int) -> bytes:
    """The msgpack header of an array of ``n`` items."""
    if n < 16:
        return bytes((0x90 | n,))
    if n < 1 << 16:
        return b"\xdc" + n.to_bytes(2, "big")
    return b"\xdd" + n.to_bytes(4, "big")


_ENCODE_PLANS: BoundedCache[ShapeKey, EncodePlan] = BoundedCache(256, 32 << 20)


def encode_plan(key: ShapeKey) -> EncodePlan:
    """The cached plan for a message shape (built on first use)."""
    plan = _ENCODE_PLANS.get(key)
    if plan is None:
        plan = EncodePlan(key)
        _ENCODE_PLANS.put(key, plan, plan.cost)
    return plan


@dataclass(frozen=True, slots=True)
class TensorTable:
    """A validated ``tensors`` array of a header and what follows from it alone."""

    specs: tuple[Any, ...]  # TensorSpec, in body order
    encoded_nbytes: int  # the sum of the tensors' sizes on the wire, without digests
    nbytes: int  # decoded size of all tensors
    scratch_nbytes: int  # the most scratch one compressed tensor needs to decode
    max_ndim: int
    codec_label: str
    compressed: bool  # whether any tensor has a codec chain
    flat_names: tuple[str, ...] | None  # every path's one name, when no path is nested

    def fits(self, limits: Any) -> bool:
        """Whether ``limits`` (a ``Limits``) allow this table."""
        return (
            len(self.specs) <= limits.max_tensors
            and self.max_ndim <= limits.max_ndim
            and self.nbytes + self.scratch_nbytes <= limits.max_message_bytes
        )


TENSOR_TABLES: BoundedCache[bytes, TensorTable] = BoundedCache(256, 1 << 20)
"""Validated tables by their packed bytes. Its bound is in header bytes: the Python objects
of a table take a few times that."""


class KnownLayout:
    """A header seen before, but for the value of its ``t0``: cached under the header's bytes
    up to that value (all but its last 8), so a message that repeats them is decoded from
    this alone. Only headers of flat, raw, C-ordered tensors of numpy's own dtypes and no
    ``meta`` have one (the small messages of FL rounds, ping-pongs and streams), and headers
    of ``meta`` alone that came before (acknowledgements, control): their ``meta`` is kept
    packed and unpacked anew for each message (None when empty). Headers of such tensors
    beside a ``meta`` have one under their bytes without the ``meta`` (:data:`META_LAYOUTS`),
    their ``meta`` read from each message."""

    __slots__ = (
        "codec_label",
        "digested_nbytes",
        "encoded_nbytes",
        "kind",
        "limits",
        "meta",
        "nbytes",
        "table",
        "tensors",
    )

    def __init__(self, kind: str, table: TensorTable, meta: bytes | None = None) -> None:
        self.kind = kind
        self.table = table
        self.meta = meta
        # (name, path, encoded size, dtype, shape) of each tensor, in body order
        self.tensors = tuple((s.path[0], s.path, s.size, s.dtype, s.shape) for s in table.specs)
        self.encoded_nbytes = table.encoded_nbytes
        self.digested_nbytes = table.encoded_nbytes + 8 * len(table.specs)
        self.nbytes = table.nbytes
        self.codec_label = table.codec_label
        self.limits: Any = None  # the last Limits the table was found to fit

    @staticmethod
    def allowed(table: TensorTable) -> bool:
        """Whether messages of ``table`` can be read from a layout."""
        return (
            table.flat_names is not None
            and not table.compressed
            and all(
                s.order == "C" and s.nbytes and s.dtype.kind in BUFFER_KINDS for s in table.specs
            )
        )

    @property
    def cost(self) -> int:
        """Roughly the bytes this layout holds beyond its table (for the cache's bound)."""
        return 64 + 96 * len(self.tensors) + len(self.meta or b"")


KNOWN_LAYOUTS: BoundedCache[bytes, KnownLayout] = BoundedCache(256, 1 << 20)
"""Layouts by their header's bytes but for the last 8."""

META_LAYOUTS: BoundedCache[bytes, KnownLayout] = BoundedCache(256, 1 << 20)
"""Layouts of headers whose ``meta`` sits beside tensors, by their bytes but for the last 8
with the ``meta`` value cut out (:func:`~tensorwire.wire.format.meta_cut`): a stream's
batches and an FL round's updates change their ``meta`` every time, their tensors rarely.
Their ``meta`` is unpacked from each message."""

SEEN_ONCE: BoundedCache[bytes, bool] = BoundedCache(64, 64 << 10)
"""Headers of ``meta`` alone seen once (keyed as layouts are): such a header gets a layout
when it comes again, so a ``meta`` that changes with every message (a stream's count of
what it consumed, say) churns this small cache, not the layouts."""
