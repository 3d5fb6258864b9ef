"""Error feedback: the sender keeps what compression dropped and adds it to the next round.

:class:`ErrorFeedback` is a codec selector. For each float tensor it returns a one-shot
codec bound to the tensor's name whose ``encode`` compresses ``x = tensor + residual`` and
keeps ``residual = x - decoded``; its config is the plain compressor's, so the receiver
decodes with no state of its own. This is EF-SGD (Seide et al., 2014; Karimireddy et al.,
2019): biased compressors (top-k, sign) converge as if uncompressed, given time.

Error feedback assumes the receiver *adds up* what it gets (gradients, model deltas); do
not use it for tensors that replace the previous ones (model weights, optimizer state).
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from tensorwire.codecs.abc import DEFAULT_MAX_DECODED_SIZE, Codec, short_repr
from tensorwire.codecs.lossy.base import LOSSY_MIN_SIZE, LossyCodec, float_dtype_name
from tensorwire.errors import CodecConfigError

CompressorFactory = Callable[[str], LossyCodec]
"""Builds a compressor for a dtype (a wire dtype name), e.g. ``partial(TopK, ratio=0.01)``."""

_Key = tuple[str, tuple[int, ...], Literal["C", "F"]]  # dtype, shape, memory order


@dataclass
class _Memory:
    """The sender's state for one tensor name: its compressor, residual and momentum."""

    compressor: LossyCodec
    key: _Key
    residual: np.ndarray  # flat, in memory order, float32 (float64 for float64 tensors)
    momentum: np.ndarray | None = None


@dataclass
class _Round:
    """One encode's candidate state, committed once the size on the wire is known."""

    raw_nbytes: int
    gradient: np.ndarray
    x: np.ndarray  # what was compressed: gradient + residual (+ momentum)
    decoded: np.ndarray
    velocity: np.ndarray | None


@dataclass(frozen=True)
class FeedbackSnapshot:
    """What :meth:`ErrorFeedback.snapshot` took: opaque, for :meth:`ErrorFeedback.restore`."""

    memories: dict[str, _Memory]


class ErrorFeedback:
    """A codec selector that compresses float tensors with error-feedback memory.

    ``compressor_factory(dtype)`` builds the compressor for a tensor of that dtype (a wire
    dtype name); one is built per tensor name and kept, so a seeded compressor's random
    stream goes on from round to round. Tensors under ``min_size`` bytes and tensors that
    are not float16/bfloat16/float32/float64 (such as BatchNorm's int64
    ``num_batches_tracked``) go raw, untouched. ``lossless``, if given, is a codec applied
    to the compressor's payload (a second stage of the chain).

    ``momentum`` (in [0, 1), for sparsifying compressors: topk, randomk, dgc) turns on
    DGC's momentum correction: per round ``u = momentum × u + g``, ``v = v + u``, send
    ``C(v)``, ``v = v - decoded``, and ``u = 0`` where an entry was sent (momentum factor
    masking). Use it in place of the optimizer's momentum, when the receiver applies the
    updates with plain SGD.

    If the wire encoder sends a tensor raw (the chain did not make it smaller), the
    receiver got the tensor itself, and the residual becomes ``x - tensor``. Not
    thread-safe: one sender per instance.
    """

    def __init__(
        self,
        compressor_factory: CompressorFactory,
        *,
        min_size: int = LOSSY_MIN_SIZE,
        momentum: float = 0.0,
        lossless: Codec | None = None,
    ) -> None:
        if isinstance(min_size, bool) or not isinstance(min_size, int) or min_size < 0:
            raise CodecConfigError(f"min_size must be an int >= 0 (bytes), got {min_size!r}")
        if (
            isinstance(momentum, bool)
            or not isinstance(momentum, int | float)
            or not 0.0 <= momentum < 1.0
        ):
            raise CodecConfigError(f"momentum must be a number in [0, 1), got {momentum!r}")
        if lossless is not None and not isinstance(lossless, Codec):
            raise CodecConfigError(f"lossless must be a Codec or None, got {short_repr(lossless)}")
        probe = compressor_factory("float32")  # fails now, not mid-message, if misconfigured
        if not isinstance(probe, LossyCodec):
            raise CodecConfigError(
                f"compressor_factory must build LossyCodec instances, got {short_repr(probe)}"
            )
        if momentum and not probe.sparse:
            raise CodecConfigError(
                f"momentum correction is for sparsifying compressors (topk, randomk, dgc), "
                f"not {probe.codec_id!r}"
            )
        self.min_size = min_size
        self.momentum = float(momentum)
        self.lossless = lossless
        self._factory = compressor_factory
        self._probe = probe
        self._memories: dict[str, _Memory] = {}
        self._lock = threading.Lock()

    def __call__(self, name: str, array: np.ndarray) -> list[Any]:
        """Return ``[]`` (raw) or the chain that compresses ``array`` with feedback."""
        dtype = float_dtype_name(array, self.min_size)
        if dtype is None:
            return []
        key: _Key = (dtype, tuple(array.shape), "C" if array.flags.c_contiguous else "F")
        with self._lock:
            memory = self._memories.get(name)
            if memory is None or memory.key != key:  # new, or reshaped: start afresh
                work = np.float64 if dtype == "float64" else np.float32
                memory = _Memory(self._factory(dtype), key, np.zeros(array.size, dtype=work))
                if self.momentum:
                    memory.momentum = np.zeros(array.size, dtype=work)
                self._memories[name] = memory
        codec = FeedbackCodec(memory, self.momentum, settled_by_next=self.lossless is not None)
        if self.lossless is None:
            return [codec]
        return [codec, _SettlingCodec(codec, self.lossless)]

    def residual(self, name: str) -> np.ndarray | None:
        """Return a copy of the residual kept for ``name`` (the tensor's shape), or None."""
        memory = self._memories.get(name)
        if memory is None:
            return None
        _, shape, order = memory.key
        return memory.residual.reshape(shape, order=order).copy()

    def snapshot(self) -> FeedbackSnapshot:
        """A copy of every tensor's memory (residual, momentum, and the compressor with its
        random state), for :meth:`restore`: a sender whose update was not applied (lost,
        rejected, too late) puts the memory back as it was before that update."""
        with self._lock:
            return FeedbackSnapshot(copy.deepcopy(self._memories))

    def restore(self, snapshot: FeedbackSnapshot) -> None:
        """Put back the memory :meth:`snapshot` took (the snapshot stays usable)."""
        with self._lock:
            self._memories = copy.deepcopy(snapshot.memories)

    def reset(self, name: str | None = None) -> None:
        """Forget the residual (and momentum) of ``name``, or of every tensor."""
        with self._lock:
            if name is None:
                self._memories.clear()
            else:
                self._memories.pop(name, None)

    def __repr__(self) -> str:
        return (
            f"ErrorFeedback({self._probe!r}, min_size={self.min_size}, "
            f"momentum={self.momentum}, lossless={self.lossless!r}, "
            f"tensors={len(self._memories)})"
        )


