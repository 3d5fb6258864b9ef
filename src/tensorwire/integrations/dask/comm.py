"""One Dask comm: Dask's frames of each message carried as one tensorwire message over TCP.

Each Dask message becomes a tensorwire message whose tensors are its frames (uint8, named
``"0"``, ``"1"``, ...), encoded with the comm's codec selector (``"auto"`` by default: each
large frame raw or with the codec that is fastest over the measured link) and an xxh3
checksum; the wire format's own 24-byte prefix (header and body lengths) frames it on the
stream. Bad bytes from a peer raise a :class:`~tensorwire.WireError` that is turned into
Dask's ``CommClosedError`` (the comm is aborted; the listener keeps serving other peers).
"""

from __future__ import annotations

import asyncio
import ipaddress
import time
from typing import Any

import dask.config
import numpy as np
from distributed.comm.core import Comm, CommClosedError
from distributed.comm.utils import from_frames, to_frames

from tensorwire.codecs import AutoCodec, get_codec, resolve_codecs
from tensorwire.errors import WireError
from tensorwire.integrations.dask.protocol import MessageProtocol
from tensorwire.wire import Limits, decode_message, encode_message

OFFLOAD_BYTES = 4 << 20
"""Messages at least this big are encoded / decoded in a worker thread, not the event loop."""
MEASURE_BYTES = 1 << 20
"""Sends at least this big feed their throughput into an ``auto`` selector's bandwidth."""
CLOSE_FLUSH_S = 30.0
"""Seconds ``close`` waits for what was written to reach the kernel before it aborts."""
CONFIG = "distributed.comm.tensorwire"
CHECKSUMS = ("auto", True, False)


def comm_codec() -> Any:
    """The codec selector a new comm uses: Dask config ``distributed.comm.tensorwire.codec``
    (env ``DASK_DISTRIBUTED__COMM__TENSORWIRE__CODEC``), default ``"auto"``."""
    return resolve_codecs(dask.config.get(f"{CONFIG}.codec", default="auto"))


def comm_limits() -> Limits:
    """Wire limits for what a peer may send: ``distributed.comm.tensorwire.max-message-bytes``."""
    most = dask.config.get(f"{CONFIG}.max-message-bytes", default=None)
    return Limits() if most is None else Limits(max_message_bytes=int(most))


def comm_checksum(peer: Any) -> bool:
    """Whether a comm's messages carry xxh3 checksums: Dask config
    ``distributed.comm.tensorwire.checksum`` (env ``DASK_DISTRIBUTED__COMM__TENSORWIRE__CHECKSUM``):
    ``auto`` (default) checksums every message except to a loopback peer (``peer``: the
    socket's peer address), where no link lies between the two copies of the bytes and the
    digests cost each side 0.15 s of CPU per 2 GB; ``true`` / ``false`` always / never."""
    how = dask.config.get(f"{CONFIG}.checksum", default="auto")
    if isinstance(how, str) and how.lower() in ("true", "false"):
        how = how.lower() == "true"
    if how not in CHECKSUMS:
        raise ValueError(f"{CONFIG}.checksum is {how!r}: one of auto, true, false")
    if how != "auto":
        return bool(how)
    try:
        return not ipaddress.ip_address(str(peer[0]).split("%")[0]).is_loopback
    except (TypeError, IndexError, ValueError):
        return True  # not an IP address we know: checked


def frames_to_tensors(frames: list[Any]) -> dict[str, np.ndarray]:
    out = {}
    for i, frame in enumerate(frames):
        mv = memoryview(frame)
        if not mv.contiguous:
            mv = memoryview(mv.tobytes())
        out[str(i)] = np.frombuffer(
            mv.cast("B") if mv.ndim != 1 or mv.format != "B" else mv, np.uint8
        )
    return out


def tensors_to_frames(msg: Any) -> list[memoryview]:
    frames = []
    for i in range(len(msg)):
        arr = msg.get(str(i))
        if arr is None or getattr(arr, "dtype", None) != np.uint8 or arr.ndim != 1:
            raise CommClosedError(f"tensorwire dask message lacks frame {i} as a uint8 vector")
        frames.append(memoryview(arr))
    return frames


def _encoded(
    tensors: dict[str, np.ndarray], codecs: Any, checksum: bool = True
) -> tuple[int, list[Any]]:
    """The message's size and its wire buffers, checksums included if ``checksum``:
    ``frames()`` computes the xxh3 digests, so it runs here, in the thread a big message is
    encoded in, not on the event loop (0.07 s of loop time per GB sent)."""
    enc = encode_message(tensors, codecs=codecs, checksum=checksum)
    return enc.nbytes, list(enc.frames())


