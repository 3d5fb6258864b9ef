"""The ``zmq+tcp://`` hub: a ROUTER, read in turns by its reader thread or a ``recv`` caller
(see the package doc), sending from the caller's thread (``outbound.py``)."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Mapping
from typing import Any, ClassVar, cast

import zmq
from zmq.utils.monitor import recv_monitor_message

from tensorwire.errors import (
    AuthenticationError,
    SessionRefused,
    TransportError,
    TransportTimeout,
    TruncatedMessage,
    WireError,
)
from tensorwire.transports.base import BYE_TIMEOUT, Hub, HubOptions, remaining
from tensorwire.transports.session import HELLO_LIMITS, Closed, Data, Hello, HubSession, State, bye
from tensorwire.transports.sockets import cannot_serve, drain, poller, wake, waker
from tensorwire.transports.url import host_port
from tensorwire.transports.zmq.curve import hub_keys, one_curve_option
from tensorwire.transports.zmq.options import ZmqHubOptions
from tensorwire.transports.zmq.outbound import RouterOutbound
from tensorwire.transports.zmq.peer import Peer, peer_name, stranger_name
from tensorwire.transports.zmq.pieces import message_pieces
from tensorwire.transports.zmq.reassembler import Reassembler
from tensorwire.transports.zmq.sockets import (
    BACKLOG,
    CRYPTOGRAPHIC,
    EVENTS,
    MECHANISM_MISMATCH,
    MONITOR_EVENTS,
    POLLIN,
    configure,
    endpoint,
    monitor_socket,
    protocol_error,
    queue_piece,
    recv_frames,
)
from tensorwire.wire import Message

log = logging.getLogger("tensorwire.transports.zmq")

MIN_SESSION_CHARS = 16  # a routing id (= session id) shorter than this is guessable: refused
MAX_STRANGERS = 64  # peers without a session whose unfinished message the hub keeps at once
READ_BATCH = 64  # ZeroMQ messages the hub reads per hold of the ROUTER lock
CALLER_LINGER_S = 0.02  # the hub's reader thread leaves the ROUTER to recv callers this long


class ZmqHub(RouterOutbound, Hub):
    """Hub on ``zmq+tcp://host:port`` (port 0 picks a free one; see :attr:`url`).

    With ``tls=`` or ``curve=`` (a file: the hub's CURVE public key, then its secret key, one
    per line; default ``hub.curve`` beside ``tls.cert``; also the URL option ``?curve=``)
    every connection is encrypted with CURVE. Clients are identified by ``auth=`` (their
    enrolled secrets); ``tls.ca`` without them is refused (CURVE cannot check certificates).

    ``on_join`` / ``on_leave`` run on the thread that reads the ROUTER (the hub's reader
    thread, or one in :meth:`recv`): while they run no message is read, so keep them short
    (sending from them is fine).
    """

    protocol = "zmq"
    options_type: ClassVar[type[HubOptions]] = ZmqHubOptions
    options: ZmqHubOptions

    def __init__(self, url: str, options: ZmqHubOptions) -> None:
        super().__init__(url, options)
        curve = one_curve_option(url, options.curve)
        host, port = host_port(url, default_port=0)
        self._curve = self.tls is not None or curve is not None
        keys = hub_keys(curve, self.tls, self.authenticate) if self._curve else None
        self._ctx = zmq.Context()
        self._router = self._ctx.socket(zmq.ROUTER)
        configure(self._router, host)
        self._router.router_mandatory = 1  # a send to a gone client raises, a full queue EAGAIN
        self._router.router_handover = 0  # a routing id in use is never given to another peer
        self._router.backlog = BACKLOG  # libzmq's 100 dropped SYNs of a crowd joining at once
        if keys is not None:
            # No ZAP handler: any client key completes the handshake; the hello's proof of
            # the device's secret is what admits it.
            self._router.curve_server = 1
            self._router.curve_publickey, self._router.curve_secretkey = keys
        self._monitor = monitor_socket(self._router, MONITOR_EVENTS)
        try:
            self._router.bind(endpoint(host, port or "*"))
        except zmq.ZMQError as exc:
            self._ctx.destroy(linger=0)
            raise cannot_serve(url, exc) from None
        self.url = "zmq+" + cast(bytes, self._router.last_endpoint).decode()
        self._lock = threading.Lock()  # whoever holds it may use the ROUTER (and _route)
        self._stopping = False
        self._polling = False  # a reader may wait on the ROUTER's FD (guarded by _lock)
        self._route: dict[str, bytes] = {}  # client id -> routing id of its current session
        # Who reads the ROUTER: whoever holds _reading (the reader thread or a recv caller).
        self._reading = threading.Lock()
        self._turns_lock = threading.Lock()  # guards the three below
        self._parked = threading.Condition(self._turns_lock)  # the reader thread waits here
        self._thread_reads = False  # the reader thread holds _reading
        self._callers = 0  # recv calls that read, or wait to
        self._callers_left_at = 0.0  # time.monotonic() when the last one stopped reading
        # Owned by whoever reads:
        self._peers: dict[bytes, Peer] = {}  # routing id -> its session
        self._strangers: dict[bytes, Reassembler] = {}  # no session, a message unfinished
        self._on_fd: dict[int, bytes] = {}  # fd of a session's connection -> its routing id
        self._closing: list[Peer] = []  # sessions whose connection closed, not yet left
        self._monitor_due = True  # its FD signals only after a read found it empty: read it
        self._wake_r, self._wake_w = waker()
        self._monitor_fd, self._wake_fd = self._monitor.fileno(), self._wake_r.fileno()
        self._poll = poller(self._router.fileno(), self._monitor_fd, self._wake_fd)
        self._io = threading.Thread(target=self._run, name="tensorwire-zmq-hub", daemon=True)
        self._io.start()

    def recv(self, timeout: float | None = None) -> tuple[str, Message]:
        """The next message from any client, as ``(client_id, message)``.

        The calling thread reads the ROUTER itself (no hand-off from the reader thread, which
        stays away while recv is called, and for CALLER_LINGER_S after); a second caller
        waits for its turn, or for a message the first one read.
        """
        deadline = None if timeout is None else time.monotonic() + timeout  # deadline_after
        if self._inbox:  # a look without the lock; taken under it
            with self._cond:
                if self._inbox:
                    return self._inbox.popleft()
        with self._turns_lock:
            self._callers += 1
            if self._thread_reads:
                wake(self._wake_w)  # out of its poll: it gives way to callers
        try:
            left = -1 if deadline is None else max(deadline - time.monotonic(), 0.0)
            if not self._reading.acquire(timeout=left):
                raise TransportTimeout(f"no message within {timeout} s")
            try:
                return self._read_for_caller(deadline, timeout)
            finally:
                self._polling = False  # nobody waits on the FD until the next read
                self._reading.release()  # the next caller's turn
        finally:
            with self._turns_lock:
                self._callers -= 1
                self._callers_left_at = time.monotonic()

    def _read_for_caller(
        self, deadline: float | None, timeout: float | None
    ) -> tuple[str, Message]:
        """Read the ROUTER in a ``recv`` (``_reading`` held) until a message is in."""
        while True:
            if self._inbox:  # the caller before us, or the reader thread, read it
                with self._cond:
                    if self._inbox:
                        return self._inbox.popleft()
            if self._stopping:
                raise TransportTimeout(f"no message within {timeout} s: the hub is closed")
            got = self._read_step(1, take=True)  # one at a time: return what it brings
            if isinstance(got, tuple):
                return got
            if got:  # the ROUTER was empty
                left = remaining(deadline)
                if left == 0.0:
                    raise TransportTimeout(f"no message within {timeout} s")
                self._wait(left)

    def _run(self) -> None:
        """The reader thread: reads the ROUTER while no recv caller does."""
        while True:
            with self._turns_lock:
                while not self._stopping:
                    # Callers do not wake it when they stop: it looks again every linger.
                    if self._callers:
                        self._parked.wait(CALLER_LINGER_S)
                        continue
                    idle = time.monotonic() - self._callers_left_at
                    if idle >= CALLER_LINGER_S and self._reading.acquire(False):
                        self._thread_reads = True
                        break
                    self._parked.wait(max(CALLER_LINGER_S - idle, 0.001))
                if self._stopping:
                    return
            try:
                while not (self._callers or self._stopping):
                    if self._read_step(READ_BATCH) and not (self._callers or self._stopping):
                        self._wait(None)
            except Exception:  # serve on: the next read may do better
                log.exception("zmq: the hub's reader thread failed a read")
            finally:
                with self._turns_lock:
                    self._thread_reads = False
                    self._polling = False  # nobody waits on the FD until the next read
                    self._reading.release()

    def _read_step(self, limit: int, take: bool = False) -> bool | tuple[str, Message]:
        """Read and handle up to ``limit`` messages; True if the ROUTER was found empty and no
        closed connection waits for another read (then wait before the next step). ``take``
        (a recv caller): return the first data message read instead of queueing it."""
        if self._monitor_due:
            self._monitor_due = False
            self._read_monitor()
        closed_before_read = len(self._closing)
        batch, more = self._read_batch(limit)
        got = None
        for frames in batch:
            ident = frames[0].bytes
            try:
                got = self._on_message(ident, frames[1:], take and got is None) or got
            except Exception:  # e.g. an on_join callback that raised: serve the others
                log.exception("zmq: handling a message from %r failed", peer_name(ident))
        del batch  # hand libzmq its buffers back before waiting
        if got is not None:
            return got
        if more:
            return False
        if closed_before_read:  # the ROUTER was empty: it held their last messages
            self._forget_closed(closed_before_read)
        return not self._closing

    def _wait(self, seconds: float | None) -> None:
        """Wait until the ROUTER or its monitor may have news, a wake-up, or ``seconds``.

        ZMQ_FD is edge-triggered: wait on it only after the ROUTER was found empty; a sender
        that may have consumed its edge meanwhile wakes us instead (_check_readable)."""
        for fd, _ in self._poll.poll(None if seconds is None else int(seconds * 1000) + 1):
            if fd == self._monitor_fd:
                self._monitor_due = True
            elif fd == self._wake_fd:
                drain(self._wake_r)

    def _read_batch(self, limit: int) -> tuple[list[list[zmq.Frame]], bool]:
        """Up to ``limit`` messages, and whether more may be waiting (not found empty)."""
        batch: list[list[zmq.Frame]] = []
        with self._lock:
            self._polling = False
            if self._stopping:
                return batch, False
            router = self._router
            for _ in range(limit):
                if not router.get(EVENTS) & POLLIN:  # type: ignore[operator]  # readable
                    self._polling = True
                    return batch, False
                batch.append(recv_frames(router))
        return batch, True

    def _read_monitor(self) -> None:
        """Note connections that closed; called before every hello is accepted. Handshakes
        that failed are refusals.

        Their clients stay members until :meth:`_forget_closed`: messages they sent before
        closing may still be queued on the ROUTER.
        """
        while True:
            try:
                event = recv_monitor_message(self._monitor, zmq.NOBLOCK)
            except zmq.Again:
                return
            if event["event"] != zmq.EVENT_DISCONNECTED:
                error = self._handshake_error(event["event"], event["value"])
                self._refused(f"a peer of {self.url}", error)
                continue
            fd = int(event["value"])
            ident = self._on_fd.pop(fd, None)  # now, as a new connection may reuse the fd
            peer = None if ident is None else self._peers.get(ident)
            if peer is not None and peer.fd == fd:
                self._closing.append(peer)

    def _handshake_error(self, event: int, code: int) -> TransportError:
        """Why a peer's ZMTP handshake failed (``code``: libzmq's protocol error or errno)."""
        if event == zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL:
            # What a client does when it finds out first that the encryption does not match
            # (and what a TCP probe does).
            return TransportError(
                "it closed the connection during the ZMTP handshake (a client "
                + ("without CURVE encryption?)" if self._curve else "expecting CURVE?)")
            )
        if code == MECHANISM_MISMATCH and self._curve:
            return AuthenticationError("it connected without CURVE encryption")
        if code == MECHANISM_MISMATCH:
            return AuthenticationError("it asked for encryption; this hub has no CURVE keys")
        if code == CRYPTOGRAPHIC:
            # libzmq then stops reading that connection; ZMTP heartbeats close it.
            return AuthenticationError(
                "a CURVE box it sent did not open: it does not know this hub's public key, or "
                "its traffic was altered on the way"
            )
        return TransportError(f"{protocol_error(code)} on its connection")

    def _forget_closed(self, n: int) -> None:
        """The first ``n`` closed connections' clients leave, unless they said goodbye or
        reconnected meanwhile; call only once the ROUTER was read empty after noting them."""
        closed, self._closing = self._closing[:n], self._closing[n:]
        for peer in closed:
            if self._peers.get(peer.ident) is peer:
                try:
                    self._end(peer, "connection lost")
                except Exception:  # an on_leave callback that raised: the others still leave
                    log.exception("zmq: ending the session of %r failed", peer.client_id)

    def _on_message(
        self, ident: bytes, frames: list[zmq.Frame], take: bool = False
    ) -> tuple[str, Message] | None:
        """Act on one ZeroMQ message from ``ident``. ``take``: return the first data message
        it completes (as :meth:`_take_delivered`) instead of queueing it."""
        got = None
        peer = self._peers.get(ident)
        reader = peer.reader if peer is not None else self._stranger(ident)
        for event in reader.feed(frames):
            if isinstance(event, WireError):
                self._rejected(peer.client_id if peer else stranger_name(ident, frames), event)
            elif peer is None:
                peer = self._open(ident, event, frames, reader)
            elif event.kind == "data" and peer.session.state is State.OPEN:  # Data, unmade
                if take and got is None:
                    got = self._take_delivered(peer.client_id, event)
                else:
                    self._delivered(peer.client_id, event)
            else:
                outcome = peer.session.receive(event)
                if isinstance(outcome, Data):
                    self._delivered(peer.client_id, event)
                elif isinstance(outcome, Closed):
                    self._end(peer, outcome.reason)
                    peer = None
                else:
                    log.debug("zmq: %r: %s", peer.client_id, outcome)
        if peer is None and not reader.in_message:
            self._strangers.pop(ident, None)  # strangers keep no state between their messages
        return got

    def _stranger(self, ident: bytes) -> Reassembler:
        """The reader of a peer without a session: a stranger's first message is read under
        HELLO_LIMITS, and at most MAX_STRANGERS unfinished ones are kept."""
        reader = self._strangers.get(ident)
        if reader is None:
            if len(self._strangers) >= MAX_STRANGERS:
                oldest = next(iter(self._strangers))
                del self._strangers[oldest]
                self._rejected(
                    f"routing id {peer_name(oldest)}",
                    TruncatedMessage("dropped its unfinished message: too many strangers at once"),
                )
            reader = self._strangers[ident] = Reassembler(HELLO_LIMITS)
        return reader

    def _open(
        self, ident: bytes, msg: Message, frames: list[zmq.Frame], reader: Reassembler
    ) -> Peer | None:
        """Act on a message from a routing id without a session: welcome a valid hello (and
        return the new member), refuse a bad one, answer anything else with bye."""
        who = stranger_name(ident, frames)
        if msg.kind != "hello":
            self._rejected(who, SessionRefused(f"a {msg.kind!r} message outside a session"))
            if msg.kind != "bye":
                self._say(ident, bye("no session on this connection: say hello first"), "bye")
            return None
        options = self._session_options()
        authenticate = options["authenticate"]

        def check(hello: Hello, tls_name: str | None) -> tuple[Mapping[str, Any], bytes | None]:
            if hello.session.encode() != ident or len(hello.session) < MIN_SESSION_CHARS:
                raise SessionRefused(
                    f"the ZeroMQ routing id must be the hello's session id, {MIN_SESSION_CHARS} "
                    f"or more random characters (routing id {peer_name(ident)!r}, session "
                    f"{hello.session!r})"
                )
            return ({}, None) if authenticate is None else authenticate(hello, tls_name)

        session = HubSession(**{**options, "authenticate": check})
        try:
            session.receive(msg)
        except SessionRefused as exc:
            self._say(ident, session.refusal(exc), "refuse")
            self._refused(who, exc)
            return None
        hello = session.hello
        assert hello is not None
        self._read_monitor()  # closed connections first: the fd of this hello may be reused
        peer = Peer(hello.client_id, ident, frames[-1].get(zmq.SRCFD), session, reader)
        with self._lock:
            old = self._route.get(peer.client_id)
        replaced: list[bool] = []

        def take_over() -> None:
            # Just before the welcome, in one hold of the ROUTER lock: a send right after the
            # client has its welcome finds this session's codecs and limits and goes to this
            # session, not to the one it replaces (whose pipe may be closed already).
            self._route[peer.client_id] = ident
            replaced.append(self._member_from(hello, peer))

        welcomed = self._say(ident, session.welcome(), "welcome", first=take_over)
        if not replaced:  # the hub is stopping
            return None
        self._strangers.pop(ident, None)
        reader.set_limits(self.limits)  # a member: its messages may be as large as ours
        if old is not None:
            self._peers.pop(old, None)  # its later messages get a bye: the session is over
        self._peers[ident] = peer
        self._on_fd[peer.fd] = ident
        self._announce_member(peer.client_id, replaced[0])
        if not welcomed:  # joined, and gone
            self._end(peer, "its welcome could not be queued: its queue is full (it reads nothing)")
            return None
        return peer

    def _end(self, peer: Peer, reason: str) -> None:
        """``peer``'s session is over (it said goodbye, or its connection closed)."""
        del self._peers[peer.ident]
        if self._on_fd.get(peer.fd) == peer.ident:
            del self._on_fd[peer.fd]
        with self._lock:
            if self._route.get(peer.client_id) == peer.ident:
                del self._route[peer.client_id]
        self._left(peer.client_id, reason, session=peer)

    def _close_transport(self) -> None:
        with self._lock:
            self._stopping = True
        with self._turns_lock:
            self._parked.notify_all()
        wake(self._wake_w)  # out of its poll, whoever reads
        stopped = self._reading.acquire(timeout=10)
        if stopped:  # callers waiting for a turn take it, and find the hub closed
            self._reading.release()
        self._io.join(timeout=10)
        if not stopped or self._io.is_alive():
            log.error("zmq: the hub's reader did not stop; leaving its sockets open")
            return
        goodbye = next(message_pieces(bye("the hub is closing")))
        trackers: list[zmq.MessageTracker] = []
        with self._lock:
            for ident in self._peers:
                with contextlib.suppress(zmq.ZMQError):  # gone, or its queue is full
                    queue_piece(self._router, goodbye, trackers, ident)
        self._router.disable_monitor()
        self._monitor.close(linger=0)
        self._router.close(linger=int(BYE_TIMEOUT * 1000))
        self._ctx.term()  # returns once the byes are out, or after BYE_TIMEOUT
        self._wake_r.close()
        self._wake_w.close()
