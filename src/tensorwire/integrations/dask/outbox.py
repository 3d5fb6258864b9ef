"""What a comm has written and the kernel has not taken yet: its frames, kept as they are and
sent straight from them as the socket drains.

asyncio's selector transport before Python 3.12 copies whatever one ``send()`` does not take
into a bytearray, and takes one buffer per ``write``. The outbox holds the message's frames
as memoryviews and sends them itself, as tornado's ``IOStream`` (under Dask's tcp comm) does:
``sendmsg`` with the next few frames until the socket's buffer is full (a short send), then
again when the loop reports the socket writable. Nothing is copied, and a 48 MB message takes
about as many ``send`` calls as the kernel's buffer needs (feeding asyncio 1 MiB at a time and
waiting for its buffer to empty made 2.4x tornado's calls and copied each short send's rest).

The outbox writes on its own duplicate of the transport's socket (the loop refuses a writer
callback on a transport's descriptor); the transport keeps reading, and its ``write`` is not
used while the outbox holds anything. Writes return at once, in order, as Dask's tcp comm's do.
"""

from __future__ import annotations

import asyncio
import socket
from collections import deque
from collections.abc import Callable
from typing import Any

BATCH = 64
"""Frames handed to one ``sendmsg`` (a message's frames alternate data and 8-byte digests)."""
SENDS = 64
"""``sendmsg`` calls at most per turn of the event loop; the rest when the socket is writable
again (the loop runs other callbacks between)."""
_FLAGS = getattr(socket, "MSG_NOSIGNAL", 0)  # a closed peer is an EPIPE error, not SIGPIPE


class Outbox:
    def __init__(
        self,
        transport: asyncio.Transport,
        sock: socket.socket,
        on_error: Callable[[OSError], object],
    ) -> None:
        """``sock``: a non-blocking duplicate of the transport's socket, which the caller
        closes after ``lost()``. ``on_error`` is told of a send that failed while no write
        was running (the connection is then broken: it should abort the transport)."""
        self._transport: asyncio.Transport | None = transport
        self._on_error = on_error
        self._loop = asyncio.get_running_loop()
        self._sock: socket.socket | None = sock
        self._pending: deque[memoryview] = deque()
        self._watching = False  # a writer callback is registered on self._sock
        self._flushed: asyncio.Future[None] | None = None

    def put(self, frames: list[Any]) -> None:
        """Queue ``frames`` (bytes-likes) after what is queued, and send what the socket takes;
        ``ConnectionResetError`` once the connection is lost, ``OSError`` if a send fails."""
        if self._transport is None:
            raise ConnectionResetError("the connection is lost: nothing more can be sent")
        views = (memoryview(f).cast("B") for f in frames)
        self._pending.extend(v for v in views if v.nbytes)
        if not self._watching:  # else the writer callback is already due
            self._send()

    def lost(self) -> None:
        """The connection is gone: what is queued will never be sent."""
        self._transport = None
        self._pending.clear()
        self._unwatch()
        self._sock = None
        self._wake()

    @property
    def empty(self) -> bool:
        """Nothing queued: everything written has gone to the kernel, or never will."""
        return not self._pending

    async def flushed(self) -> None:
        """Wait until everything written has gone to the kernel (or the connection is lost)."""
        while not self.empty:
            if self._flushed is None or self._flushed.done():
                self._flushed = self._loop.create_future()
            await self._flushed

    def _send(self) -> None:
        """Send what the socket takes now (at most ``SENDS`` calls); watch for writability
        while anything is left."""
        sock, pending, t = self._sock, self._pending, self._transport
        if sock is None or t is None:
            return
        for _ in range(SENDS):
            if not pending or t.is_closing():
                break
            batch = [pending[i] for i in range(min(BATCH, len(pending)))]
            try:
                sent = sock.sendmsg(batch, (), _FLAGS)
            except (BlockingIOError, InterruptedError):
                break
            if not self._advance(sent):
                break  # a short send: the socket's buffer is full until the loop says not
        if pending and not t.is_closing():
            self._watch()
        else:
            self._unwatch()
            self._wake()

    def _advance(self, sent: int) -> bool:
        """Drop ``sent`` bytes from the front of the queue; whether a whole batch went."""
        pending = self._pending
        for _ in range(BATCH):
            head = pending[0]
            if sent < head.nbytes:
                pending[0] = head[sent:]
                return False
            sent -= head.nbytes
            pending.popleft()
            if not pending:
                break
        return True

    def _writable(self) -> None:
        try:
            self._send()
        except OSError as e:  # the peer reset the connection, or the like
            self._pending.clear()
            self._unwatch()
            self._on_error(e)

    def _watch(self) -> None:
        if not self._watching and self._sock is not None:
            self._loop.add_writer(self._sock.fileno(), self._writable)
            self._watching = True

    def _unwatch(self) -> None:
        if self._watching and self._sock is not None:
            self._loop.remove_writer(self._sock.fileno())
        self._watching = False

    def _wake(self) -> None:
        if self._flushed is not None and not self._flushed.done():
            self._flushed.set_result(None)
