"""A selector that sends every big enough tensor through one fixed codec chain."""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import numpy as np

from tensorwire.codecs.abc import Codec
from tensorwire.codecs.blocked import BlockedCodec
from tensorwire.codecs.sampling import sample_ratio
from tensorwire.codecs.streams import (
    MAX_STREAMS,
    RECHECK_BYTES,
    RECHECK_EVERY,
    ContextSelector,
    Recheck,
    StreamChoice,
    StreamChoices,
    stream_key,
)
from tensorwire.errors import CodecConfigError

SAMPLE_ABOVE = 256 << 10
"""Bytes over which a named codec first compresses a sample of a tensor, and sends it raw
if the sample does not shrink (smaller tensors are the sample themselves)."""


class FixedChainSelector:
    """Sends every tensor of at least ``min_size`` bytes through ``chain``; others go raw.

    Like Dask's ``maybe_compress``, it gives up on a stream of incompressible data after a
    sample: a tensor of more than ``sample_above`` bytes whose lossless first codec does
    not shrink a sample of it by ``min_saving`` goes raw, and its stream (name, dtype,
    shape, context) stays raw without sampling until it is looked at again
    (:mod:`tensorwire.codecs.streams`); so does a stream on which the codec, run on a
    whole tensor, saved less than that (:meth:`observe`). ``sample_above=None`` never
    gives up.
    """

    def __init__(
        self,
        chain: Sequence[Codec],
        min_size: int = 0,
        *,
        sample_above: int | None = SAMPLE_ABOVE,
        min_saving: float = 0.10,
        recheck_every: int = RECHECK_EVERY,
        recheck_bytes: int = RECHECK_BYTES,
        max_streams: int = MAX_STREAMS,
    ) -> None:
        if not 0.0 <= min_saving < 1.0:
            raise CodecConfigError(f"min_saving must be in [0, 1), got {min_saving!r}")
        self.chain = list(chain)
        self.min_size = min_size
        self.min_saving = min_saving
        # Only tensorwire's lossless block codecs are sampled: a lossy one needs the
        # tensor's elements, and another codec's ratio on a sample is unknown ground.
        lossless = bool(self.chain) and isinstance(self.chain[0], BlockedCodec)
        self.sample_above = sample_above if lossless else None
        self.recheck = Recheck(recheck_every, recheck_bytes)
        self._streams = StreamChoices(max_streams)
        self._by_itemsize: dict[int, list[Codec]] = {}
        self.samples = 0
        """How many times a tensor was sampled."""

    def select(self, name: str, array: np.ndarray, context: Hashable = None) -> list[Codec]:
        nbytes = array.nbytes
        if not self.chain or nbytes < self.min_size:
            return []
        chain = self._for_itemsize(array.itemsize)
        if self.sample_above is None or nbytes <= self.sample_above:
            return list(chain)
        key = stream_key(name, array, context)
        choice = self._streams.get(key)
        if choice is None or choice.due(self.recheck):
            self.samples += 1
            ratio = sample_ratio(chain[0], array)
            choice = StreamChoice(list(chain) if 1.0 - ratio >= self.min_saving else [], ratio)
            self._streams.put(key, choice)
        choice.count(nbytes)
        return list(choice.chain)

    __call__ = select

    def observe(
        self,
        name: str,
        array: np.ndarray,
        chain: Sequence[Codec],
        encoded_nbytes: int,
        context: Hashable = None,
        *,
        seconds: float | None = None,
    ) -> None:
        """Hear what the chain achieved on a whole tensor: a stream it no longer shrinks by
        ``min_saving`` goes raw until it is looked at again (``seconds``, the encode's wall
        time, is not used: a fixed codec's choice does not weigh time)."""
        choice = self._streams.get(stream_key(name, array, context))
        if (
            choice is not None
            and choice.chain
            and 1.0 - encoded_nbytes / max(array.nbytes, 1) < self.min_saving
        ):
            choice.chain = []
            choice.messages = choice.nbytes = 0

    def for_context(self, context: Hashable) -> ContextSelector:
        """This selector with ``context`` bound: ``(name, array)`` in, as the wire wants."""
        return ContextSelector(self, context)

    def _for_itemsize(self, itemsize: int) -> list[Codec]:
        # Only the first codec sees the tensor's elements; later ones see encoded bytes.
        chain = self._by_itemsize.get(itemsize)
        if chain is None:
            chain = [self.chain[0].for_itemsize(itemsize), *self.chain[1:]]
            self._by_itemsize[itemsize] = chain
        return chain

    def __repr__(self) -> str:
        return f"FixedChainSelector({self.chain!r}, min_size={self.min_size})"
