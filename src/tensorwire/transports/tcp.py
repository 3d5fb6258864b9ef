"""``tcp://host:port``: one TCP connection per client, messages back to back on it.

With ``tls=tensorwire.TLS(...)`` the connection opens with a TLS 1.3 handshake (``ssl``), mutual
when the hub's settings name a CA (the certificate's name is then checked against the hello's
client id), and then carries AES-128-OCB3 records under keys agreed inside TLS
(``docs/transports/tcp.md``).

The session (``docs/session.md``) maps onto the connection directly: the client's first
message is its ``hello``, the hub answers ``welcome`` (or ``refuse`` and closes); then both
send ``data`` messages, and ``bye`` before closing. Each connection has its own reader thread
on the hub; sends use ``sendmsg`` scatter-gather from the caller's thread. The socket stays
blocking (see :mod:`~tensorwire.transports.stream_socket`), so a send's deadline never
disturbs the reader.

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

import contextlib
import logging
import select
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

from tensorwire.codecs import get_codec
from tensorwire.errors import (
    PeerGone,
    SessionRefused,
    TransportError,
    TransportTimeout,
    WireError,
)
from tensorwire.transports.base import (
    Channel,
    Hub,
    deadline_after,
    default_client_id,
    dial,
    remaining,
)
from tensorwire.transports.security import TLS, peer_common_name
from tensorwire.transports.session import (
    HELLO_LIMITS,
    Closed,
    Data,
    HubSession,
    State,
    Welcomed,
    bye,
)
from tensorwire.transports.stream_socket import (
    WAKE_BYTES,
    ReadInterrupted,
    StreamReader,
    send_encoded,
    wrap_tls,
)
from tensorwire.transports.url import host_port, query_options
from tensorwire.wire import EncodedMessage, Limits, Message, MessageStream

log = logging.getLogger("tensorwire.transports.tcp")

HANDSHAKE_TIMEOUT = 10.0  # seconds a new connection has to say hello
MAX_HANDSHAKES = 64  # connections at once that have not said hello; more are closed at once
BYE_TIMEOUT = 1.0  # seconds spent saying goodbye (or why not) before closing anyway
CALLER_LINGER_S = 0.02  # a reader thread leaves its connection to recv callers this long
_NOW = 0.0  # a deadline (time.monotonic()) long past: read what has arrived, never wait


def _tune(sock: socket.socket) -> None:
    sock.settimeout(None)  # blocking: deadlines are per call (poll), never the socket's mode
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def _shutdown(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):  # already closed or never connected
        sock.shutdown(socket.SHUT_RDWR)


def _say(sock: socket.socket, enc: EncodedMessage) -> None:
    """Send a control message on a connection about to close, if it can go in time."""
    with contextlib.suppress(TransportError, OSError):
        send_encoded(sock, enc, deadline_after(BYE_TIMEOUT))


def _waker() -> tuple[socket.socket, socket.socket]:
    """A socketpair, both ends non-blocking: a byte on the second wakes a poll on the first."""
    r, w = socket.socketpair()
    r.setblocking(False)
    w.setblocking(False)
    return r, w


def _wake(w: socket.socket) -> None:
    with contextlib.suppress(OSError):  # full (a wake-up is pending anyway) or closed
        w.send(b"\0")


def _drain(r: socket.socket) -> None:
    with contextlib.suppress(OSError):
        while r.recv(WAKE_BYTES):
            pass


@dataclass(eq=False)
class _Peer:
    client_id: str
    sock: socket.socket
    send_lock: threading.Lock
    reader: StreamReader | None = None
    session: HubSession | None = None
    # Reading (see the module doc): whoever holds ``turn`` may use reader and session.
    turn: threading.Lock = field(default_factory=threading.Lock)
    callers: int = 0  # recv calls reading this connection, or waiting to (under hub._turns)
    callers_left_at: float = 0.0  # time.monotonic() when the last one stopped
    polling: bool = False  # its reader thread waits (or is about to) in poll
    ended: str | None = None  # why its connection is over, once it is
    turns: bool = False  # recv may read it: its reader thread takes turns (after on_join)
    wake_r: socket.socket | None = None  # wakes its reader thread out of poll
    wake_w: socket.socket | None = None


class TcpHub(Hub):
    """Hub listening on ``tcp://host:port`` (port 0 picks a free one; see :attr:`url`)."""

    protocol = "tcp"

    def __init__(self, url: str, *, backlog: int = 128, **options: Any) -> None:
        super().__init__(**options)
        query_options(url, ())
        host, port = host_port(url, default_port=0)
        self._ssl = None if self.tls is None else self.tls.server_context()
        self._lsock = socket.create_server((host, port), backlog=backlog)
        self.url = f"tcp://{host}:{self._lsock.getsockname()[1]}"
        self._peers: dict[str, _Peer] = {}
        self._lock = threading.Lock()
        self._threads: set[threading.Thread] = set()
        # guards the peers' reading turns (see _Peer); recv's steps take its lock directly
        # (the same lock, without the Condition's Python-level enter and exit)
        self._turns_lock = threading.Lock()
        self._turns = threading.Condition(self._turns_lock)
        self._stopping = False
        self._caller_wake_r, self._caller_wake_w = _waker()  # wakes a recv that reads
        self._callers_reading = 0  # recv calls reading a connection now (under _turns)
        self._accepting = threading.Thread(
            target=self._accept_loop, name="tensorwire-tcp-accept", daemon=True
        )
        self._accepting.start()

    def _accept_loop(self) -> None:
        while True:
            try:
                conn, addr = self._lsock.accept()
            except OSError:
                return  # listening socket shut down by close()
            with self._lock:
                crowded = len(self._threads) - len(self._peers) >= MAX_HANDSHAKES
            if crowded:  # a flood of silent connections must not cost a thread each
                self._refused(f"{addr[0]}:{addr[1]}", TransportError("too many handshakes"))
                conn.close()
                continue
            _tune(conn)
            t = threading.Thread(
                target=self._serve_connection,
                args=(conn, addr),
                name=f"tensorwire-tcp-{addr}",
                daemon=True,
            )
            with self._lock:
                self._threads.add(t)
            t.start()

    def _handshake(self, conn: socket.socket) -> tuple[socket.socket, HubSession, StreamReader]:
        deadline = deadline_after(HANDSHAKE_TIMEOUT)
        tls_name = None
        if self._ssl is not None:
            # a TlsStream stands in for the socket: stream_socket's functions take either
            conn = cast(
                socket.socket, wrap_tls(conn, self._ssl, server_side=True, deadline=deadline)
            )
            tls_name = peer_common_name(conn)
        reader = StreamReader(conn, MessageStream(limits=HELLO_LIMITS, codec_lookup=get_codec))
        session = HubSession(**self._session_options(), tls_name=tls_name)
        try:
            session.receive(reader.read_message(deadline))
        except SessionRefused as exc:
            _say(conn, session.refusal(exc))
            raise
        reader.stream.limits = self.limits  # a member: its messages may be as large as ours
        return conn, session, reader

    def _serve_connection(self, conn: socket.socket, addr: Any) -> None:
        try:
            conn, session, reader = self._handshake(conn)
        except (WireError, TransportError) as exc:
            self._refused(f"{addr[0]}:{addr[1]}", exc)
            _shutdown(conn)
            conn.close()
            with self._lock:
                self._threads.discard(threading.current_thread())
            return
        hello = session.hello
        assert hello is not None
        cid = hello.client_id
        peer = _Peer(cid, conn, threading.Lock(), reader, session)
        if self._ssl is None:
            peer.wake_r, peer.wake_w = _waker()
        # A member before its welcome goes out (a client that has its welcome can count on the
        # hub knowing its codecs and limits), and no other send reaches it before the welcome.
        unwelcome = None
        with peer.send_lock:
            with self._lock:
                old = self._peers.get(cid)
                self._peers[cid] = peer
            if old is not None:
                log.info("tcp: client %r reconnected from %s; closing its old one", cid, addr)
                _shutdown(old.sock)
            replaced = self._make_member(
                cid, hello.decoders, session=peer, max_message_bytes=hello.max_message_bytes
            )
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
            self._threads.discard(threading.current_thread())
        _shutdown(conn)  # a recv reading it returns (PeerGone) and gives up its turn
        with peer.turn, peer.send_lock:  # nobody reads or sends on a closed (reused) fd
            conn.close()
            for w in (peer.wake_r, peer.wake_w):
                if w is not None:
                    w.close()
        if current:
            self._left(cid, reason, session=peer)

    def _take_turns(self, peer: _Peer) -> str:
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
                    _drain(peer.wake_r)
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

    def _read_arrived(self, peer: _Peer) -> str | None:
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
        peer: _Peer,
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
            event = session.receive(msg)
            if isinstance(event, Data):
                self._delivered(peer.client_id, msg)
            elif isinstance(event, Closed):
                return event.reason
            else:
                log.debug("tcp: %r: %s", peer.client_id, event)

    def _delivered(self, client_id: str, msg: Message) -> None:
        super()._delivered(client_id, msg)
        if self._callers_reading:  # a recv reading another connection: it should look
            _wake(self._caller_wake_w)

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
        self, peer: _Peer, deadline: float | None, timeout: float | None
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

    def _step_in(self, peer: _Peer, reads: bool) -> bool:
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
                _wake(peer.wake_w)
        return True

    def _step_out(self, peer: _Peer, reads: bool) -> None:
        """Undo :meth:`_step_in`; the reader thread comes back after the linger."""
        with self._turns_lock:
            peer.callers -= 1
            self._callers_reading -= reads
            peer.callers_left_at = time.monotonic()
            if peer.ended is not None:
                self._turns.notify_all()  # its reader thread says why it left

    def _turn_read(
        self, peer: _Peer, deadline: float | None, wake: socket.socket | None = None
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

    def _end_turns(self, peer: _Peer, reason: str) -> None:
        """A ``recv`` found ``peer``'s connection over: its reader thread ends the session."""
        with self._turns:
            if peer.ended is None:
                peer.ended = reason
            self._turns.notify_all()
        _shutdown(peer.sock)

    def _read_loop(self, peer: _Peer, reader: StreamReader, session: HubSession) -> str:
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
                _shutdown(peer.sock)  # a half-sent message leaves the stream unusable
                raise

    def _close_transport(self) -> None:
        _shutdown(self._lsock)
        self._lsock.close()
        self._accepting.join(timeout=5)
        with self._turns:
            self._stopping = True  # reader threads stop stepping aside
            self._turns.notify_all()
        with self._lock:
            peers = list(self._peers.values())
            threads = list(self._threads)
        goodbye = bye("the hub is closing")
        for peer in peers:
            if peer.send_lock.acquire(timeout=BYE_TIMEOUT):
                try:
                    _say(peer.sock, goodbye)
                finally:
                    peer.send_lock.release()
            _shutdown(peer.sock)
        for t in threads:
            t.join(timeout=5)
        self._caller_wake_r.close()
        self._caller_wake_w.close()


class TcpChannel(Channel):
    """A client's connection to a :class:`TcpHub`; retries connecting for ``timeout`` seconds."""

    protocol = "tcp"

    def __init__(
        self,
        url: str,
        *,
        client_id: str | None = None,
        codec: Any = "auto",
        checksum: bool = True,
        limits: Limits = Limits(),
        timeout: float = 30.0,
        tls: TLS | None = None,
        key: Any = None,
    ) -> None:
        super().__init__(codec, checksum, limits)
        self.url = url
        self.client_id = client_id or default_client_id()
        query_options(url, ())
        self._address = host_port(url)
        self._credentials(tls, key)
        self._ssl = None if tls is None else tls.client_context()
        self._send_lock = threading.Lock()
        self._closed = True
        self.reconnect(timeout)

    def _open(self, deadline: float | None) -> tuple[socket.socket, StreamReader, Welcomed]:
        sock = socket.create_connection(self._address, timeout=remaining(deadline))
        _tune(sock)
        if self._ssl is not None:
            assert self.tls is not None
            name = self.tls.server_name or self._address[0]
            sock = cast(  # a TlsStream stands in for the socket, as in _handshake
                socket.socket,
                wrap_tls(
                    sock, self._ssl, server_side=False, server_hostname=name, deadline=deadline
                ),
            )
        session = self._client_session(f"the hub at {self.url}")
        reader = StreamReader(sock, MessageStream(limits=self.limits, codec_lookup=get_codec))
        try:
            send_encoded(sock, session.hello(), deadline)
            welcome = session.receive(reader.read_message(deadline))
        except BaseException:
            sock.close()
            raise
        assert isinstance(welcome, Welcomed)
        self._session = session
        return sock, reader, welcome

    def reconnect(self, timeout: float = 30.0) -> None:
        """(Re)dial the hub and say hello with the same client id."""
        if not self._closed:
            self._drop()
        sock, reader, welcome = dial(self._open, what=self.url, timeout=timeout)
        self._sock, self._reader = sock, reader
        self.hub_decoders = welcome.decoders
        self.hub_max_bytes = welcome.max_message_bytes
        self._closed = False

    def _send_encoded(self, enc: EncodedMessage, deadline: float | None) -> None:
        if self._closed:
            raise PeerGone("channel is closed; call reconnect()")
        with self._send_lock:
            try:
                send_encoded(self._sock, enc, deadline)
            except TransportError:
                self._drop()  # a half-sent message leaves the stream unusable
                raise

    def _recv_message(self, deadline: float | None, out: Any) -> Message:
        if self._closed:
            raise PeerGone("channel is closed; call reconnect()")
        while True:
            if not self._reader.stream.in_message:
                self._reader.stream.set_out(out)
            try:
                msg = self._reader.read_message(deadline)
            except WireError:
                if self._reader.stream.broken:
                    self._drop()
                raise
            except PeerGone:
                self._drop()
                raise
            if msg.kind == "data" and self._session.state is State.OPEN:  # receive's Data
                return msg
            event = self._session.receive(msg)
            if isinstance(event, Data):
                return msg
            if isinstance(event, Closed):
                self._drop()
                raise self._session.closed_error()

    def _drop(self) -> None:
        self._closed = True
        _shutdown(self._sock)
        self._sock.close()

    def close(self) -> None:
        """Say goodbye to the hub and close the connection."""
        if self._closed:
            return
        with self._send_lock:
            _say(self._sock, bye())
        self._drop()
