"""The ``zmq+tcp://`` channel: a DEALER per session, used by one thread at a time (``turns.py``)."""

from __future__ import annotations

import contextlib
import logging
import time
from collections import deque
from pathlib import Path
from typing import Any, ClassVar, cast

import zmq
from zmq.utils.monitor import recv_monitor_message

from tensorwire.errors import (
    AuthenticationError,
    PeerGone,
    TransportError,
    TransportTimeout,
    WireError,
)
from tensorwire.transports.base import (
    BYE_TIMEOUT,
    Channel,
    ChannelOptions,
    deadline_after,
    remaining,
)
from tensorwire.transports.session import State, Welcomed, bye
from tensorwire.transports.sockets import drain, poller, wake, waker
from tensorwire.transports.url import host_port
from tensorwire.transports.zmq.context import process_context
from tensorwire.transports.zmq.curve import (
    CURVE_HINT,
    check_curve_available,
    client_curve_file,
    hub_public_key,
    one_curve_option,
)
from tensorwire.transports.zmq.options import ZmqChannelOptions
from tensorwire.transports.zmq.pieces import COPY_BYTES, START, message_pieces
from tensorwire.transports.zmq.reassembler import Reassembler
from tensorwire.transports.zmq.sockets import (
    CHANNEL_MONITOR_EVENTS,
    CRYPTOGRAPHIC,
    EVENTS,
    MECHANISM_MISMATCH,
    POLLIN,
    POLLOUT,
    QUEUE_PIECES,
    SEND_LAST,
    configure,
    endpoint,
    monitor_socket,
    poll_ms,
    protocol_error,
    queue_piece,
    recv_frames,
    wait_released,
)
from tensorwire.transports.zmq.turns import Turns
from tensorwire.wire import EncodedMessage, Message

log = logging.getLogger("tensorwire.transports.zmq")

CONNECT_ATTEMPT_S = 1.0  # seconds a channel waits for the TCP connection before dial retries
HANDSHAKE_RESETS = 3  # handshakes a hub closed in one dial: its encryption does not match
CLOSE_GRACE_S = 2.0  # beyond the linger, how long a close waits for libzmq to end the socket


