"""The receiving side's shared memory: the segments a peer passed, checked and mapped, and
message views that release their segment when the last of them dies."""

from __future__ import annotations

import fcntl
import mmap
import os
import queue
import stat
import time
import weakref
from dataclasses import dataclass
from typing import Any

import numpy as np

from tensorwire.errors import TransportError, TransportTimeout, WireError
from tensorwire.transports.shm.connection import Connection, control_packet, count_of
from tensorwire.transports.shm.options import MAX_MAPPED
from tensorwire.transports.shm.segments import BadSegment


def without_frames(exc: WireError) -> WireError:
    """The error without traceback or chained errors, whose frames would keep views of a
    segment alive (and so the segment held) for as long as the error is kept."""
    exc.__traceback__ = exc.__context__ = exc.__cause__ = None
    return exc


@dataclass(frozen=True)
class Claim:
    """A message announced in a segment: where it lies, checked against the mapping."""

    seg: int
    mm: mmap.mmap
    offset: int
    nbytes: int


class Mappings:
    """The segments one peer passed us, mapped; hands out message views that release
    their segment (through ``releases``) when the last of them is garbage-collected."""

    def __init__(self, conn: Connection, releases: queue.SimpleQueue[Any]) -> None:
        self._conn = conn
        self._releases = releases
        self._maps: dict[int, mmap.mmap] = {}
        self._held: set[int] = set()

    def claim(self, meta: dict[str, Any], fds: list[int]) -> Claim:
        """Check an ``shm`` notification, mapping the segment whose descriptor came with it."""
        seg, offset, nbytes = (count_of(meta, k) for k in ("seg", "offset", "nbytes"))
        if fds:
            self._map(seg, fds.pop(0))
        mm = self._maps.get(seg)
        if mm is None:
            raise BadSegment(f"segment {seg} was never passed on this connection")
        if offset + nbytes > len(mm):
            raise BadSegment(
                f"a message of {nbytes} bytes at offset {offset} overruns segment {seg} "
                f"of {len(mm)} bytes"
            )
        if seg in self._held:
            raise BadSegment(f"segment {seg} was sent again while its last message is in use")
        self._held.add(seg)
        return Claim(seg, mm, offset, nbytes)

    def _map(self, seg: int, fd: int) -> None:
        try:
            if seg in self._maps:
                raise BadSegment(f"segment {seg} was passed twice")
            if len(self._maps) >= MAX_MAPPED:
                raise BadSegment(f"the peer has {MAX_MAPPED} segments mapped here already")
            try:
                seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
                st = os.fstat(fd)
            except OSError:
                raise BadSegment(f"segment {seg}: the descriptor passed is not a memfd") from None
            if not seals & fcntl.F_SEAL_SHRINK or not stat.S_ISREG(st.st_mode):
                raise BadSegment(
                    f"segment {seg} is not sealed against shrinking: the peer could truncate it "
                    "under our mapping"
                )
            if st.st_blocks * 512 < st.st_size:
                raise BadSegment(
                    f"segment {seg} declares {st.st_size} bytes but holds "
                    f"{st.st_blocks * 512}: reading its holes would allocate them here"
                )
            try:
                self._maps[seg] = mmap.mmap(fd, st.st_size, flags=mmap.MAP_SHARED)
            except (OSError, ValueError) as exc:
                raise BadSegment(f"segment {seg} cannot be mapped: {exc}") from None
        finally:
            os.close(fd)

    def open(self, claim: Claim) -> np.ndarray:
        """The claimed message's bytes, as a uint8 array whose death releases the segment."""
        base = np.frombuffer(claim.mm, np.uint8, claim.nbytes, claim.offset)
        weakref.finalize(base, self._released, claim.seg).atexit = False
        return base

    def _released(self, seg: int) -> None:
        # Runs wherever the last view dies, maybe inside our own code: it takes no lock and
        # never blocks. Sent from here when the socket has room, the release goes out before
        # anything this thread sends next (an ack, say), so the sender finds the segment free.
        self._held.discard(seg)
        if not self._conn.alive:
            return
        try:
            self._conn.send([control_packet("release", {"seg": seg})], deadline=time.monotonic())
        except TransportTimeout:
            self._releases.put((self._conn, seg))
        except TransportError:
            pass  # the peer is gone, and with it what it would reuse

    def drop(self, seg: int) -> None:
        """Forget a retired segment; views still alive keep its mapping."""
        self._maps.pop(seg, None)

    def close(self) -> None:
        self._maps.clear()
