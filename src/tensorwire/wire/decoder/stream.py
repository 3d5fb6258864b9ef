"""Bytes back into messages, from a byte stream: a sans-IO stream decoder.

``MessageStream`` works like h11: feed it bytes with :meth:`~MessageStream.receive_data`,
or, to avoid a copy, ask :meth:`~MessageStream.next_buffer` where the next bytes belong,
``recv_into`` that view and report the count with :meth:`~MessageStream.advance`;
then take messages from :meth:`~MessageStream.next_event`. It never touches a socket.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Mapping
from typing import Any

import numpy as np
import xxhash

from tensorwire.errors import HeaderCheckMismatch, WireError
from tensorwire.wire.codec import CodecLookup
from tensorwire.wire.decoder.known import decode_known
from tensorwire.wire.decoder.message import NEED_DATA, Message, _NeedData, message_tensors
from tensorwire.wire.decoder.tensor import (
    DEFAULT_POOL,
    check_digest,
    decode_chain,
    output_array,
    resolve_chain,
)
from tensorwire.wire.decoder.whole import decode_whole
from tensorwire.wire.encoder import _as_byte_view, byte_view, copy_bytes
from tensorwire.wire.format import (
    DIGEST_SIZE,
    PREFIX_SIZE,
    Limits,
    MessagePlan,
    parse_header,
    parse_prefix,
    verify_header,
)
from tensorwire.wire.pool import BufferPool
from tensorwire.wire.tensors import TensorPath

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
        self.pool = pool or DEFAULT_POOL
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
        if self._hasher is not None:  # checksumming is decoding work: timed as such
            t = time.perf_counter()
            self._hasher.update(self._dst[self._pos : self._pos + n])
            self._decode_s += time.perf_counter() - t
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
            copy_bytes(self._dst[self._pos : self._pos + k], mv[:k])
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
            copy_bytes(buf[: len(mv)], mv)
            self._enter(_WHOLE, buf)
            self._pos = len(mv)
            return len(mv)
        t_first = time.perf_counter()
        try:
            msg = decode_whole(
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
            msg = decode_whole(  # decode_s from now: the wait for its bytes is not decoding
                self._dst,
                self._prefix,
                time.perf_counter(),
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
                check_digest(spec, self._tensor_hash.intdigest(), self._digest)
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
                    tensors=message_tensors(plan.table, self._items),
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