class TensorwireComm(Comm):
    """An established connection; ``read``/``write`` move one Dask message each."""

    def __init__(
        self,
        protocol: MessageProtocol,
        local_addr: str,
        peer_addr: str,
        deserialize: bool = True,
    ) -> None:
        super().__init__(deserialize=deserialize)
        self._protocol = protocol
        self._writer: asyncio.Transport | None = protocol.transport
        self._local_addr = local_addr
        self._peer_addr = peer_addr
        self._measuring: set[asyncio.Future[None]] = set()
        self.codecs = comm_codec()
        transport = protocol.transport
        self.checksum = comm_checksum(
            None if transport is None else transport.get_extra_info("peername")
        )

    @property
    def local_address(self) -> str:
        return self._local_addr

    @property
    def peer_address(self) -> str:
        return self._peer_addr

    def closed(self) -> bool:
        return self._writer is None

    async def read(self, deserializers: Any = None) -> Any:
        if self._writer is None:
            raise CommClosedError(f"{self!r} is closed")
        try:
            whole = await self._protocol.read()
            limits = self._protocol.limits
            if len(whole) >= OFFLOAD_BYTES:
                msg = await asyncio.to_thread(
                    decode_message, whole, limits=limits, codec_lookup=get_codec
                )
            else:
                msg = decode_message(whole, limits=limits, codec_lookup=get_codec)
            frames = tensors_to_frames(msg)
        except (ConnectionError, OSError) as e:
            self.abort()
            raise CommClosedError(f"in {self!r}: {type(e).__name__}: {e}") from e
        except WireError as e:
            self.abort()
            raise CommClosedError(f"in {self!r}: peer sent a bad message: {e}") from e
        except BaseException:
            self.abort()  # cancelled mid-message: what is left on the stream is unknown
            raise
        try:
            return await from_frames(
                frames,
                deserialize=self.deserialize,
                deserializers=deserializers,
                allow_offload=self.allow_offload,
            )
        except EOFError as e:
            self.abort()
            raise CommClosedError(f"in {self!r}: truncated Dask frames") from e

    async def write(self, msg: Any, serializers: Any = None, on_error: str = "message") -> int:
        if self._writer is None:
            raise CommClosedError(f"{self!r} is closed")
        frames = await to_frames(
            msg,
            allow_offload=self.allow_offload,
            serializers=serializers,
            on_error=on_error,
            context={
                "sender": self.local_info,
                "recipient": self.remote_info,
                **self.handshake_options,
            },
        )
        tensors = frames_to_tensors(frames)
        raw = sum(t.nbytes for t in tensors.values())
        if raw >= OFFLOAD_BYTES:
            nbytes, wire = await asyncio.to_thread(_encoded, tensors, self.codecs, self.checksum)
        else:
            nbytes, wire = _encoded(tensors, self.codecs, self.checksum)
        outbox = self._protocol.outbox
        if self._writer is None or outbox is None:
            raise CommClosedError(f"{self!r} is closed")
        try:
            # like Dask's tcp comm, queue the frames as they are and return: a write does not
            # wait for the peer to read (both sides may write a big message before either reads)
            outbox.put(wire)
        except (ConnectionError, OSError) as e:
            self.abort()
            raise CommClosedError(f"in {self!r}: {type(e).__name__}: {e}") from e
        except BaseException:
            self.abort()
            raise
        if isinstance(self.codecs, AutoCodec) and nbytes >= MEASURE_BYTES:
            task = asyncio.ensure_future(self._measure(nbytes, time.perf_counter()))
            self._measuring.add(task)
            task.add_done_callback(self._measuring.discard)
        return nbytes

    async def _measure(self, nbytes: int, started: float) -> None:
        """Feed the time the kernel took to accept a big message into ``auto``'s bandwidth."""
        try:
            await self._protocol.drain()
        except (ConnectionError, OSError):
            return  # the next read or write says so
        seconds = time.perf_counter() - started
        if seconds > 0 and isinstance(self.codecs, AutoCodec):
            self.codecs.update_bandwidth(nbytes / seconds)

    async def close(self) -> None:
        writer, self._writer = self._writer, None
        if writer is None:
            return
        try:
            if self._protocol.outbox is not None:  # what was written goes first, as Dask's does
                await asyncio.wait_for(self._protocol.outbox.flushed(), CLOSE_FLUSH_S)
            if writer.can_write_eof():
                writer.write_eof()
        except TimeoutError:  # (an OSError) a peer that reads nothing: waited for no longer
            writer.abort()
            return
        except (ConnectionError, OSError):
            pass
        writer.close()  # sends what is queued, then closes

    def abort(self) -> None:
        writer, self._writer = self._writer, None
        if writer is not None:
            writer.abort()
