"""An asyncio protocol that receives whole tensorwire messages straight into their buffers.

The kernel writes each message's bytes into one buffer (``BufferedProtocol.get_buffer``),
sized from the message's 24-byte prefix once that is checked against the limits: no copy
out of a stream buffer. The buffer grows with what has arrived (up to the declared size), so
a prefix that declares much and sends little costs little. A message over ``FIRST_BYTES``
goes from its first byte into an anonymous memory map that grows in place (``mremap``: no
copy of what has arrived, pages made only as bytes land in them), advised to use huge pages
(``MADV_HUGEPAGE``, as numpy does for its big arrays and so Dask's tcp comm for the frames
it receives): with 4 KiB pages, faulting in each page as ``recv`` writes it cost the event
loop 3x the CPU per byte. Each time the socket is readable, the protocol reads on until it
is empty (``READS``), on its own duplicate of the socket, which the outbox also sends on. At
most ``QUEUED`` whole messages wait to be read; past that the socket is not read
(backpressure to the sender).
"""

from __future__ import annotations

import asyncio
import contextlib
import mmap
import socket
from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np

from tensorwire.errors import WireError
from tensorwire.integrations.dask.outbox import Outbox
from tensorwire.wire import PREFIX_SIZE, Limits
from tensorwire.wire.format import parse_prefix

FIRST_BYTES = 16 << 20
"""A message's buffer (a numpy array, then a memory map) starts at most this big and doubles
as its bytes arrive."""
QUEUED = 8
READS = 16
"""``recv`` calls at most per time the loop reports the socket readable (asyncio makes one
per turn of the loop; a turn each cost the reader 2x the user CPU of Dask's tcp comm)."""
_HUGE = getattr(mmap, "MADV_HUGEPAGE", None)  # Linux only


class MessageProtocol(asyncio.BufferedProtocol):
    def __init__(
        self, limits: Limits, on_made: Callable[[MessageProtocol], object] | None = None
    ) -> None:
        self.limits = limits
        self.on_made = on_made
        self.transport: asyncio.Transport | None = None
        self._messages: deque[Any] = deque()  # whole messages' buffers
        self._error: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None
        self.outbox: Outbox | None = None  # once connected
        self._sock: socket.socket | None = None  # likewise
        self._lent: Any = None  # the buffer asyncio was last given a view of
        self._new_message()

    def _new_message(self) -> None:
        self._buf: Any = bytearray(PREFIX_SIZE)  # then a numpy array, or an mmap for a big one
        self._got = 0
        self._total = 0  # 0: reading the prefix
        self._grow_to = 0  # the size the buffer takes before the next read into it (0: as it is)

    # asyncio callbacks
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        # the protocol's own descriptor of the socket: the loop lets no callback but the
        # transport's on the transport's descriptor
        self._sock = transport.get_extra_info("socket").dup()
        self._sock.setblocking(False)
        self.outbox = Outbox(transport, self._sock, self._fail)
        if self.on_made is not None:
            self.on_made(self)

    def get_buffer(self, sizehint: int) -> memoryview:
        self._grow()
        self._lent = self._buf
        return memoryview(self._buf)[self._got :]

    def buffer_updated(self, nbytes: int) -> None:
        self._took(nbytes)
        for _ in range(READS - 1):  # asyncio made one recv; the rest until the socket is empty
            if not self._read_more():
                break

    def _grow(self) -> None:
        if self._grow_to:
            big = self._total > FIRST_BYTES
            self._buf = _grown(self._buf, self._got, self._grow_to, big)
            self._grow_to = 0

    def _read_more(self) -> bool:
        """One more ``recv`` into the current message's buffer; whether it got bytes."""
        sock, t = self._sock, self.transport
        if sock is None or t is None or not t.is_reading() or self._error is not None:
            return False
        if self._grow_to and self._buf is self._lent and isinstance(self._buf, mmap.mmap):
            return False  # asyncio holds a view of this map until buffer_updated returns,
            # and a map with a view on it cannot be resized: get_buffer grows it
        self._grow()
        try:
            with memoryview(self._buf) as whole, whole[self._got :] as room:
                nbytes = sock.recv_into(room)
        except (BlockingIOError, InterruptedError):
            return False
        except OSError as e:
            self._fail(e)
            return False
        if nbytes == 0:  # end of stream: the transport's next read sees it too
            return False
        self._took(nbytes)
        return True

    def _took(self, nbytes: int) -> None:
        """``nbytes`` more of the current message arrived in its buffer."""
        self._got += nbytes
        if self._got < len(self._buf):
            return
        if self._total == 0:
            try:
                prefix = parse_prefix(self._buf, self.limits)
            except WireError as e:
                self._fail(e)
                return
            self._total = PREFIX_SIZE + prefix.header_length + prefix.body_length
        if self._got < self._total:  # grow toward the declared size as bytes arrive
            self._grow_to = min(self._total, max(FIRST_BYTES, 2 * len(self._buf)))
            return
        self._messages.append(self._buf)
        self._new_message()
        if len(self._messages) >= QUEUED and self.transport is not None:
            self.transport.pause_reading()
        self._wake()

    def eof_received(self) -> bool:
        self._fail(ConnectionResetError("the peer closed the connection"))
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(exc or ConnectionResetError("connection closed"))
        if self.outbox is not None:
            self.outbox.lost()
        sock, self._sock = self._sock, None
        if sock is not None:
            sock.close()

    # used by the comm
    def _fail(self, exc: BaseException) -> None:
        if self._error is None:
            self._error = exc
        if self.transport is not None:
            self.transport.abort()
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def read(self) -> Any:
        """The next whole message's bytes; the error that ended the connection after that."""
        while not self._messages:
            if self._error is not None:
                raise self._error
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter
        msg = self._messages.popleft()
        if len(self._messages) == QUEUED - 1 and self.transport is not None:
            self.transport.resume_reading()
        return msg

    async def drain(self) -> None:
        """Wait until everything written has gone to the kernel."""
        if self.outbox is not None:
            await self.outbox.flushed()
        if self._error is not None:
            raise ConnectionResetError(str(self._error))


def _grown(buf: Any, got: int, size: int, big: bool = False) -> Any:
    """``buf`` (its first ``got`` bytes kept) made ``size`` bytes long: a numpy array, or for a
    ``big`` message (over ``FIRST_BYTES``) a memory map resized in place."""
    if not big and size <= FIRST_BYTES:
        # not zero-filled (a bytearray is: a pass over every byte before the kernel writes
        # them); a message is read only once all its bytes arrived, so none is unwritten
        bigger = np.empty(size, np.uint8)
        bigger[:got] = np.frombuffer(buf, np.uint8, count=got)
        return bigger
    if isinstance(buf, mmap.mmap):
        try:
            buf.resize(size)  # mremap: the pages move, their bytes are not copied
            return buf
        except (OSError, SystemError):  # no mremap (macOS): a new map and a copy
            pass
    # private: a shared anonymous map is a fixed-size object that mremap cannot grow (SIGBUS)
    grown = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if _HUGE is not None:  # 2 MiB pages where the kernel has them: 512x fewer faults
        with contextlib.suppress(OSError):  # none here: 4 KiB pages, as before
            grown.madvise(_HUGE)
    grown[:got] = memoryview(buf)[:got]
    return grown
