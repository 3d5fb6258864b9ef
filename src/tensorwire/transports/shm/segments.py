"""The sending side's shared memory: a segment is a sealed, fully allocated memfd that a
message is written into once, and every receiver it is passed to maps."""

from __future__ import annotations

import contextlib
import fcntl
import mmap
import os
import time

from tensorwire.errors import WireError
from tensorwire.transports.shm.connection import Connection
from tensorwire.transports.shm.options import ALIGN
from tensorwire.wire import EncodedMessage


class BadSegment(WireError):
    """A peer named a shared segment that is missing, unsealed, sparse, too small or still in
    use."""


class Segment:
    """A sealed memfd this side writes messages into; ``holders`` have not released it."""

    def __init__(self, seg_id: int, size: int) -> None:
        self.id = seg_id
        self.size = size
        self.fd = os.memfd_create(f"tensorwire-{seg_id}", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.ftruncate(self.fd, size)
            os.posix_fallocate(self.fd, 0, size)  # receivers refuse sparse segments
            seals = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL
            fcntl.fcntl(self.fd, fcntl.F_ADD_SEALS, seals)
            self.mm = mmap.mmap(self.fd, size, flags=mmap.MAP_SHARED)
        except BaseException:
            os.close(self.fd)
            raise
        self.holders: set[Connection] = set()
        self.mapped_by: set[Connection] = set()  # receivers that have its descriptor
        self.last_used = time.monotonic()

    def write(self, enc: EncodedMessage) -> int:
        """Copy ``enc`` in (computing its digests on the way); return where it starts."""
        offset = -len(enc.head) % ALIGN
        pos = offset
        with memoryview(self.mm) as mv:
            for batch in enc.segments():
                for piece in batch:
                    end = pos + len(piece)
                    mv[pos:end] = piece
                    pos = end
        return offset

    def close(self) -> None:
        with contextlib.suppress(BufferError):  # a view still exported: the GC unmaps it
            self.mm.close()
        os.close(self.fd)
