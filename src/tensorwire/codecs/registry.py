"""Which codecs this process knows, by id, and rebuilding one from a header's config."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from tensorwire.codecs.abc import Codec, short_repr
from tensorwire.errors import CodecConfigError, CodecDataError, UnknownCodec
from tensorwire.plugins import CODECS, load_group

_codecs: dict[str, type[Codec]] = {}

C = TypeVar("C", bound=type[Codec])


def register_codec(cls: C) -> C:
    """Make ``cls`` decodable by its ``codec_id`` (replacing any codec of that id).

    Returns ``cls``, so it works as a class decorator.
    """
    codec_id = getattr(cls, "codec_id", None)
    if not isinstance(codec_id, str) or not codec_id:
        raise CodecConfigError(f"{cls!r} has no codec_id string")
    _codecs[codec_id] = cls
    return cls


def available_codecs() -> list[str]:
    """Return the ids of the codecs this process can decode, sorted (sent to peers), those
    of installed plugins (entry points ``tensorwire.codecs``) included."""
    load_group(CODECS, register_codec)
    return sorted(_codecs)


def get_codec(config: Mapping[str, Any]) -> Codec:
    """Rebuild the codec that ``config`` (from a message header) describes.

    Raises :class:`~tensorwire.errors.UnknownCodec` if its id is not registered here and
    :class:`~tensorwire.errors.CodecDataError` if the config is malformed.
    """
    if not isinstance(config, Mapping):
        raise CodecDataError(f"a codec config must be a map, got {type(config).__name__}")
    codec_id = config.get("id")
    if not isinstance(codec_id, str):
        raise CodecDataError(f"a codec config needs a string 'id', got {short_repr(codec_id)}")
    cls = _codecs.get(codec_id)
    if cls is None:
        load_group(CODECS, register_codec)
        cls = _codecs.get(codec_id)
    if cls is None:
        raise UnknownCodec(
            f"unknown codec {short_repr(codec_id)}; this process knows {', '.join(sorted(_codecs))}"
        )
    try:
        return cls.from_config(config)
    except CodecConfigError as e:
        raise CodecDataError(f"invalid config for codec {codec_id!r}: {str(e)[:300]}") from e
