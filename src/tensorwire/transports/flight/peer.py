"""A hub's state for one session (its peer): the hello, the session machine, and the queue
of jobs its downlink coroutine writes."""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from tensorwire.errors import PeerGone
from tensorwire.transports.session import Hello, HubSession, bye


@dataclass(eq=False)
class Job:
    """A message (its frames) or a control message's bytes for a peer's downlink."""

    frames: Iterable[bytes] | None = None  # its FlightData (frames.message_frames)
    control: bytes | None = None
    done: threading.Event = field(default_factory=threading.Event)
    error: Exception | None = None
    abandoned: bool = False  # its sender timed out: write no more of it
    finished_at: float = 0.0  # time.perf_counter() when written (or failed)


@dataclass(eq=False)
class Peer:
    """A session: its hello, its session machine, and its downlink's job queue and state
    (guarded by ``lock``). ``post`` runs a function on the hub's loop later (from any
    thread, the loop's own included); ``wake`` is set there when jobs are queued."""

    hello: Hello
    session: HubSession
    tls_name: str | None  # its downlink's certificate name: its uplink must carry the same
    post: Callable[..., object]
    jobs: deque[Job | None] = field(default_factory=deque)
    lock: threading.Lock = field(default_factory=threading.Lock)
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    attached: bool = False  # its uplink arrived (set under the hub's Pairing lock)
    gone: str | None = None  # why no more data may be written to it
    downlink: asyncio.Task[Any] | None = None  # the task writing it, ended if it hangs
    cut: bool = False  # its downlink task was cancelled by :meth:`stop`, not by gRPC
    _posted: bool = False

    @property
    def client_id(self) -> str:
        return self.hello.client_id

    def submit(self, job: Job) -> None:
        with self.lock:
            if self.gone is not None:
                raise PeerGone(f"client {self.client_id!r} is gone: {self.gone}")
            self._queue(job)

    def stop(self, reason: str, linger: float) -> None:
        """Refuse further data, queue a ``bye`` (once), and let the downlink end; cut it
        ``linger`` seconds later if it is still writing (its client stopped reading)."""
        with self.lock:
            if self.gone is not None:
                return
            self.gone = reason
            self._queue(Job(control=bye(reason).to_bytes()))
            self._queue(None)
        self.post(self._cut_later, linger)

    async def next_job(self) -> Job | None:
        """The next job, waiting for one (on the loop)."""
        while True:
            with self.lock:
                if self.jobs:
                    return self.jobs.popleft()
                self.wake.clear()
            await self.wake.wait()

    def _queue(self, job: Job | None) -> None:  # under self.lock
        self.jobs.append(job)
        if not self._posted:  # one wake-up however many jobs a turn of the loop brings
            self._posted = True
            self.post(self._woken)

    def _woken(self) -> None:
        with self.lock:
            self._posted = False
        self.wake.set()

    def _cut_later(self, linger: float) -> None:
        if self.downlink is not None and not self.downlink.done():
            asyncio.get_running_loop().call_later(linger, self._cut)

    def _cut(self) -> None:
        if self.downlink is not None and not self.downlink.done():
            self.cut = True
            self.downlink.cancel()
