"""Turning a user's ``codec=`` argument into a codec selector for the wire encoder."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tensorwire.codecs.abc import Codec, short_repr
from tensorwire.codecs.auto import AutoCodec
from tensorwire.codecs.fixed_chain import FixedChainSelector
from tensorwire.codecs.lossy import LOSSY_CODECS, lossy_selector
from tensorwire.codecs.registry import available_codecs, get_codec
from tensorwire.errors import CodecConfigError, TensorwireError
from tensorwire.wire.codec import CodecSelector

NAMED_CODEC_MIN_SIZE = 1024
"""Bytes a tensor must have for ``codec="lz4"`` (or another id) to compress it; smaller
tensors go raw, since the codec's header and call would cost more than it saves."""

_RAW_NAMES = ("raw", "none")


def resolve_codecs(spec: Any) -> CodecSelector:
    """Return the codec selector a ``codec=`` argument names.

    - None, ``"raw"`` or ``"none"``: every tensor goes raw.
    - ``"auto"``: a new :class:`AutoCodec` (bandwidth 1e9 bytes/s until told otherwise).
    - a codec id such as ``"lz4"`` or ``"zstd"``: that codec with default parameters for
      every tensor of at least :data:`NAMED_CODEC_MIN_SIZE` bytes that a sample shows it
      shrinks (:class:`FixedChainSelector`).
    - a :class:`Codec`, or a sequence of them (a chain, applied in order): every tensor
      (big ones that a sample shows the first codec cannot shrink go raw).
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
