"""Turning a user's ``codec=`` argument into a codec selector for the wire encoder."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from tensorwire.codecs.abc import Codec, short_repr
from tensorwire.codecs.auto import AutoCodec
from tensorwire.codecs.registry import available_codecs, get_codec
from tensorwire.errors import CodecConfigError, TensorwireError
from tensorwire.wire.codec import CodecSelector

NAMED_CODEC_MIN_SIZE = 1024
"""Bytes a tensor must have for ``codec="lz4"`` (or another id) to compress it; smaller
tensors go raw, since the codec's header and call would cost more than it saves."""

_RAW_NAMES = ("raw", "none")


class FixedChainSelector:
    """Sends every tensor of at least ``min_size`` bytes through ``chain``; others go raw."""

    def __init__(self, chain: Sequence[Codec], min_size: int = 0) -> None:
        self.chain = list(chain)
        self.min_size = min_size

    def __call__(self, name: str, array: np.ndarray) -> list[Codec]:
        if not self.chain or array.nbytes < self.min_size:
            return []
        # Only the first codec sees the tensor's elements; later ones see encoded bytes.
        return [self.chain[0].for_itemsize(array.itemsize), *self.chain[1:]]

    def __repr__(self) -> str:
        return f"FixedChainSelector({self.chain!r}, min_size={self.min_size})"


def resolve_codecs(spec: Any) -> CodecSelector:
    """Return the codec selector a ``codec=`` argument names.

    - None, ``"raw"`` or ``"none"``: every tensor goes raw.
    - ``"auto"``: a new :class:`AutoCodec` (bandwidth 1e9 bytes/s until told otherwise).
    - a codec id such as ``"lz4"`` or ``"zstd"``: that codec with default parameters for
      every tensor of at least :data:`NAMED_CODEC_MIN_SIZE` bytes.
    - a :class:`Codec`, or a sequence of them (a chain, applied in order): every tensor.
    - an :class:`AutoCodec` or any other callable ``(name, array) -> [Codec, ...]``: as is.
    """
    if spec is None:
        return FixedChainSelector([])
    if isinstance(spec, str):
        return _resolve_name(spec)
    if isinstance(spec, Codec):
        return FixedChainSelector([spec])
    if isinstance(spec, Sequence) and all(isinstance(c, Codec) for c in spec):
        return FixedChainSelector(spec)
    if callable(spec):
        return spec
    raise CodecConfigError(
        f"codec= takes None, a name, a Codec, a list of Codecs or a selector; "
        f"got {short_repr(spec)}"
    )


def _resolve_name(name: str) -> CodecSelector:
    key = name.strip().lower()
    if key in _RAW_NAMES:
        return FixedChainSelector([])
    if key == "auto":
        return AutoCodec()
    from tensorwire.codecs.lossy import LOSSY_CODECS, lossy_selector  # lossy imports resolve

    if key in LOSSY_CODECS:  # they need each tensor's dtype: a selector builds them
        return lossy_selector(key)
    if key in available_codecs():
        try:
            codec = get_codec({"id": key})
        except TensorwireError as e:  # a registered codec that needs parameters
            raise CodecConfigError(f"codec {key!r} needs parameters; pass a Codec") from e
        return FixedChainSelector([codec], min_size=NAMED_CODEC_MIN_SIZE)
    choices = ", ".join([*_RAW_NAMES, "auto", *available_codecs()])
    raise CodecConfigError(f"unknown codec {short_repr(name)}; choose one of: {choices}")
