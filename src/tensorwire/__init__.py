"""tensorwire: move tensors and model updates fast over the protocols people deploy.

``serve(url)`` opens a hub and ``connect(url)`` a channel to it over the transport the URL's
scheme names; ``encode``/``decode`` turn a message into bytes and back without a transport.
"""

from __future__ import annotations

from collections.abc import Mapping
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from tensorwire.codecs import get_codec, resolve_codecs
from tensorwire.errors import (
    AuthenticationError,
    BrokerFull,
    DeliveryUncertain,
    GatherTimeout,
    MissingDependency,
    PeerGone,
    TensorwireError,
    TransportError,
    TransportTimeout,
    UnknownHost,
    VersionMismatch,
    WireError,
)
from tensorwire.transports import Channel, Hub, TransferRecord, connect, serve
from tensorwire.transports.security import TLS, Keys
from tensorwire.wire import EncodedMessage, Limits, Message, decode_message, encode_message

try:
    __version__ = version("tensorwire")
except PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0+unknown"


def encode(
    tensors: Mapping[str, Any] | None = None,
    meta: Mapping[str, Any] | None = None,
    *,
    codec: Any = None,
    checksum: bool = True,
) -> EncodedMessage:
    """Encode a (nested) mapping of numpy arrays / torch tensors and metadata.

    ``codec``: None (raw), ``"auto"``, a codec id such as ``"lz4"``, a codec, or a chain.
    Returns an :class:`EncodedMessage`: ``.frames()`` for scatter-gather, ``.to_bytes()``.
    """
    return encode_message(tensors, meta, codecs=resolve_codecs(codec), checksum=checksum)


def decode(
    buf: Any,
    *,
    limits: Limits = Limits(),
    out: Mapping[tuple[str, ...], Any] | None = None,
    copy: bool = False,
) -> Message:
    """Decode a whole message from a bytes-like object (any registered codec).

    Raw tensors are views of ``buf`` unless ``copy``; ``out`` maps name paths (tuples) to
    arrays to decode into. Malformed input raises a subclass of :class:`WireError`.
    """
    return decode_message(buf, limits=limits, codec_lookup=get_codec, out=out, copy=copy)


__all__ = [
    "TLS",
    "AuthenticationError",
    "BrokerFull",
    "Channel",
    "DeliveryUncertain",
    "EncodedMessage",
    "GatherTimeout",
    "Hub",
    "Keys",
    "Limits",
    "Message",
    "MissingDependency",
    "PeerGone",
    "TensorwireError",
    "TransferRecord",
    "TransportError",
    "TransportTimeout",
    "UnknownHost",
    "VersionMismatch",
    "WireError",
    "__version__",
    "connect",
    "decode",
    "encode",
    "serve",
]