class ZmqChannel(Channel):
    """A client's DEALER connected to a :class:`ZmqHub`; dials for ``timeouts.connect`` seconds.

    With ``tls=`` or ``curve=`` (a file whose first line is the hub's CURVE public key;
    default ``hub.curve.pub`` beside ``tls.ca``, else ``hub.curve`` there; also the URL option
    ``?curve=``) the connection is encrypted with CURVE, under a fresh client key pair per
    connection. ``key=`` is this device's enrolled secret (bytes, hex, or a file of hex),
    proven in the hello; ``tls.cert`` is not used (CURVE has no certificates).
    """

    protocol = "zmq"

    options_type: ClassVar[type[ChannelOptions]] = ZmqChannelOptions
    options: ZmqChannelOptions

    def __init__(self, url: str, options: ZmqChannelOptions) -> None:
        super().__init__(url, options)
        curve = one_curve_option(url, options.curve)
        self._host, self._port = host_port(url)
        self._hub_key: bytes | None = None  # the hub's CURVE public key (Z85): encrypt
        self._curve_file: Path | None = None
        if self.tls is not None or curve is not None:
            check_curve_available()
            self._curve_file = client_curve_file(curve, self.tls)
            self._hub_key = hub_public_key(self._curve_file)
        self._owning = Turns(lambda: wake(self._wake_w))  # who uses the sockets
        self._pending: deque[Message | WireError] = deque()
        self._refusal: TransportError | None = None  # why this connection's handshake failed
        self._welcomed = False  # this connection's session is open
        # Handshakes the hub closed since this channel's last session began (dial's attempts).
        self._handshake_resets = 0
        self.reconnect()

    def _open(self, deadline: float | None) -> Welcomed:
        """One attempt: a DEALER whose routing id is a new session's id, its hello, the
        hub's welcome. ``TransportTimeout`` if no connection within CONNECT_ATTEMPT_S."""
        session = self._client_session(f"the hub at {self.url}")
        self._start(session.session.encode())
        try:
            attempt = deadline_after(CONNECT_ATTEMPT_S)
            with self._owning:
                try:
                    self._wait_writable(attempt if deadline is None else min(deadline, attempt))
                except TransportTimeout:
                    if not self._connected:
                        raise TransportTimeout(f"no connection to {self.url} yet") from None
                    # Connected, the handshake under way: a hub busy with many gets to it (a
                    # new attempt would queue behind it); libzmq ends a stuck one after its
                    # ZMQ_HANDSHAKE_IVL (30 s), reported as a lost connection.
                    self._wait_writable(deadline)
            self._send_encoded(session.hello(), deadline)
            welcome = session.receive(self._next_message(deadline, None))
            while not isinstance(welcome, Welcomed):  # a welcome for an earlier session
                welcome = session.receive(self._next_message(deadline, None))
        except BaseException:
            self._drop()
            raise
        self._session = session
        self._welcomed = True
        self._handshake_resets = 0
        return welcome

    def _start(self, routing_id: bytes) -> None:
        """New sockets, connecting to the hub (in the background: libzmq retries)."""
        with self._owning:
            # One context (a libzmq I/O thread and a reaper) for the process's channels; a
            # close waits until libzmq has destroyed the socket (docs, section 12).
            self._dealer = process_context().socket(zmq.DEALER)
            configure(self._dealer, self._host)
            self._dealer.routing_id = routing_id
            self._dealer.immediate = 1  # nothing queued for a connection that is not up
            if self._hub_key is not None:
                # A fresh key pair: the hub admits a device by its hello's proof, not its key.
                public, secret = zmq.curve_keypair()
                self._dealer.curve_serverkey = self._hub_key
                self._dealer.curve_publickey = public
                self._dealer.curve_secretkey = secret
            self._monitor = monitor_socket(
                self._dealer, CHANNEL_MONITOR_EVENTS | zmq.EVENT_MONITOR_STOPPED
            )
            self._wake_r, self._wake_w = waker()
            self._monitor_fd, self._wake_fd = self._monitor.fileno(), self._wake_r.fileno()
            self._poll_in = poller(self._dealer.fileno(), self._monitor_fd, self._wake_fd)
            self._poll_out = poller(self._dealer.fileno(), self._monitor_fd)
            self._reader = Reassembler(self.limits)
            self._pending.clear()
            self._closed = self._lost = self._welcomed = self._connected = False
            self._socket_gone = False
            self._refusal = None
            # A socket's FD signals only after a read found it empty: arm the monitor's.
            self._read_monitor()
            try:
                self._dealer.connect(endpoint(self._host, self._port))
            except zmq.ZMQError as exc:
                self._teardown(0.0)
                raise TransportError(f"cannot connect to {self.url}: {exc}") from None

    # -- one thread at a time on the sockets -------------------------------------------

    def _step_aside(self) -> None:
        """Called by the owner when woken: let the threads that asked go first."""
        drain(self._wake_r)
        self._owning.step_aside()

    def _check_usable(self) -> None:
        if self._closed:
            raise PeerGone("channel is closed; call reconnect()")
        if self._refusal is not None:  # before _lost: the connection closed because of it
            raise self._refusal
        if self._lost:
            raise PeerGone(f"lost the connection to the hub at {self.url}; call reconnect()")

    def _read_monitor(self) -> None:
        while True:
            try:
                event = recv_monitor_message(self._monitor, zmq.NOBLOCK)
            except zmq.Again:
                return
            if event["event"] == zmq.EVENT_MONITOR_STOPPED:  # the socket is gone
                self._socket_gone = True
            elif event["event"] == zmq.EVENT_CONNECTED:
                self._connected = True
            elif event["event"] == zmq.EVENT_DISCONNECTED:
                self._lost = True
            elif self._welcomed and not self._lost:
                # A CURVE message that does not open (altered on the way): libzmq reports it
                # but then stops reading the connection without closing it.
                log.warning(
                    "zmq: the connection to the hub at %s is lost: a message failed ZMTP's "
                    "checks (%s; with CURVE: altered on the way?)",
                    self.url,
                    protocol_error(event["value"]),
                )
                self._lost = True
            elif not self._lost:  # libzmq's own reconnects after a loss do not matter
                self._refusal = self._refusal or self._handshake_error(
                    event["event"], event["value"]
                )

    def _handshake_error(self, event: int, code: int) -> TransportError:
        """What a failed ZMTP handshake means: :class:`AuthenticationError` (final: ``dial``
        does not retry it) when the two sides' encryption does not match, else a
        ``TransportError`` that ``dial`` retries."""
        where = f"the hub at {self.url}"
        if event == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL:
            if code == MECHANISM_MISMATCH and self._hub_key is not None:
                return AuthenticationError(
                    f"{where} does not encrypt (no CURVE), and this channel does not talk in "
                    "clear: serve it with tls= and its CURVE keys, or connect without tls=/curve="
                )
            if code == MECHANISM_MISMATCH:
                return AuthenticationError(f"{where} requires CURVE encryption: {CURVE_HINT}")
            if code == CRYPTOGRAPHIC:
                return AuthenticationError(
                    f"{where} failed the CURVE handshake: it does not hold the secret key of "
                    f"the public key in {self._curve_file}"
                )
            return TransportError(f"the handshake with {where} failed: {protocol_error(code)}")
        # The hub closed the connection during the handshake. A CURVE hub does so when our
        # hello box does not open (the wrong public key), and on a client without CURVE; a hub
        # without CURVE on a CURVE client. If the close reset the connection before the hub's
        # greeting was read, libzmq cannot say which; a hub whose encryption matches never
        # closes a handshake, so a few in a row tell.
        self._handshake_resets += 1
        n = self._handshake_resets
        error = AuthenticationError if n >= HANDSHAKE_RESETS else TransportError
        if error is AuthenticationError:
            self._handshake_resets = 0  # judged: a later reconnect counts afresh
        if self._hub_key is not None:
            return error(
                f"{where} ended the CURVE handshake {n} time(s): its key is not the public key "
                f"in {self._curve_file} (the wrong hub, or a stale key file?), or it does not "
                "encrypt"
            )
        return error(
            f"{where} closed the connection during the ZMTP handshake {n} time(s): it "
            f"requires CURVE encryption, most likely ({CURVE_HINT})"
        )

    # -- sending -----------------------------------------------------------------------

    def _send_encoded(self, enc: EncodedMessage, deadline: float | None) -> None:
        if enc.nbytes < COPY_BYTES:  # one frame, copied by libzmq: no trackers to wait on
            frame = b"".join([START, *enc.frames()])
            turns = self._owning
            if not turns.lock.acquire(False):
                turns.wait_turn()
            try:
                while True:
                    if self._closed or self._lost or self._refusal is not None:
                        self._check_usable()
                    try:
                        self._dealer.send(frame, SEND_LAST)
                        return
                    except zmq.Again:  # not connected, or its queue is full
                        self._wait_writable(deadline)
            finally:
                turns.lock.release()
        trackers: list[zmq.MessageTracker] = []
        # The sockets stay ours until the last piece is queued: another sender's pieces
        # must not come between them.
        with self._owning:
            self._check_usable()
            for piece in message_pieces(enc):
                while not queue_piece(self._dealer, piece, trackers):
                    self._wait_writable(deadline)
        wait_released(trackers, deadline, "the hub")

    def _wait_writable(self, deadline: float | None) -> None:
        """Wait until the DEALER takes a message: connected, and its queue not full."""
        # ZMQ_FD signals any change of the events (edge-triggered): wait on it only after
        # ZMQ_EVENTS said "not writable", and ask again after every wake-up.
        while not cast(int, self._dealer.get(EVENTS)) & POLLOUT:
            self._check_usable()
            left = remaining(deadline)
            if left == 0.0:
                raise TransportTimeout(
                    f"the hub at {self.url} took no message within the timeout (not connected, "
                    f"or its queue of {QUEUE_PIECES} pieces stayed full)"
                )
            for fd, _ in self._poll_out.poll(poll_ms(left)):
                if fd == self._monitor_fd:
                    self._read_monitor()

    # -- receiving ---------------------------------------------------------------------

    def _recv_message(self, deadline: float | None, out: Any) -> Message:
        while True:
            msg: Message | WireError | None
            if self._pending:
                msg = self._pending.popleft()
            else:
                events = self._reader.feed(self._next_frames(deadline), out)
                msg = events[0] if len(events) == 1 else self._first_of(events)
                if msg is None:
                    continue
            if isinstance(msg, WireError):
                raise msg
            session = self._session  # open-session data first: receive's Data, unmade
            if (msg.kind == "data" and session.state is State.OPEN) or self._is_data(session, msg):
                return msg

    def _first_of(self, events: list[Message | WireError]) -> Message | WireError | None:
        """The first of ``events`` (the others wait in ``_pending``); None if there are none."""
        self._pending.extend(events)
        return self._pending.popleft() if self._pending else None

    def _next_message(self, deadline: float | None, out: Any) -> Message:
        """The next message of any kind; its WireError if it was malformed."""
        while not self._pending:
            self._pending.extend(self._reader.feed(self._next_frames(deadline), out))
        event = self._pending.popleft()
        if isinstance(event, WireError):
            raise event
        return event

    def _next_frames(self, deadline: float | None) -> list[zmq.Frame]:
        """The frames of the DEALER's next ZeroMQ message, waiting for it until ``deadline``."""
        turns = self._owning
        if not turns.lock.acquire(False):
            turns.wait_turn()
        try:
            dealer = self._dealer
            while True:
                if self._closed or self._lost or self._refusal is not None:
                    self._check_usable()
                if dealer.get(EVENTS) & POLLIN:  # readable
                    return recv_frames(dealer)
                if deadline is None:
                    ms = None
                else:  # poll_ms(remaining(deadline))
                    left = deadline - time.monotonic()
                    if left <= 0.0:
                        raise TransportTimeout(f"no message from the hub at {self.url} in time")
                    ms = int(left * 1000) + 1
                for fd, _ in self._poll_in.poll(ms):
                    if fd == self._monitor_fd:
                        self._read_monitor()  # lost: what arrived before is still read first
                    elif fd == self._wake_fd:
                        self._step_aside()
        finally:
            turns.lock.release()

    # -- closing -----------------------------------------------------------------------

    def _teardown(self, linger_s: float) -> None:
        """Close the DEALER and wait until libzmq has destroyed it: its connection's session
        ended, a goodbye out or the linger over. libzmq 4.3.5 aborts the process when a
        connection fails while a closed socket's session is still ending in the middle of a
        multipart message (``session_base.cpp:233``); the context's own close (``term``)
        waited for this, a shared context does not."""
        self._closed = True
        self._dealer.close(linger=int(linger_s * 1000))
        deadline = deadline_after(linger_s + CLOSE_GRACE_S)
        while not self._socket_gone and self._monitor.poll(poll_ms(remaining(deadline))):
            self._read_monitor()
        if not self._socket_gone:
            log.debug("zmq: the channel to %s closed without libzmq's word that it ended", self.url)
        self._monitor.close(linger=0)
        self._wake_r.close()
        self._wake_w.close()

    def _drop(self) -> None:
        """Close the connection without a goodbye."""
        with self._owning:
            if not self._closed:
                self._teardown(0.0)

    def _say_goodbye(self) -> None:
        """Queue the bye and close with a linger: libzmq's I/O thread sends it as the context
        ends (a bye queued by the default, then dropped at once, would be thrown away)."""
        with self._owning:
            if self._closed:
                return
            linger = 0.0
            if not self._lost:
                with contextlib.suppress(zmq.ZMQError):
                    if queue_piece(self._dealer, next(message_pieces(bye())), []):
                        linger = BYE_TIMEOUT
            self._teardown(linger)
