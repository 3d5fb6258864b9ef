"""The ``tcp://`` hub: a listener, a thread per connection, sends from the caller's thread.

Each connection has its own thread on the hub (:class:`~tensorwire.transports.sockets.Listener`);
sends use ``sendmsg`` scatter-gather from the caller's thread. The socket stays blocking (see
:mod:`~tensorwire.transports.sockets.sendmsg`), so a send's deadline never disturbs the reader.

Reading is a turn (as on ``zmq+tcp://``): while the hub has one client, a thread in
``hub.recv`` reads its connection itself and returns the message it completes, so a message
is not handed from the reader thread to the caller (a futex and a thread switch each way).
The connection's reader thread waits in ``poll`` on the socket and a wake-up socketpair, and
steps aside while a ``recv`` reads and for ``CALLER_LINGER_S`` after, so back-to-back calls
find the connection free; otherwise it reads, so ``gather``, ``stream``, joins and leaves are
served as before. A message another client's reader thread delivers wakes the ``recv`` that
reads. TLS connections keep the reader thread's blocking reads (their records are buffered
where ``poll`` cannot see them).
"""

from __future__ import annotations

import logging
import select
import socket
import threading
import time
from collections.abc import Callable
from typing import Any, ClassVar, cast

from tensorwire.codecs import get_codec
from tensorwire.errors import PeerGone, SessionRefused, TransportError, TransportTimeout, WireError
from tensorwire.transports.base import BYE_TIMEOUT, Hub, HubOptions, deadline_after, remaining
from tensorwire.transports.security import peer_common_name
from tensorwire.transports.session import HELLO_LIMITS, Closed, Data, HubSession, State, bye
from tensorwire.transports.sockets import (
    Listener,
    ReadInterrupted,
    StreamReader,
    cannot_serve,
    drain,
    send_before_close,
    send_encoded,
    shutdown,
    tune,
    wake,
    waker,
    wrap_tls,
)
from tensorwire.transports.tcp.options import TcpHubOptions
from tensorwire.transports.tcp.peer import Peer
from tensorwire.transports.url import host_port, query_options
from tensorwire.wire import EncodedMessage, Message, MessageStream

log = logging.getLogger("tensorwire.transports.tcp")

HANDSHAKE_TIMEOUT = 10.0  # seconds a new connection has to say hello
CALLER_LINGER_S = 0.02  # a reader thread leaves its connection to recv callers this long
_NOW = 0.0  # a deadline (time.monotonic()) long past: read what has arrived, never wait

_Admitted = tuple[socket.socket, HubSession, StreamReader, Any]  # a hello read and accepted


