"""A toy plugin: ``toy+tcp://`` (tensorwire's tcp under another scheme) and the ``toyxor``
codec (every byte XOR 0x5A: a codec that only its own decoder reverses)."""

from __future__ import annotations

from typing import Any

import numpy as np

from tensorwire.codecs.abc import Codec
from tensorwire.errors import DecompressedSizeMismatch
from tensorwire.transports import TransportEntry
from tensorwire.transports.tcp import TcpChannel, TcpHub


class ToyHub(TcpHub):
    protocol = "toy"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.url = self.url.replace("tcp://", "toy+tcp://", 1)


class ToyChannel(TcpChannel):
    protocol = "toy"


ENTRY = TransportEntry(
    "toy+tcp", "toy_plugin.ToyHub", "toy_plugin.ToyChannel", name="toy", baseline="socket"
)


class ToyXor(Codec):
    codec_id = "toyxor"

    def encode(self, buf: Any) -> Any:
        return np.frombuffer(memoryview(buf).cast("B"), np.uint8) ^ 0x5A

    def decode(self, buf: Any, out: Any = None, *, max_size: int = 1 << 40) -> Any:
        data = np.frombuffer(memoryview(buf).cast("B"), np.uint8) ^ 0x5A
        if out is None:
            return data
        dst = np.frombuffer(memoryview(out).cast("B"), np.uint8)
        if dst.size != data.size:
            raise DecompressedSizeMismatch(f"toyxor: {data.size} bytes, not {dst.size}")
        dst[:] = data
        return out
