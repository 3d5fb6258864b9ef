"""What the wire format needs from a codec, without importing any (codecs sit above wire).

A codec follows numcodecs' shape: ``encode(buf)`` returns a bytes-like object,
``decode(buf, out)`` writes exactly ``len(out)`` bytes into the writable buffer ``out``
(or raises a :class:`~tensorwire.errors.WireError`), and ``get_config()`` returns a small
msgpack/JSON-serialisable dict with an ``"id"`` key. That dict is what travels in the header.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np


@runtime_checkable
class Codec(Protocol):
    """A byte-to-byte transform whose configuration travels in the message header."""

    def encode(self, buf: Any) -> Any:
        """Return the encoded form of the bytes-like ``buf`` (any buffer-protocol object)."""
        ...

    def decode(self, buf: Any, out: Any = None) -> Any:
        """Decode ``buf``; with ``out`` given, fill it exactly and return it."""
        ...

    def get_config(self) -> dict[str, Any]:
        """Return ``{"id": ..., **parameters}``, enough for the peer to rebuild the codec."""
        ...


CodecSelector = Callable[[str, np.ndarray], Sequence[Codec]]
"""Chooses the codec chain for one tensor, given its name and array; ``[]`` sends it raw."""

CodecLookup = Callable[[Mapping[str, Any]], Codec]
"""Rebuilds a codec from the config found in a header; raises ``UnknownCodec`` if it can't."""
