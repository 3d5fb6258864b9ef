"""Codec negotiation: an endpoint's codec choice kept to what its peer decodes."""

from __future__ import annotations

import math
from typing import Any

from tensorwire.codecs import AutoCodec, FixedChainSelector
from tensorwire.wire import CodecSelector

_MAX_DECODER_SETS = 64  # distinct decoder sets whose codec choice an endpoint keeps


def _raw_below(selector: Any) -> float:
    """The size in bytes under which ``selector`` sends every tensor raw (inf: all sizes)."""
    if type(selector) is FixedChainSelector:
        return selector.min_size if selector.chain else math.inf
    if type(selector) is AutoCodec:
        return selector.min_size
    return 0


def _decodable(codec: Any, decoders: frozenset[str]) -> Any:
    """``codec``, or where the peer does not decode it the codec it falls back to
    (``fallback()``: floatplanes-zl to floatplanes, the same format without OpenZL), if the
    peer decodes that; None if neither."""
    while codec is not None:
        if (getattr(codec, "codec_id", None) or codec.get_config()["id"]) in decoders:
            return codec
        fallback = getattr(codec, "fallback", None)
        codec = fallback() if fallback is not None else None
    return None


class _DecodableCodecs:
    """An endpoint's codec selector kept to the codecs a peer decodes (a chain with any other
    goes raw, unless that codec falls back to one the peer decodes); what a chain achieved
    goes back to the selector (``auto`` and named codecs watch their streams by it, see
    ``tensorwire.codecs.streams``)."""

    def __init__(self, selector: CodecSelector, decoders: frozenset[str]) -> None:
        self.selector = selector
        self.decoders = decoders

    def __call__(self, name: str, arr: Any) -> list[Any]:
        chain = [_decodable(c, self.decoders) for c in self.selector(name, arr)]
        return chain if all(c is not None for c in chain) else []

    def observe(
        self,
        name: str,
        arr: Any,
        chain: list[Any],
        encoded_nbytes: int,
        *,
        seconds: float | None = None,
    ) -> None:
        observe = getattr(self.selector, "observe", None)
        if observe is not None:
            observe(name, arr, chain, encoded_nbytes, seconds=seconds)
