"""What a comm has written and the kernel has not taken yet: its frames, kept as they are and
fed to the transport as the socket drains.

Before Python 3.12, asyncio's selector transport copies whatever one ``send()`` does not take
into a bytearray: a 100 MB message written at once was a copy of nearly 100 MB before a byte
of it left (Dask's tcp comm queues memoryviews in tornado instead). The outbox holds the
message's frames as memoryviews and gives the transport at most ``CHUNK`` bytes at a time,
the next once the transport's buffer is empty (its write limits are 0: ``pause_writing``
on anything left, ``resume_writing`` when it has gone), so at most one chunk is ever copied.
Writes return at once, in order, as Dask's tcp comm's do.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any

CHUNK = 1 << 20
"""Bytes handed to the transport at a time: a few loopback ``send()`` calls' worth."""


class Outbox:
    def __init__(self, transport: asyncio.Transport) -> None:
        self._transport: asyncio.Transport | None = transport
        transport.set_write_buffer_limits(high=0)  # paused while anything is left in it
        self._pending: deque[memoryview] = deque()
        self._paused = False
        self._flushed: asyncio.Future[None] | None = None

    def put(self, frames: list[Any]) -> None:
        """Queue ``frames`` (bytes-likes) after what is queued, and send what the socket takes;
        ``ConnectionResetError`` once the connection is lost."""
        if self._transport is None:
            raise ConnectionResetError("the connection is lost: nothing more can be sent")
        views = (memoryview(f).cast("B") for f in frames)
        self._pending.extend(v for v in views if v.nbytes)
        self._pump()

    def paused(self) -> None:
        """The transport's buffer holds bytes: hand it no more until it is empty."""
        self._paused = True

    def resumed(self) -> None:
        """The transport's buffer is empty: the next chunk."""
        self._paused = False
        self._pump()

    def lost(self) -> None:
        """The connection is gone: what is queued will never be sent."""
        self._transport = None
        self._pending.clear()
        self._wake()

    @property
    def empty(self) -> bool:
        """Nothing queued here and nothing left in the transport's buffer."""
        t = self._transport
        return not self._pending and (t is None or t.get_write_buffer_size() == 0)

    async def flushed(self) -> None:
        """Wait until everything written has gone to the kernel (or the connection is lost)."""
        while not self.empty:
            if self._flushed is None or self._flushed.done():
                self._flushed = asyncio.get_running_loop().create_future()
            await self._flushed

    def _pump(self) -> None:
        t = self._transport
        while t is not None and self._pending and not self._paused and not t.is_closing():
            piece = self._pending.popleft()
            if len(piece) > CHUNK:
                self._pending.appendleft(piece[CHUNK:])
                piece = piece[:CHUNK]
            t.write(piece)  # may call paused() before it returns
        if self.empty:
            self._wake()

    def _wake(self) -> None:
        if self._flushed is not None and not self._flushed.done():
            self._flushed.set_result(None)
