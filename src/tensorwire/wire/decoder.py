"""Bytes back into tensors: a sans-IO stream decoder and a whole-buffer decoder.

``MessageStream`` works like h11: feed it bytes with :meth:`~MessageStream.receive_data`,
or, to avoid a copy, ask :meth:`~MessageStream.next_buffer` where the next bytes belong,
``recv_into`` that view and report the count with :meth:`~MessageStream.advance`;
then take messages from :meth:`~MessageStream.next_event`. It never touches a socket.
"""

from __future__ import annotations

import enum
import struct
import time
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import msgpack
import numpy as np
import xxhash

from tensorwire.errors import (
    ChecksumMismatch,
    CodecDataError,
    HeaderCheckMismatch,
    MalformedHeader,
    TruncatedMessage,
    UnknownCodec,
    WireError,
)
from tensorwire.wire.codec import Codec, CodecLookup
from tensorwire.wire.encoder import _as_byte_view, byte_view
from tensorwire.wire.format import (
    DIGEST_SIZE,
    FLAG_DIGESTS,
    KNOWN_FLAGS,
    MAGIC,
    PREFIX,
    PREFIX_SIZE,
    VERSION,
    Limits,
    MessagePlan,
    Prefix,
    TensorSpec,
    known_header,
    known_meta_bytes,
    meta_cut,
    parse_header,
    parse_prefix,
    verify_header,
)
from tensorwire.wire.plans import (
    KNOWN_LAYOUTS,
    META_LAYOUTS,
    SEEN_ONCE,
    KnownLayout,
    TensorTable,
)
from tensorwire.wire.pool import BufferPool
from tensorwire.wire.tensors import TensorPath, map_leaves, to_torch, unflatten

_U64 = struct.Struct("<Q")
_F64 = struct.Struct(">d")  # msgpack float 64, big-endian


# A one-member enum, so that ``event is NEED_DATA`` narrows ``event`` for type checkers.
class _NeedData(enum.Enum):
    NEED_DATA = "NEED_DATA"

    def __repr__(self) -> str:
        return "NEED_DATA"

    __str__ = __repr__


NEED_DATA: Final = _NeedData.NEED_DATA
"""Returned by ``MessageStream.next_event`` when no complete message is buffered."""


@dataclass(eq=False)
class Message(Mapping[str, Any]):
    """A decoded message: nested ``tensors`` (numpy arrays) and ``meta``.

    A message is a read-only mapping of its top-level names to its tensors (or to dicts of
    them, for nested names): ``msg["x"]``, ``"x" in msg``, ``len(msg)``, ``dict(msg)``,
    ``msg.keys()``, iteration. ``decode_s`` is the CPU time spent decoding (header,
    checksums, codecs), seconds; ``recv_s`` the time from its first byte arriving to its
    last tensor decoded, seconds (0 for :func:`decode_message`); ``t0`` the sender's clock
    when it began encoding.
    """

    tensors: dict[str, Any]
    meta: dict[str, Any] = field(default_factory=dict)
    kind: str = "data"
    t0: float | None = None
    nbytes: int = 0
    wire_nbytes: int = 0
    decode_s: float = 0.0
    recv_s: float = 0.0
    n_tensors: int = 0
    codec_label: str = "raw"
    record: Any = None  # the transport's TransferRecord, once a transport delivered it

    def __getitem__(self, name: str) -> Any:
        return self.tensors[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.tensors)

    def __len__(self) -> int:
        return len(self.tensors)

    def __contains__(self, name: object) -> bool:
        return name in self.tensors

    def to_torch(self) -> dict[str, Any]:
        """The tensors as torch tensors (sharing memory where torch allows), same nesting."""
        return map_leaves(self.tensors, to_torch)


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


def _check_digest(spec: TensorSpec, computed: int, sent: bytes | bytearray | memoryview) -> None:
    (expected,) = _U64.unpack(sent)
    if computed != expected:
        raise ChecksumMismatch(
            f"tensor {'/'.join(spec.path)!r}: checksum {computed:016x} != sent {expected:016x}; "
            "the bytes were corrupted in transit"
        )


_DEFAULT_POOL = BufferPool()


