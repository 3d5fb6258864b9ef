"""The connection from one rank to another: a thread that sends what operations post (and a
heartbeat when idle), and a thread that reads everything the peer sends.

A small piece posted when nothing else is queued or going out is sent by the operation's own
thread (:meth:`RankConnection.send`): a hand-over to the sender thread costs a thread wake-up
per message, more than the send itself. Bigger ones go through the sender, so that an
operation keeps receiving (and reducing) while its pieces go out.

An operation on small tensors reads its links itself (see
:mod:`~tensorwire.collective.inline_reads`): the reader steps aside when asked
(:meth:`RankConnection.hand_over`) and takes the link back once no operation has read it
for a heartbeat's time, or when an operation gives it back.

The reader never stops reading, so a peer's sends never block on this rank being busy, and a
closed connection, an abort notice or a bye is seen at once, whatever the operation waits on.
An operation can say where a coming data message belongs (:meth:`RankConnection.expect`): the
reader then decodes it straight into that array.
"""

from __future__ import annotations

import ipaddress
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
INLINE_BYTES = 256 << 10
"""Messages up to this size are sent by the posting thread when the link is idle: the
kernel's socket buffer takes them at once (a peer's reader always drains it)."""


def _over_loopback(sock: socket.socket) -> bool:
    """True when ``sock`` (or the socket under a sealed stream) is connected to a loopback
    address (its bytes stay in memory)."""
    try:
        raw = getattr(sock, "sock", sock)  # a TlsStream's socket
        return ipaddress.ip_address(raw.getpeername()[0]).is_loopback
    except (OSError, ValueError, TypeError, IndexError):  # not an IP socket, or gone
        return False


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
        self.loopback = _over_loopback(sock)
        # checksum="auto" adds digests where bytes leave memory unchecked: not over loopback,
        # nor on a sealed link (each record's AEAD tag already proves its bytes)
        self.checked = self.loopback or hasattr(sock, "getpeercert")
        self._reader = reader
        self._state = state
        self._heartbeat = heartbeat
        self._work = threading.Condition(state.lock)  # the sender waits on it
        self._outbox: deque[tuple[EncodedMessage, float | None, bool]] = deque()
        self.posted = 0  # messages posted to the outbox (or sent at once) so far
        self.sent = 0  # ... of which sent (or dropped after a failure)
        self._sending = False  # a thread is sending on the socket
        self._last_sent = time.monotonic()
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
        self._close_by: float | None = None  # set by end_sending: when to stop waiting
        self.op_reads = False  # the operation's thread reads this link (the reader steps aside)
        self.reader_parked = False  # ... and the reader has stepped aside
        self.reader_done = False  # the reader saw the link's end (or a bad message)
        self._resume = threading.Condition(state.lock)  # a parked reader waits on it
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

    def send(self, enc: EncodedMessage, deadline: float | None) -> int:
        """:meth:`post` a data message, sent by this thread when it is small and the link
        idle (nothing queued or going out); returns its ticket."""
        state = self._state
        with self._work:
            small = enc.nbytes <= INLINE_BYTES
            while small and self._sending and not self._outbox and not self._stopping:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    break  # queued: the sender's send runs out of time, and says so
                self._work.wait(left)  # a heartbeat (or the sender's last piece) going out
            if self._outbox or self._sending or not small:
                self._outbox.append((enc, deadline, False))
                self.posted += 1
                self._work.notify()
                return self.posted
            self._sending = True
            self.posted += 1
            ticket = self.posted
            dropped = state.failure is not None
        if not dropped:
            self._transmit(enc, deadline)
        with self._work:
            self._sending = False
            self.sent += 1
            if self._outbox or self._stopping:
                self._work.notify()
        return ticket

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
            if self.reader_parked or index != self._arrived:
                return  # the reader looks for it as that message begins
        wake(self._wake_w)

    def take(self) -> Message:
        """The oldest data message not yet taken (call holding the lock, with one there)."""
        self.taken += 1
        return self.inbox.popleft()

    # -- the two threads ---------------------------------------------------------------

    def _transmit(self, enc: EncodedMessage, deadline: float | None) -> None:
        """Send ``enc`` on the socket (one thread at a time: see :attr:`_sending`)."""
        state = self._state
        try:
            send_encoded(self.sock, enc, deadline)
        except TransportTimeout:
            what = f"took no more of what rank {state.rank} sent it"
            state.fail(state.blame(self.peer, state.seq, what), tell=True)
        except PeerGone:
            pass  # the reader sees the end too, after any abort notice sent before it
        self._last_sent = time.monotonic()

    def _send_loop(self) -> None:
        state = self._state
        while True:
            with self._work:
                while True:
                    if self._sending:  # an operation's thread is sending: it notifies
                        self._work.wait(self._heartbeat)
                        continue
                    if self._outbox:
                        break
                    if self._stopping:
                        return
                    idle = time.monotonic() - self._last_sent
                    if idle >= self._heartbeat:
                        break
                    self._work.wait(self._heartbeat - idle)
                if self._outbox:
                    enc, deadline, control = self._outbox.popleft()
                    counted = True
                else:
                    enc, deadline, control = messages.beat(state.seq), None, True
                    counted = False
                dropped = state.failure is not None and not control
                self._sending = True
            if not dropped:
                self._transmit(enc, deadline)
            with self._work:
                self._sending = False
                if counted:
                    self.sent += 1
                self._work.notify_all()  # an operation's thread waiting to send
                state.notify()

    def _read(self, deadline: float | None, wake_r: socket.socket | None) -> Message | None:
        """The next message, decoded into the array expected for it if there is one; None
        when woken through ``wake_r``, or by ``deadline`` (what came of a message is kept);
        None too when the link ended or sent garbage (the group is told)."""
        state = self._state
        with state.lock:
            into = self._expected.get(self._arrived)
        self._reader.stream.set_out({_X: into} if into is not None else None)
        try:
            return self._reader.read_message(deadline, wake=wake_r)
        except (ReadInterrupted, TransportTimeout):
            return None  # woken (a new expect(), or asked to step aside), or nothing more yet
        except WireError as exc:
            self.reader_done = True
            state.fail(RankFailed(self.peer, f"sent an invalid message: {exc}"), tell=True)
        except PeerGone as exc:
            self.reader_done = True
            self._lost(f"its connection closed ({exc})")
        return None

    def _read_loop(self) -> None:
        while not self.reader_done:
            self._wait_turn()
            msg = self._read(None, self._wake_r)
            if msg is not None:
                self._received(msg)
        with self._state.lock:
            self.reader_done = True
            self._state.notify()

    def _wait_turn(self) -> None:
        """Step aside while the operation's thread reads the link. Closing, the reader
        reads on to the end: a socket closed with bytes unread would reset the peer's."""
        state = self._state
        with state.lock:
            while self.op_reads and not self._stopping:
                self.reader_parked = True
                state.notify()
                self._resume.wait(self._heartbeat)
                if not state.polling and time.monotonic() - state.inline_at >= self._heartbeat:
                    self.op_reads = False  # no operation read it for a while: take it back
            self.op_reads = False
            self.reader_parked = False

    # -- reading by the operation's thread ----------------------------------------------

    def hand_over(self) -> bool:
        """Ask the reader to step aside (call holding the lock); True once the operation's
        thread may read the link with :meth:`read_ready`."""
        if not self.op_reads:
            self.op_reads = True
            wake(self._wake_w)
        return self.reader_parked and not self.reader_done

    def give_back(self) -> None:
        """Let the reader read the link again (call holding the lock)."""
        if self.op_reads:
            self.op_reads = False
            self._resume.notify()

    def read_ready(self) -> None:
        """Read every whole message already there, without waiting (the operation's
        thread, once :meth:`hand_over` said it may)."""
        while not self.reader_done:
            msg = self._read(time.monotonic(), None)
            if msg is None:
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
                # nothing more for it: our end lets its close finish (see close())
                shutdown(self.sock, socket.SHUT_WR)
            elif msg.kind == messages.FENCE:
                self._fenced(int(meta.get("seq", 0)))
            state.notify()

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
            state.notify()

    # -- closing ------------------------------------------------------------------------

    def end_sending(self, deadline: float) -> None:
        """Say bye, or why the group failed (by ``deadline``), then shut this end's sending
        side only: after a bye, the reader reads on until the peer ends its side too (it
        does on reading the bye). A socket closed with bytes unread resets the connection,
        and a reset can take from the peer what this rank sent last (its bye, or what a
        barrier waits for), as a proxy between the two does."""
        if self._close_by is not None:
            return
        self._close_by = deadline
        if self.gone is None:
            failure = self._state.failure
            last = messages.bye() if failure is None else abort_notice(failure)
            self.post(last, deadline, control=True)
            if failure is not None:  # a failed group's peers may not end theirs soon
                self._close_by = time.monotonic()
        with self._work:
            self._stopping = True
            self._work.notify()
            self._resume.notify()
        self._threads[0].join(max(0.0, deadline - time.monotonic()))
        shutdown(self.sock, socket.SHUT_WR)

    def close(self, timeout: float) -> None:
        """:meth:`end_sending` (unless done), wait for the peer's end until its deadline,
        then close the connection: a peer must not take this end for a failure of this
        rank's own."""
        self.end_sending(time.monotonic() + timeout)
        assert self._close_by is not None
        self._threads[1].join(max(0.0, self._close_by - time.monotonic()))
        shutdown(self.sock)
        self.sock.close()
        wake(self._wake_w)
        self._threads[1].join(timeout)
        self._wake_r.close()
        self._wake_w.close()