class TcpHub(Hub):
    """Hub listening on ``tcp://host:port`` (port 0 picks a free one; see :attr:`url`)."""

    protocol = "tcp"
    options_type: ClassVar[type[HubOptions]] = TcpHubOptions
    options: TcpHubOptions

    def __init__(self, url: str, options: TcpHubOptions) -> None:
        super().__init__(url, options)
        query_options(url, ())
        host, port = host_port(url, default_port=0)
        self._ssl = None if self.tls is None else self.tls.server_context()
        try:
            lsock = socket.create_server((host, port), backlog=options.backlog)
        except OSError as exc:
            raise cannot_serve(url, exc) from None
        self.url = f"tcp://{host}:{lsock.getsockname()[1]}"
        self._peers: dict[str, Peer] = {}
        self._lock = threading.Lock()  # guards _peers
        # guards the peers' reading turns (see Peer); recv's steps take its lock directly
        # (the same lock, without the Condition's Python-level enter and exit)
        self._turns_lock = threading.Lock()
        self._turns = threading.Condition(self._turns_lock)
        self._stopping = False
        self._caller_wake_r, self._caller_wake_w = waker()  # wakes a recv that reads
        self._callers_reading = 0  # recv calls reading a connection now (under _turns)
        self._listener = Listener(
            lsock,
            name="tensorwire-tcp",
            handshake=self._handshake,
            serve=self._serve_connection,
            refused=self._refused,
        )

    def _handshake(self, conn: socket.socket, addr: Any) -> _Admitted:
        """Read the new connection's hello (TLS first, when asked); raise why it is refused."""
        tune(conn)
        deadline = deadline_after(HANDSHAKE_TIMEOUT)
        tls_name = None
        if self._ssl is not None:
            # a TlsStream stands in for the socket: the kit's functions take either
            conn = cast(
                socket.socket, wrap_tls(conn, self._ssl, server_side=True, deadline=deadline)
            )
            tls_name = peer_common_name(conn)
        reader = StreamReader(conn, MessageStream(limits=HELLO_LIMITS, codec_lookup=get_codec))
        session = HubSession(**self._session_options(), tls_name=tls_name)
        try:
            session.receive(reader.read_message(deadline))
        except SessionRefused as exc:
            send_before_close(conn, session.refusal(exc), deadline_after(BYE_TIMEOUT))
            raise
        reader.stream.limits = self.limits  # a member: its messages may be as large as ours
        return conn, session, reader, addr

    def _serve_connection(self, admitted: _Admitted) -> None:
        """An admitted connection's thread: membership and welcome, then reading to its end."""
        conn, session, reader, addr = admitted
        hello = session.hello
        assert hello is not None
        cid = hello.client_id
        peer = Peer(cid, conn, threading.Lock(), reader, session)
        if self._ssl is None:
            peer.wake_r, peer.wake_w = waker()
        # A member before its welcome goes out (a client that has its welcome can count on the
        # hub knowing its codecs and limits), and no other send reaches it before the welcome.
        unwelcome = None
        with peer.send_lock:
            with self._lock:
                old = self._peers.get(cid)
                self._peers[cid] = peer
            if old is not None:
                log.info("tcp: client %r reconnected from %s; closing its old one", cid, addr)
                shutdown(old.sock)
            replaced = self._member_from(hello, peer)
            try:
                send_encoded(conn, session.welcome(), deadline_after(HANDSHAKE_TIMEOUT))
            except TransportError as exc:
                unwelcome = f"the welcome could not be sent: {exc}"
        self._announce_member(cid, replaced)
        if unwelcome:
            reason = unwelcome
        elif peer.wake_r is None:
            reason = self._read_loop(peer, reader, session)
        else:
            peer.turns = True
            reason = self._take_turns(peer)
        with self._turns:
            peer.ended = peer.ended or reason  # no recv starts reading it now
        with self._lock:
            current = self._peers.get(cid) is peer
            if current:
                del self._peers[cid]
        shutdown(conn)  # a recv reading it returns (PeerGone) and gives up its turn
        with peer.turn, peer.send_lock:  # nobody reads or sends on a closed (reused) fd
            conn.close()
            for w in (peer.wake_r, peer.wake_w):
                if w is not None:
                    w.close()
        if current:
            self._left(cid, reason, session=peer)

    def _take_turns(self, peer: Peer) -> str:
        """The reader thread of a plain connection: wait in ``poll``, read what came while no
        ``recv`` reads the connection (see the module doc); return why the peer left."""
        assert peer.wake_r is not None
        poller = select.poll()
        poller.register(peer.sock, select.POLLIN)
        poller.register(peer.wake_r, select.POLLIN)
        wake_fd = peer.wake_r.fileno()
        while True:
            with self._turns:
                while peer.ended is None and not self._stopping:
                    idle = time.monotonic() - peer.callers_left_at
                    if not peer.callers and idle >= CALLER_LINGER_S:
                        break
                    # callers do not wake it when they stop: it looks again every linger
                    self._turns.wait(CALLER_LINGER_S if peer.callers else CALLER_LINGER_S - idle)
                if peer.ended is not None:
                    return peer.ended
                peer.polling = True
            assert peer.reader is not None
            if not peer.reader.stream.pending:  # a recv may have left messages buffered
                ready = poller.poll()
                if any(fd == wake_fd for fd, _ in ready):
                    drain(peer.wake_r)
            with self._turns:
                peer.polling = False
            with peer.turn:
                if peer.ended is not None:
                    return peer.ended
                if peer.callers and not self._stopping:
                    continue  # a recv reads it: back to waiting
                reason = self._read_arrived(peer)
                if reason is not None:
                    return reason

    def _read_arrived(self, peer: Peer) -> str | None:
        """Deliver the messages that have arrived (the rest of one begun too); why the peer
        left, or None when it may send more (turn held)."""
        reader, session = peer.reader, peer.session
        assert reader is not None and session is not None

        def arrived() -> Message | None:
            try:
                return reader.read_message(_NOW)
            except TransportTimeout:
                if not reader.stream.in_message:
                    return None
                return reader.read_message()  # the rest of a message is on its way

        return self._deliver(peer, reader, session, arrived)

    def _deliver(
        self,
        peer: Peer,
        reader: StreamReader,
        session: HubSession,
        read: Callable[[], Message | None],
    ) -> str | None:
        """Deliver the peer's messages as ``read`` gives them, until it gives None (None) or
        the peer leaves (why)."""
        while True:
            try:
                msg = read()
            except WireError as exc:
                self._rejected(peer.client_id, exc)
                if reader.stream.broken:
                    return f"sent bytes that are not a tensorwire message ({exc})"
                continue
            except TransportError as exc:
                return str(exc)
            if msg is None:
                return None
            if msg.kind == "data" and session.state is State.OPEN:  # receive's Data, unmade
                self._delivered(peer.client_id, msg)
            elif reason := self._received(peer.client_id, session, msg):
                return reason

    def _delivered(self, client_id: str, msg: Message) -> None:
        super()._delivered(client_id, msg)
        if self._callers_reading:  # a recv reading another connection: it should look
            wake(self._caller_wake_w)

    def recv(self, timeout: float | None = None) -> tuple[str, Message]:
        """The next message from any client, as ``(client_id, message)``.

        While the hub has one client (on a plain connection), the calling thread reads its
        connection itself (see the module doc)."""
        deadline = None if timeout is None else time.monotonic() + timeout  # deadline_after
        peers = list(self._peers.values())  # one step under the GIL: no lock needed
        peer = peers[0] if len(peers) == 1 else None
        if peer is None or not self._step_in(peer, reads=True):
            return super().recv(timeout)
        try:
            got = self._read_for_caller(peer, deadline, timeout)
        finally:
            self._step_out(peer, reads=True)
        if got is not None:
            return got
        left = remaining(deadline)
        return super().recv(None if left is None else left)

    def _read_for_caller(
        self, peer: Peer, deadline: float | None, timeout: float | None
    ) -> tuple[str, Message] | None:
        """Read ``peer``'s connection in a ``recv`` until a message is in the inbox; None if
        the connection ended (or its turn did not come by the deadline)."""
        left = -1 if deadline is None else max(deadline - time.monotonic(), 0.0)  # remaining
        if not peer.turn.acquire(timeout=left):
            return None
        try:
            while True:
                if self._inbox:  # a look without the lock; taken under it
                    with self._cond:
                        if self._inbox:
                            return self._inbox.popleft()
                if self._closed or peer.ended is not None:
                    return None
                try:
                    msg = self._turn_read(peer, deadline, self._caller_wake_r)
                except ReadInterrupted:
                    continue  # another client's message may be in the inbox
                except TransportTimeout:
                    raise TransportTimeout(f"no message within {timeout} s") from None
                if msg is not None and (got := self._take_delivered(peer.client_id, msg)):
                    return got
        finally:
            peer.turn.release()

    def _step_in(self, peer: Peer, reads: bool) -> bool:
        """Count this thread among ``peer``'s callers, so its reader thread steps aside (and
        among the hub's ``reads``: another client's message then wakes it); False if the
        connection does not take turns, or is over."""
        if not peer.turns or peer.wake_w is None:
            return False
        with self._turns_lock:
            if peer.ended is not None or self._stopping:
                return False
            peer.callers += 1
            self._callers_reading += reads
            if peer.polling:
                wake(peer.wake_w)
        return True

    def _step_out(self, peer: Peer, reads: bool) -> None:
        """Undo :meth:`_step_in`; the reader thread comes back after the linger."""
        with self._turns_lock:
            peer.callers -= 1
            self._callers_reading -= reads
            peer.callers_left_at = time.monotonic()
            if peer.ended is not None:
                self._turns.notify_all()  # its reader thread says why it left

    def _turn_read(
        self, peer: Peer, deadline: float | None, wake: socket.socket | None = None
    ) -> Message | None:
        """Read ``peer``'s next message in its turn: a data message, or None when the read
        brought something else (a bad message, a control message, the connection's end,
        after which ``peer.ended`` says why). Raises ``TransportTimeout`` at the deadline and
        ``ReadInterrupted`` when ``wake`` wakes it."""
        reader, session = peer.reader, peer.session
        assert reader is not None and session is not None
        try:
            msg = reader.read_message(deadline, wake=wake)
        except (ReadInterrupted, TransportTimeout):
            raise
        except WireError as exc:
            self._rejected(peer.client_id, exc)
            if reader.stream.broken:
                self._end_turns(peer, f"sent bytes that are not a tensorwire message ({exc})")
            return None
        except TransportError as exc:
            self._end_turns(peer, str(exc))
            return None
        if msg.kind == "data" and session.state is State.OPEN:  # receive's Data, unmade
            return msg
        event = session.receive(msg)
        if isinstance(event, Data):
            return msg
        if isinstance(event, Closed):
            self._end_turns(peer, event.reason)
        else:
            log.debug("tcp: %r: %s", peer.client_id, event)
        return None

    def _await_ack(self, client_id: str, sid: str, n: int, deadline: float | None) -> bool:
        """A stream's sender reads the client's acknowledgements itself, as ``recv`` reads
        messages (see the module doc): no hand-off from the reader thread per window. Other
        messages it meets are delivered as the reader thread would."""
        if self._acks.acked(client_id, sid) >= n:
            return True
        peer = self._peers.get(client_id)
        if peer is None or not self._step_in(peer, reads=False):
            return super()._await_ack(client_id, sid, n, deadline)
        try:
            left = remaining(deadline)
            if not peer.turn.acquire(timeout=-1 if left is None else left):
                return self._acks.acked(client_id, sid) >= n
            try:
                while self._acks.acked(client_id, sid) < n:
                    if peer.ended is not None:
                        return False
                    try:
                        msg = self._turn_read(peer, deadline)
                    except TransportTimeout:
                        return False
                    if msg is not None:
                        self._delivered(client_id, msg)
                return True
            finally:
                peer.turn.release()
        finally:
            self._step_out(peer, reads=False)

    def _end_turns(self, peer: Peer, reason: str) -> None:
        """A ``recv`` found ``peer``'s connection over: its reader thread ends the session."""
        with self._turns:
            if peer.ended is None:
                peer.ended = reason
            self._turns.notify_all()
        shutdown(peer.sock)

    def _read_loop(self, peer: Peer, reader: StreamReader, session: HubSession) -> str:
        """Deliver the peer's messages until it leaves; return why it left."""
        reason = self._deliver(peer, reader, session, reader.read_message)
        assert reason is not None  # a blocking read gives a message or raises
        return reason

    def _send_encoded(self, client_id: str, enc: EncodedMessage, deadline: float | None) -> None:
        peer = self._peers.get(client_id)  # one dict lookup: atomic, no lock
        if peer is None:
            raise PeerGone(f"client {client_id!r} is not connected")
        with peer.send_lock:
            try:
                send_encoded(peer.sock, enc, deadline)
            except TransportError:
                shutdown(peer.sock)  # a half-sent message leaves the stream unusable
                raise

    def _close_transport(self) -> None:
        self._listener.close()
        with self._turns:
            self._stopping = True  # reader threads stop stepping aside
            self._turns.notify_all()
        with self._lock:
            peers = list(self._peers.values())
        goodbye = bye("the hub is closing")
        for peer in peers:
            if peer.send_lock.acquire(timeout=BYE_TIMEOUT):
                try:
                    send_before_close(peer.sock, goodbye, deadline_after(BYE_TIMEOUT))
                finally:
                    peer.send_lock.release()
            shutdown(peer.sock)
        self._listener.join(timeout=5)
        self._caller_wake_r.close()
        self._caller_wake_w.close()