def decode_message(
    buf: Any,
    *,
    limits: Limits = Limits(),
    codec_lookup: CodecLookup | None = None,
    out: Mapping[TensorPath, np.ndarray] | None = None,
    copy: bool = False,
    pool: BufferPool | None = None,
) -> Message:
    """Decode one whole message held in ``buf`` (any bytes-like object).

    Raw tensors are returned as views of ``buf`` (read-only if ``buf`` is) unless ``copy``
    is true or ``out`` holds a matching array for them; compressed ones are decoded into
    new arrays (or into ``out``). Every malformed input raises a ``WireError`` subclass.
    """
    start = time.perf_counter()
    mv = memoryview(buf)
    if mv.ndim != 1 or mv.format != "B":
        mv = mv.cast("B")
    if len(mv) < PREFIX_SIZE:
        raise TruncatedMessage(f"{len(mv)} bytes is shorter than the {PREFIX_SIZE}-byte prefix")
    prefix = parse_prefix(mv, limits)
    return _decode_whole(mv, prefix, start, limits, codec_lookup, out, copy, pool or _DEFAULT_POOL)


def _decode_whole(
    mv: memoryview,
    prefix: Prefix,
    start: float,
    limits: Limits,
    codec_lookup: CodecLookup | None,
    out: Mapping[TensorPath, np.ndarray] | None,
    copy: bool,
    pool: BufferPool,
) -> Message:
    """:func:`decode_message` once the prefix is parsed."""
    end_header = PREFIX_SIZE + prefix.header_length
    total = end_header + prefix.body_length
    if len(mv) < total:
        raise TruncatedMessage(f"message is {total} bytes but only {len(mv)} were given")
    if len(mv) > total:
        raise MalformedHeader(f"{len(mv) - total} bytes follow the end of the message")
    header = mv[PREFIX_SIZE:end_header]
    verify_header(header, prefix)
    plan = parse_header(header, prefix, limits)
    table = plan.table
    chains = None
    if table.compressed:
        chains = [resolve_chain(spec, codec_lookup) for spec in table.specs]
    arrays: list[np.ndarray] = []
    offset = end_header
    digests = plan.digests
    for i, spec in enumerate(table.specs):
        encoded = mv[offset : offset + spec.size]
        offset += spec.size
        if digests:
            _check_digest(
                spec, xxhash.xxh3_64_intdigest(encoded), mv[offset : offset + DIGEST_SIZE]
            )
            offset += DIGEST_SIZE
        chain = chains[i] if chains is not None else None
        if not chain and not copy and (out is None or spec.path not in out):
            arr = np.frombuffer(encoded, spec.dtype).reshape(spec.shape, order=spec.order)
        else:
            arr = output_array(spec, out)
            if chain:
                decode_chain(spec, chain, encoded, byte_view(arr, spec.order), pool)
            else:
                byte_view(arr, spec.order)[:] = encoded
        arrays.append(arr)
    return Message(
        tensors=_tree(table, arrays),
        meta=plan.meta,
        kind=plan.kind,
        t0=plan.t0,
        nbytes=table.nbytes,
        wire_nbytes=plan.wire_nbytes,
        decode_s=time.perf_counter() - start,
        n_tensors=len(arrays),
        codec_label=table.codec_label,
    )


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
        arr.data.cast("B")[:] = encoded  # C-ordered, of a buffer kind, not empty: its layout
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
        byte_view(arr, spec.order)[:] = encoded
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


def _tree(table: TensorTable, arrays: list[np.ndarray]) -> dict[str, Any]:
    """The message's (nested) dict of tensors, given its arrays in body order."""
    if table.flat_names is not None:
        return dict(zip(table.flat_names, arrays, strict=True))
    return unflatten([(s.path, a) for s, a in zip(table.specs, arrays, strict=True)])


# Stream phases.
_PREFIX, _HEADER, _DATA, _DIGEST, _SKIP, _WHOLE = range(6)

WHOLE_BYTES = 4 << 20
"""A message up to this size that has begun to arrive, with no ``out`` arrays to decode into,
is read into one buffer of its own and decoded whole, its raw tensors views of that buffer:
a few large reads and one decode instead of the phases' steps per tensor (a 128 KiB stream
batch of four tensors took six reads). Bigger ones go through the phases, each piece hashed
while cache-hot."""


