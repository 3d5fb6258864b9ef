"""The connection from one rank to another: a thread that sends what operations post (and a
heartbeat when idle), and a thread that reads everything the peer sends.

The reader never stops reading, so a peer's sends never block on this rank being busy, and a
closed connection, an abort notice or a bye is seen at once, whatever the operation waits on.
An operation can say where a coming data message belongs (:meth:`RankConnection.expect`): the
reader then decodes it straight into that array.
"""

from __future__ import annotations

import socket
import threading
import time
from collections import deque

import numpy as np

from tensorwire.collective import messages
from tensorwire.collective.state import GroupState, abort_notice
from tensorwire.errors import (
    CollectiveMismatch,
    PeerGone,
    RankFailed,
    TransportTimeout,
    WireError,
)
from tensorwire.transports.sockets import (
    ReadInterrupted,
    StreamReader,
    send_encoded,
    shutdown,
    wake,
    waker,
)
from tensorwire.wire import EncodedMessage, Message

_X = ("x",)  # the path of a data message's one tensor


class RankConnection:
    """The connection to rank ``peer`` over ``sock`` (connected, tuned, past its handshake)."""

    def __init__(
        self,
        peer: int,
        sock: socket.socket,
        reader: StreamReader,
        state: GroupState,
        heartbeat: float,
    ) -> None:
        self.peer = peer
        self.sock = sock
        self._reader = reader
        self._state = state
        self._heartbeat = heartbeat
        self._work = threading.Condition(state.lock)  # the sender waits on it
        self._outbox: deque[tuple[EncodedMessage, float | None, bool]] = deque()
        self.posted = 0  # messages posted to the outbox so far
        self.sent = 0  # ... of which sent (or dropped after a failure)
        self.inbox: deque[Message] = deque()  # data messages not yet taken
        self.taken = 0  # data messages taken from the inbox so far
        self._arrived = 0  # data messages read so far
        self._expected: dict[int, np.ndarray] = {}  # by data-message index: where it goes
        self._next_expected = 0
        self.last_heard = time.monotonic()
        self.peer_seq = 0  # the last operation the peer said it started
        self.gone: str | None = None  # why the peer will send no more (it said bye)
        self.said_bye = False  # the peer closed the group, done with what it had started
        self.fenced = 0  # elastic mode: the last fence the peer sent (see messages.FENCE)
        self._stopping = False
        self._wake_r, self._wake_w = waker()
        self._threads = [
            threading.Thread(
                target=self._send_loop, name=f"rank-connection-{peer}-send", daemon=True
            ),
            threading.Thread(
                target=self._read_loop, name=f"rank-connection-{peer}-read", daemon=True
            ),
        ]
        for t in self._threads:
            t.start()

    # -- what operations call (holding or not holding the state's lock) --------------

    def post(self, enc: EncodedMessage, deadline: float | None, control: bool = False) -> int:
        """Queue ``enc`` to be sent by ``deadline``; returns its ticket (compare with
        :attr:`sent`). Data (not ``control``) is dropped once the group has failed."""
        with self._work:
            self._outbox.append((enc, deadline, control))
            self.posted += 1
            self._work.notify()
            return self.posted

    def notify(self) -> None:
        """Wake the sender to look at the group's state again (call holding the lock)."""
        self._work.notify()

    def expect(self, buf: np.ndarray) -> None:
        """The next data message not yet taken or expected is to be decoded into ``buf``
        (when it has not begun to arrive yet; else the operation copies it there)."""
        with self._state.lock:
            index = max(self._next_expected, self.taken)
            self._next_expected = index + 1
            if index >= self._arrived:
                self._expected[index] = buf
        wake(self._wake_w)

    def take(self) -> Message:
        """The oldest data message not yet taken (call holding the lock, with one there)."""
        self.taken += 1
        return self.inbox.popleft()

    # -- the two threads ---------------------------------------------------------------

    def _send_loop(self) -> None:
        state = self._state
        last_sent = time.monotonic()
        while True:
            with self._work:
                while not self._outbox and not self._stopping:
                    idle = time.monotonic() - last_sent
                    if idle >= self._heartbeat:
                        break
                    self._work.wait(self._heartbeat - idle)
                if self._stopping and not self._outbox:
                    return
                if self._outbox:
                    enc, deadline, control = self._outbox.popleft()
                    counted = True
                else:
                    enc, deadline, control = messages.beat(state.seq), None, True
                    counted = False
                dropped = state.failure is not None and not control
            if not dropped:
                try:
                    send_encoded(self.sock, enc, deadline)
                except TransportTimeout:
                    what = f"took no more of what rank {state.rank} sent it"
                    state.fail(state.blame(self.peer, state.seq, what), tell=True)
                except PeerGone:
                    pass  # the reader sees the end too, after any abort notice sent before it
                last_sent = time.monotonic()
            if counted:
                with self._work:
                    self.sent += 1
                    state.changed.notify_all()

    def _read_loop(self) -> None:
        state = self._state
        stream = self._reader.stream
        while True:
            with state.lock:
                into = self._expected.get(self._arrived)
            stream.set_out({_X: into} if into is not None else None)
            try:
                msg = self._reader.read_message(None, wake=self._wake_r)
            except ReadInterrupted:
                continue  # a new expect(): look again where the next message goes
            except WireError as exc:
                state.fail(RankFailed(self.peer, f"sent an invalid message: {exc}"), tell=True)
                return
            except PeerGone as exc:
                self._lost(f"its connection closed ({exc})")
                return
            self._received(msg)

    def _received(self, msg: Message) -> None:
        state = self._state
        meta = msg.meta
        with state.lock:
            self.last_heard = time.monotonic()
            if msg.kind == messages.DATA:
                self._expected.pop(self._arrived, None)
                self._arrived += 1
                self.peer_seq = max(self.peer_seq, int(meta.get("seq", 0)))
                self.inbox.append(msg)
            elif msg.kind == messages.BEAT:
                self.peer_seq = max(self.peer_seq, int(meta.get("seq", 0)))
            elif msg.kind == messages.ABORT:
                rank, reason = int(meta.get("rank", -1)), str(meta.get("reason", ""))
                rank = self.peer if rank < 0 else rank  # a failure that names no rank
                reason = f"{reason} (as rank {self.peer} found)"
                error = CollectiveMismatch if meta.get("mismatch") else RankFailed
                state.fail(error(rank, reason), tell=False)
            elif msg.kind == messages.BYE:
                self.gone = "left the group (closed it)"
                self.said_bye = True
            elif msg.kind == messages.FENCE:
                self._fenced(int(meta.get("seq", 0)))
            state.changed.notify_all()

    def _fenced(self, seq: int) -> None:
        """Elastic mode: the peer sent all it will send of a failed attempt; what came of it
        (pieces not taken, buffers expected) is forgotten (call holding the lock)."""
        self.fenced = max(self.fenced, seq)
        self.peer_seq = max(self.peer_seq, seq)
        self.inbox.clear()
        self.taken = self._arrived
        self._expected.clear()
        self._next_expected = self._arrived

    def _lost(self, reason: str) -> None:
        state = self._state
        with state.lock:
            if self._stopping or state.closing:
                return
            if self.gone is None:  # told: the others may see this rank's end before the peer's
                state.fail(RankFailed(self.peer, reason), tell=True)
            self.gone = self.gone or reason
            state.changed.notify_all()

    # -- closing ------------------------------------------------------------------------

    def close(self, timeout: float) -> None:
        """Say bye, or why the group failed (within ``timeout`` seconds), then close the
        connection: a peer must not take this end for a failure of this rank's own."""
        if self.gone is None:
            failure = self._state.failure
            last = messages.bye() if failure is None else abort_notice(failure)
            self.post(last, time.monotonic() + timeout, control=True)
        with self._work:
            self._stopping = True
            self._work.notify()
        self._threads[0].join(timeout)
        shutdown(self.sock)
        self.sock.close()
        wake(self._wake_w)
        self._threads[1].join(timeout)
        self._wake_r.close()
        self._wake_w.close()
