"""What a selector decided for each stream of tensors, and when it looks again.

A stream is what repeats from message to message: a tensor of one name, dtype and shape,
sent in one context (a peer, a group of peers; None by default). FL rounds send the same
tensors again and again, so a choice made on one sample of a stream holds for the next
messages: it is looked at again only every ``recheck_every`` messages once the stream has
carried ``recheck_bytes`` since, or at once when what a codec achieved drifts from what
the sample promised.
"""

from __future__ import annotations

import threading
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tensorwire.codecs.abc import Codec
from tensorwire.errors import CodecConfigError

StreamKey = tuple[str, np.dtype, tuple[int, ...], Hashable]
"""(name, dtype, shape, context)."""

RECHECK_EVERY = 64
RECHECK_BYTES = 256 << 20
"""A stream is sampled again once it carried both this many messages and bytes since: a
sample (~0.1-1 ms) is then at most ~1 % of what sending those bytes took at 4 GB/s."""
MAX_STREAMS = 4096
DRIFT = 0.10
"""How far (as a fraction of the raw size) an achieved ratio may move from the sampled one
before the stream is sampled again."""


@dataclass(frozen=True)
class Recheck:
    """When a stream's choice is looked at again: after ``every`` messages once it also
    carried ``nbytes`` bytes since, or when a codec's achieved ratio moves more than
    ``drift`` from the sampled one."""

    every: int = RECHECK_EVERY
    nbytes: int = RECHECK_BYTES
    drift: float = DRIFT

    def __post_init__(self) -> None:
        for name, value in (("recheck_every", self.every), ("recheck_bytes", self.nbytes)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise CodecConfigError(f"{name} must be an int >= 1, got {value!r}")
        if not 0.0 < self.drift < 1.0:
            raise CodecConfigError(f"drift must be in (0, 1), got {self.drift!r}")


@dataclass
class StreamChoice:
    """One stream's current choice (``chain``, ``[]`` for raw) and its use since sampled."""

    chain: list[Any]
    ratio: float  # encoded / raw bytes the sample promised for the chain (1.0 for raw)
    state: Any = None  # what the selector keeps to re-decide without sampling
    messages: int = 0
    nbytes: int = 0
    stale: bool = False

    def due(self, recheck: Recheck) -> bool:
        """Whether to sample again before the next message."""
        return self.stale or (self.messages >= recheck.every and self.nbytes >= recheck.nbytes)

    def count(self, nbytes: int) -> None:
        self.messages += 1
        self.nbytes += nbytes

    def achieved(self, ratio: float, recheck: Recheck) -> None:
        """Note what the chain achieved on a whole tensor; a drift makes the choice stale."""
        if abs(ratio - self.ratio) > recheck.drift:
            self.stale = True


class StreamChoices:
    """The choices of up to ``max_streams`` streams, oldest forgotten first."""

    def __init__(self, max_streams: int = MAX_STREAMS) -> None:
        if isinstance(max_streams, bool) or not isinstance(max_streams, int) or max_streams < 1:
            raise CodecConfigError(f"max_streams must be an int >= 1, got {max_streams!r}")
        self.max_streams = max_streams
        self._choices: dict[StreamKey, StreamChoice] = {}
        self._lock = threading.Lock()

    def get(self, key: StreamKey) -> StreamChoice | None:
        return self._choices.get(key)

    def put(self, key: StreamKey, choice: StreamChoice) -> None:
        with self._lock:
            self._choices.pop(key, None)
            while len(self._choices) >= self.max_streams:
                del self._choices[next(iter(self._choices))]
            self._choices[key] = choice

    def __len__(self) -> int:
        return len(self._choices)

    def clear(self) -> None:
        with self._lock:
            self._choices.clear()


def stream_key(name: str, array: np.ndarray, context: Hashable) -> StreamKey:
    return (name, array.dtype, array.shape, context)


class ContextSelector:
    """A stream-keeping selector (``AutoCodec``, ``FixedChainSelector``) with ``context``
    bound: the wire encoder's ``(name, array)`` calls and its ``observe`` reports land on
    that context's streams."""

    def __init__(self, selector: Any, context: Hashable) -> None:
        self.selector = selector
        self.context = context

    def __call__(self, name: str, array: np.ndarray) -> list[Codec]:
        return self.selector.select(name, array, self.context)

    def observe(
        self,
        name: str,
        array: np.ndarray,
        chain: Sequence[Codec],
        encoded_nbytes: int,
        *,
        seconds: float | None = None,
    ) -> None:
        self.selector.observe(name, array, chain, encoded_nbytes, self.context, seconds=seconds)

    def __repr__(self) -> str:
        return f"ContextSelector({self.selector!r}, {self.context!r})"
