"""The base class of tensorwire's byte codecs (numcodecs' shape).

A codec turns a contiguous buffer into encoded bytes and back. Its parameters are its
public instance attributes; ``get_config()`` returns them with the codec's ``id``, and
that small dict is what travels in a message header so the peer can rebuild the codec
with :func:`tensorwire.codecs.get_codec`.
"""

from __future__ import annotations

import abc
import functools
import inspect
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Self

from tensorwire.errors import CodecConfigError

DEFAULT_MAX_DECODED_SIZE = 16 << 30
"""Bytes ``decode(buf)`` will allocate at most when no ``out`` is given (16 GiB)."""


class Codec(abc.ABC):
    """A lossless transform of bytes, configured by a small serialisable dict.

    Subclasses set ``codec_id``, keep their parameters as public attributes (everything
    that starts with ``_`` is private state and not part of the configuration), take local
    settings as keyword-only constructor arguments, and implement :meth:`encode` and
    :meth:`decode`.
    """

    codec_id: ClassVar[str]

    @abc.abstractmethod
    def encode(self, buf: Any) -> Any:
        """Return the encoded form (bytes-like) of the contiguous buffer ``buf``.

        ``buf`` may be any buffer-protocol object or numpy array, of any dtype or shape.
        """

    @abc.abstractmethod
    def decode(self, buf: Any, out: Any = None, *, max_size: int = DEFAULT_MAX_DECODED_SIZE) -> Any:
        """Decode ``buf``.

        With ``out`` (a writable contiguous buffer) given, write exactly its size in bytes
        into it and return it; raise :class:`~tensorwire.errors.DecompressedSizeMismatch`
        if ``buf`` decodes to another size. Without ``out``, return a new uint8 numpy array,
        and raise ``DecompressedSizeMismatch`` before allocating if ``buf`` declares more
        than ``max_size`` bytes. Corrupt input raises
        :class:`~tensorwire.errors.CodecDataError`.
        """

    def for_itemsize(self, itemsize: int) -> Codec:
        """Return this codec set up for arrays of ``itemsize``-byte elements.

        Selectors call it with the tensor's itemsize before the wire layer hands the codec
        the tensor's bytes; codecs that shuffle by element (Blosc2) return a copy that
        knows the element size. The default returns ``self``.
        """
        return self

    def get_config(self) -> dict[str, Any]:
        """Return ``{"id": codec_id, **parameters}`` (msgpack and JSON serialisable)."""
        params = {k: v for k, v in vars(self).items() if not k.startswith("_")}
        return {"id": self.codec_id, **params}

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> Self:
        """Build the codec ``config`` describes; raise ``CodecConfigError`` if it can't.

        Keyword-only constructor arguments are local settings (such as thread counts) and
        are refused here: a config may come from a peer.
        """
        params = dict(config)
        codec_id = params.pop("id", cls.codec_id)
        if codec_id != cls.codec_id:
            raise CodecConfigError(
                f"config is for codec {short_repr(codec_id)}, not {cls.codec_id!r}"
            )
        local = [k for k in params if k in _keyword_only(cls)]
        if local:
            raise CodecConfigError(f"{', '.join(local)} is a local setting, not configuration")
        try:
            return cls(**params)
        except TypeError as e:
            # An unknown or missing keyword: say which parameters the codec takes.
            raise CodecConfigError(f"bad parameters for codec {cls.codec_id!r}: {e}") from e

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Codec):
            return NotImplemented
        return type(self) is type(other) and self.get_config() == other.get_config()

    def __hash__(self) -> int:
        return hash(tuple(sorted(self.get_config().items())))

    def __repr__(self) -> str:
        config = self.get_config()
        del config["id"]
        args = ", ".join(f"{k}={v!r}" for k, v in config.items())
        return f"{type(self).__name__}({args})"


@functools.cache
def _keyword_only(cls: type[Codec]) -> frozenset[str]:
    parameters = inspect.signature(cls.__init__).parameters.values()
    return frozenset(p.name for p in parameters if p.kind is inspect.Parameter.KEYWORD_ONLY)


def check_int(name: str, value: Any, low: int, high: int) -> int:
    """Return ``value`` if it is an int in ``[low, high]``, else raise ``CodecConfigError``."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise CodecConfigError(f"{name} must be an int in [{low}, {high}], got {short_repr(value)}")
    return value


def check_choice(name: str, value: Any, choices: Sequence[str]) -> str:
    """Return ``value`` if it is one of ``choices``, else raise ``CodecConfigError``."""
    if not isinstance(value, str) or value not in choices:
        raise CodecConfigError(
            f"{name} must be one of {', '.join(choices)}; got {short_repr(value)}"
        )
    return value


def short_repr(value: Any, limit: int = 80) -> str:
    """Return ``repr(value)`` cut to ``limit`` characters (for values a peer sent)."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