class FeedbackCodec:
    """Compresses one tensor once with error feedback; its config is the compressor's.

    :class:`ErrorFeedback` makes one per tensor per message; ``encode`` may run once.
    The memory is updated when the size sent is known: at once, or, if a lossless stage
    follows (``settled_by_next``), when that stage has encoded the payload.
    """

    def __init__(self, memory: _Memory, momentum: float, *, settled_by_next: bool) -> None:
        self._memory = memory
        self._momentum = momentum
        self._settled_by_next = settled_by_next
        self._round: _Round | None = None
        self._used = False

    @property
    def compressor(self) -> LossyCodec:
        """The compressor whose payload this codec sends (and whose config it gives)."""
        return self._memory.compressor

    def encode(self, buf: Any) -> np.ndarray:
        """Compress the tensor bytes ``buf`` plus the residual; keep what was dropped."""
        if self._used:
            raise RuntimeError("a FeedbackCodec encodes once; ask the selector again")
        self._used = True
        memory = self._memory
        g = memory.compressor.elements(buf)
        if g.size != memory.residual.size:
            raise ValueError(
                f"the tensor has {g.size} elements, its error-feedback memory "
                f"{memory.residual.size}"
            )
        gradient = g.astype(memory.residual.dtype, copy=False)  # only read
        # New arrays: the memory changes only once the round is settled.
        velocity = None
        if memory.momentum is None:
            x = memory.residual + gradient
        else:
            velocity = self._momentum * memory.momentum + gradient
            x = memory.residual + velocity
        payload = memory.compressor.encode(x.astype(g.dtype, copy=False))
        decoded = np.empty_like(g)
        memory.compressor.decode(payload, out=decoded)
        self._round = _Round(g.nbytes, gradient, x, decoded, velocity)
        if not self._settled_by_next:
            self.settle(payload.nbytes)
        return payload

    def settle(self, sent_nbytes: int) -> None:
        """Update the memory, given the bytes the chain's output has (raw if not smaller)."""
        memory, r = self._memory, self._round
        if r is None:
            raise RuntimeError("settle() comes after encode(), once")
        self._round = None
        if sent_nbytes >= r.raw_nbytes:  # the wire encoder sends the tensor itself
            if r.velocity is not None:  # else x - tensor is the residual as it was
                memory.residual = r.x - r.gradient
                memory.momentum = r.velocity
            return
        r.x -= r.decoded.astype(r.x.dtype, copy=False)
        memory.residual = r.x
        if r.velocity is not None:
            r.velocity[r.decoded != 0] = 0  # momentum factor masking
            memory.momentum = r.velocity

    def decode(self, buf: Any, out: Any = None, *, max_size: int = DEFAULT_MAX_DECODED_SIZE) -> Any:
        """Decode as the compressor does (the receiver needs no error-feedback state)."""
        return self._memory.compressor.decode(buf, out, max_size=max_size)

    def get_config(self) -> dict[str, Any]:
        """Return the compressor's config: what the receiver rebuilds."""
        return self._memory.compressor.get_config()

    def __repr__(self) -> str:
        return f"FeedbackCodec({self._memory.compressor!r})"


class _SettlingCodec:
    """The lossless stage after a :class:`FeedbackCodec`: settles its round once encoded."""

    def __init__(self, feedback: FeedbackCodec, lossless: Codec) -> None:
        self._feedback = feedback
        self._lossless = lossless

    def encode(self, buf: Any) -> Any:
        encoded = self._lossless.encode(buf)
        self._feedback.settle(memoryview(encoded).nbytes)
        return encoded

    def decode(self, buf: Any, out: Any = None, *, max_size: int = DEFAULT_MAX_DECODED_SIZE) -> Any:
        return self._lossless.decode(buf, out, max_size=max_size)

    def get_config(self) -> dict[str, Any]:
        return self._lossless.get_config()

    def __repr__(self) -> str:
        return f"_SettlingCodec({self._lossless!r})"