class MessageStream:
    """Incremental decoder for a byte stream of back-to-back messages (sans-IO).

    Errors in the prefix, or a header whose check fails, leave the stream unable to find the
    next message: they are raised at once and :attr:`broken` becomes true (close the
    connection). Any other bad message is skipped to its end and its error is raised by
    :meth:`next_event` in its place; the stream then goes on with the next message.
    """

    _phase: int
    _dst: memoryview
    _pos: int
    _hasher: Any

    def __init__(
        self,
        *,
        limits: Limits = Limits(),
        codec_lookup: CodecLookup | None = None,
        pool: BufferPool | None = None,
        max_read: int = 1 << 20,
    ) -> None:
        self.limits = limits
        self.codec_lookup = codec_lookup
        self.pool = pool or _DEFAULT_POOL
        self.max_read = max_read
        self.broken = False
        self._events: deque[Message | WireError] = deque()
        self._out: Mapping[TensorPath, np.ndarray] | None = None
        self._small = bytearray(PREFIX_SIZE)
        self._digest = bytearray(DIGEST_SIZE)
        self._discard = bytearray(0)
        self._start_message()

    # -- public API ------------------------------------------------------------------

    def set_out(self, out: Mapping[TensorPath, np.ndarray] | None) -> None:
        """Arrays (by path) to decode the next message's tensors into when they match."""
        self._out = out

    @property
    def in_message(self) -> bool:
        """True between the first byte of a message and its end."""
        return self._phase != _PREFIX or self._pos > 0

    @property
    def reads_direct(self) -> bool:
        """True when :meth:`next_buffer` is the rest of a message's own buffer: read into it
        directly, whatever its size (no staging copy)."""
        return self._phase == _WHOLE

    @property
    def pending(self) -> int:
        """Messages (and errors) complete and waiting for :meth:`next_event`."""
        return len(self._events)

    def next_buffer(self) -> memoryview:
        """Where the next incoming bytes belong (at most ``max_read`` bytes); fill, then advance."""
        self._check_usable()
        return self._dst[self._pos : self._pos + self.max_read]

    def next_read(self, direct_from: int) -> Message | memoryview | None:
        """A reader's next step, in one call (:meth:`next_event`, :meth:`next_buffer` and
        :attr:`reads_direct`): the next complete message if one waits (raising a bad one's
        error); else the view to read into directly, when the next bytes belong in a
        message's own buffer or at least ``direct_from`` of them are due; else None: read
        into a staging buffer and hand that to :meth:`receive_one`."""
        if self._events:
            event = self.next_event()
            assert event is not NEED_DATA
            return event
        if self.broken:
            self._check_usable()
        due = min(len(self._dst) - self._pos, self.max_read)
        if self._phase == _WHOLE or due >= direct_from:
            return self._dst[self._pos : self._pos + due]
        return None

    def advance(self, n: int) -> None:
        """Report that ``n`` bytes were written into the view :meth:`next_buffer` returned."""
        if n <= 0:
            return
        if n > len(self._dst) - self._pos or n > self.max_read:
            raise ValueError(f"advance({n}) is more than the view next_buffer() gave")
        if self._pos == 0 and self._phase == _PREFIX:
            self._t_first = time.perf_counter()
        if self._hasher is not None:
            self._hasher.update(self._dst[self._pos : self._pos + n])
        self._pos += n
        if self._pos == len(self._dst):
            self._step()

    def receive_data(self, data: Any, *, known_tried: bool = False) -> None:
        """Copy ``data`` (bytes-like) into the stream; may complete one or more messages.
        ``known_tried``: :func:`decode_known` already declined the message ``data`` starts."""
        mv = _as_byte_view(data)
        while len(mv):
            self._check_usable()
            if self._phase == _PREFIX and self._pos == 0 and len(mv) >= PREFIX_SIZE:
                taken = self._whole_message(mv, try_known=not known_tried)
                known_tried = False
                if taken:
                    mv = mv[taken:]
                    continue
            k = min(len(self._dst) - self._pos, len(mv), self.max_read)  # hash while cache-hot
            self._dst[self._pos : self._pos + k] = mv[:k]
            mv = mv[k:]
            self.advance(k)

    def receive_one(self, data: memoryview) -> Message | None:
        """:meth:`receive_data`, and the message itself when ``data`` is one whole message
        that :func:`decode_known` reads, arriving where a message begins with none pending
        (the small-message path: no queue); None otherwise (take them from :meth:`next_event`)."""
        at_start = not self._events and self._phase == _PREFIX and self._pos == 0
        if at_start and not self.broken and len(data) >= PREFIX_SIZE:
            t_first = time.perf_counter()
            known = decode_known(data, self.limits, self._out)
            if known is None:
                self.receive_data(data, known_tried=True)  # not asked twice
                return None
            msg, total = known
            msg.recv_s = time.perf_counter() - t_first
            self._out = None
            if total == len(data):
                return msg
            self._events.append(msg)
            data = data[total:]
        self.receive_data(data)
        return None

    def _whole_message(self, mv: memoryview, try_known: bool = True) -> int:
        """Decode a message that ``mv`` holds whole, in one pass (small messages: far fewer
        steps than the phase machine); return the bytes it took, or 0 to go byte by byte.
        ``try_known``: try :func:`decode_known` first (unless it declined this one already)."""
        t_first = time.perf_counter()
        known = decode_known(mv, self.limits, self._out) if try_known else None
        if known is not None:
            msg, total = known
            msg.recv_s = time.perf_counter() - t_first
            self._events.append(msg)
            self._out = None
            return total
        try:
            prefix = parse_prefix(mv, self.limits)
        except WireError:
            return 0  # the phase machine raises it, and marks the stream broken
        total = PREFIX_SIZE + prefix.header_length + prefix.body_length
        if len(mv) < total:
            if total > WHOLE_BYTES or self._out is not None:
                return 0
            self._prefix = prefix
            self._t_first = time.perf_counter()
            buf = np.empty(total, np.uint8).data
            buf[: len(mv)] = mv
            self._enter(_WHOLE, buf)
            self._pos = len(mv)
            return len(mv)
        t_first = time.perf_counter()
        try:
            msg = _decode_whole(
                mv[:total],
                prefix,
                t_first,
                self.limits,
                self.codec_lookup,
                self._out,
                True,
                self.pool,
            )
        except HeaderCheckMismatch:
            self.broken = True
            raise
        except WireError as exc:
            self._events.append(exc)
        else:
            msg.recv_s = time.perf_counter() - t_first
            self._events.append(msg)
        self._out = None
        return total

    def next_event(self) -> Message | _NeedData:
        """The next complete message, ``NEED_DATA``, or raise the error of a bad message."""
        if not self._events:
            return NEED_DATA
        event = self._events.popleft()
        if isinstance(event, WireError):
            raise event
        return event

    # -- state machine -----------------------------------------------------------------

    def _check_usable(self) -> None:
        if self.broken:
            raise WireError("stream is broken by an earlier framing error; reconnect")

    def _enter(self, phase: int, dst: memoryview, hasher: Any = None) -> None:
        self._phase, self._dst, self._pos, self._hasher = phase, dst, 0, hasher

    def _start_message(self) -> None:
        self._plan: MessagePlan | None = None
        self._error: WireError | None = None
        self._index = -1
        self._decode_s = 0.0
        self._t_first = 0.0
        self._items: list[np.ndarray] = []
        self._enter(_PREFIX, memoryview(self._small))

    def _step(self) -> None:
        """The current destination is full: move on, through any zero-length steps."""
        while True:
            try:
                self._finish_phase()
            except BaseException:  # any error here leaves the phases inconsistent: framing lost
                self.broken = True
                raise
            if len(self._dst) or self._phase == _PREFIX:
                return

    def _finish_phase(self) -> None:
        phase = self._phase
        if phase == _PREFIX:
            self._prefix = parse_prefix(self._small, self.limits)
            self._enter(_HEADER, memoryview(bytearray(self._prefix.header_length)))
        elif phase == _HEADER:
            t = time.perf_counter()
            verify_header(
                self._dst, self._prefix
            )  # else the prefix may be corrupt too: framing lost
            try:
                self._plan = parse_header(self._dst, self._prefix, self.limits)
                self._chains = [resolve_chain(s, self.codec_lookup) for s in self._plan.tensors]
            except HeaderCheckMismatch:
                raise  # a wrong body length in the prefix: the next message start is unknown
            except WireError as exc:
                self._fail(exc, self._prefix.body_length)
                return
            finally:
                self._decode_s += time.perf_counter() - t
            self._next_tensor()
        elif phase == _DATA:
            if self._plan is not None and self._plan.digests:
                self._enter(_DIGEST, memoryview(self._digest))
            else:
                self._finish_tensor()
        elif phase == _DIGEST:
            self._finish_tensor()
        elif phase == _WHOLE:
            self._finish_whole()
        elif phase == _SKIP:
            self._skip_left -= len(self._dst)
            if self._skip_left:
                self._enter(_SKIP, self._discard_view())
            else:
                self._end_message()

    def _finish_whole(self) -> None:
        """A message read into a buffer of its own is in: decode it (a bad one is skipped)."""
        try:
            msg = _decode_whole(
                self._dst,
                self._prefix,
                self._t_first,
                self.limits,
                self.codec_lookup,
                None,
                False,
                self.pool,
            )
        except HeaderCheckMismatch:
            raise  # the prefix may be corrupt too: framing lost
        except WireError as exc:
            self._events.append(exc)
        else:
            msg.recv_s = time.perf_counter() - self._t_first
            self._events.append(msg)
        self._start_message()

    def _fail(self, exc: WireError, skip: int) -> None:
        """Record a bad message and skip ``skip`` more bytes to its end."""
        self._error = exc
        self._release_scratch()
        self._skip_left = skip
        if skip:
            self._enter(_SKIP, self._discard_view())
        else:
            self._end_message()

    def _discard_view(self) -> memoryview:
        if not self._discard:
            self._discard = bytearray(1 << 16)
        return memoryview(self._discard)[: min(self._skip_left, len(self._discard))]

    def _next_tensor(self) -> None:
        assert self._plan is not None
        self._index += 1
        if self._index == len(self._plan.tensors):
            self._end_message()
            return
        spec = self._plan.tensors[self._index]
        self._arr = output_array(spec, self._out)
        if self._chains[self._index]:
            self._scratch: np.ndarray | None = self.pool.acquire(spec.size)
            dst = self._scratch.data
        else:
            self._scratch = None
            dst = byte_view(self._arr, spec.order)
        self._enter(_DATA, dst, xxhash.xxh3_64() if self._plan.digests else None)
        self._tensor_hash = self._hasher

    def _finish_tensor(self) -> None:
        assert self._plan is not None
        spec = self._plan.tensors[self._index]
        t = time.perf_counter()
        try:
            if self._plan.digests:
                _check_digest(spec, self._tensor_hash.intdigest(), self._digest)
            if self._scratch is not None:
                decode_chain(
                    spec,
                    self._chains[self._index],
                    self._scratch.data,
                    byte_view(self._arr, spec.order),
                    self.pool,
                )
        except WireError as exc:
            self._decode_s += time.perf_counter() - t
            self._fail(exc, self._body_left_after(self._index))
            return
        self._decode_s += time.perf_counter() - t
        self._release_scratch()
        self._items.append(self._arr)
        self._next_tensor()

    def _body_left_after(self, index: int) -> int:
        assert self._plan is not None
        rest = self._plan.tensors[index + 1 :]
        return sum(s.size for s in rest) + (DIGEST_SIZE * len(rest) if self._plan.digests else 0)

    def _release_scratch(self) -> None:
        scratch = getattr(self, "_scratch", None)
        if scratch is not None:
            self.pool.release(scratch)
            self._scratch = None

    def _end_message(self) -> None:
        if self._error is not None:
            self._events.append(self._error)
        else:
            plan = self._plan
            assert plan is not None
            self._events.append(
                Message(
                    tensors=_tree(plan.table, self._items),
                    meta=plan.meta,
                    kind=plan.kind,
                    t0=plan.t0,
                    nbytes=plan.nbytes,
                    wire_nbytes=plan.wire_nbytes,
                    decode_s=self._decode_s,
                    recv_s=time.perf_counter() - self._t_first,
                    n_tensors=len(plan.tensors),
                    codec_label=plan.codec_label,
                )
            )
        self._out = None
        self._start_message()
