"""A hub's state for one session (its peer): the hello, the session machine, and the queue
of jobs its downlink thread writes."""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass, field

from tensorwire.errors import PeerGone
from tensorwire.transports.session import Hello, HubSession, bye
from tensorwire.wire import EncodedMessage


@dataclass(eq=False)
class Job:
    """A message (or a control message's bytes) for a peer's downlink."""

    enc: EncodedMessage | None = None
    control: bytes | None = None
    done: threading.Event = field(default_factory=threading.Event)
    error: Exception | None = None
    abandoned: bool = False  # its sender timed out: write no more of it
    finished_at: float = 0.0  # time.perf_counter() when written (or failed)


@dataclass(eq=False)
class Peer:
    """A session: its hello, its session machine, and its downlink's job queue and state
    (guarded by ``lock``)."""

    hello: Hello
    session: HubSession
    tls_name: str | None  # its downlink's certificate name: its uplink must carry the same
    jobs: queue.SimpleQueue[Job | None] = field(default_factory=queue.SimpleQueue)
    lock: threading.Lock = field(default_factory=threading.Lock)
    attached: bool = False  # its uplink arrived (set under the hub's Pairing lock)
    gone: str | None = None  # why no more data may be written to it

    @property
    def client_id(self) -> str:
        return self.hello.client_id

    def submit(self, job: Job) -> None:
        with self.lock:
            if self.gone is not None:
                raise PeerGone(f"client {self.client_id!r} is gone: {self.gone}")
            self.jobs.put(job)

    def stop(self, reason: str) -> None:
        """Refuse further data, queue a ``bye`` (once), and let the downlink end."""
        with self.lock:
            if self.gone is not None:
                return
            self.gone = reason
            self.jobs.put(Job(control=bye(reason).to_bytes()))
            self.jobs.put(None)
