"""The flight:// hub: a Flight server whose sessions are each two ``DoExchange`` calls; a
downlink thread per session writes its queued jobs, an uplink thread reads and delivers."""

from __future__ import annotations

import collections
import contextlib
import logging
import threading
import time
from collections.abc import Callable
from typing import ClassVar

import pyarrow as pa
import pyarrow.flight as flight

from tensorwire.codecs import get_codec
from tensorwire.errors import (
    AuthenticationError,
    PeerGone,
    SessionRefused,
    TransportError,
    TransportTimeout,
    WireError,
)
from tensorwire.transports.base import Hub, HubOptions, deadline_after, remaining
from tensorwire.transports.flight.batches import batch_of, control_message, feed, pieces
from tensorwire.transports.flight.options import (
    FLIGHT_ERRORS,
    HANDSHAKE_TIMEOUT,
    MAX_HANDSHAKES,
    MAX_HANDSHAKES_PER_SOURCE,
    POLL_S,
    SCHEMA,
    SHUTDOWN_TIMEOUT,
    FlightHubOptions,
    location,
)
from tensorwire.transports.flight.pairing import Pairing, Waiter
from tensorwire.transports.flight.peer import Job, Peer
from tensorwire.transports.flight.server import FlightServer, caller
from tensorwire.transports.flight.tls import certificate_name, server_tls
from tensorwire.transports.session import HELLO_LIMITS, HubSession
from tensorwire.transports.sockets import cannot_serve, tcp_bind_problem
from tensorwire.transports.url import host_port, query_options
from tensorwire.wire import EncodedMessage, Message, MessageStream

log = logging.getLogger("tensorwire.transports.flight")


class FlightHub(Hub):
    """Hub serving Flight on ``flight://host:port`` (port 0 picks a free one; see :attr:`url`),
    with :class:`FlightHubOptions`. With ``tls=`` it serves gRPC over TLS only (mutual when
    ``tls.ca`` is set), never plaintext.
    """

    protocol = "flight"
    options_type: ClassVar[type[HubOptions]] = FlightHubOptions
    options: FlightHubOptions

    def __init__(self, url: str, options: FlightHubOptions) -> None:
        super().__init__(url, options)
        query_options(url, ())
        host, port = host_port(url, default_port=0)
        tls = {} if self.tls is None else server_tls(self.tls)
        self._batch_bytes = options.batch_bytes
        self._peers: dict[str, Peer] = {}  # members, by client id
        self._pairing = Pairing(MAX_HANDSHAKES, MAX_HANDSHAKES_PER_SOURCE)
        # ids of the latest refused hellos: their uplinks, ending, are the same refusal
        self._refused_ids: collections.deque[str] = collections.deque(maxlen=MAX_HANDSHAKES)
        self._sessions = threading.Lock()  # guards the above and _closing
        self._closing = False
        try:
            self._server = FlightServer(self, location(host, port, self.tls), **tls)
        except (OSError, pa.ArrowException) as exc:  # gRPC's says only "did not start"
            raise cannot_serve(url, tcp_bind_problem(host, port) or exc) from None
        self.url = f"flight://{host}:{self._server.port}"

    # -- a session's two calls, each in a Flight server thread -----------------------------

    @property
    def _handshakes(self) -> int:
        """Calls waiting for their session's other call now."""
        return len(self._pairing)

    def _serve_downlink(
        self,
        context: flight.ServerCallContext,
        command: bytes,
        writer: flight.MetadataRecordBatchWriter,
    ) -> None:
        """Take the hello, wait for the uplink, then write the client's messages."""
        who = caller(context)
        waiter = self._open_session(who, context, command, writer)
        if waiter is None:
            return
        peer = waiter.peer
        assert peer is not None
        with contextlib.suppress(*FLIGHT_ERRORS):  # hung up: the wait below sees it
            writer.begin(SCHEMA)
        if not self._paired(who, context, False, peer.hello.session, waiter):
            return
        self._write_loop(peer, writer)

    def _open_session(
        self,
        who: str,
        context: flight.ServerCallContext,
        command: bytes,
        writer: flight.MetadataRecordBatchWriter,
    ) -> Waiter | None:
        """Check the hello (read under HELLO_LIMITS, with the caller's certificate name) and
        offer the session to its uplink; a refused one is answered ``refuse`` and gives None."""
        tls_name = certificate_name(context)
        session = HubSession(**self._session_options(), tls_name=tls_name)
        msg = None
        try:
            if tls_name is None and self.tls is not None and self.tls.mutual:
                # gRPC verified a certificate with no name: nothing to hold the hello's id to
                raise AuthenticationError("the client certificate names no one (no CN or SAN)")
            msg = control_message(command, HELLO_LIMITS)
            session.receive(msg)
            hello = session.hello
            assert hello is not None
            return self._pairing.downlink(Peer(hello, session, tls_name), who, time.monotonic())
        except SessionRefused as exc:
            sid = None if msg is None else msg.meta.get("session")
            if isinstance(sid, str):  # before the answer: the client hangs up its uplink after
                with self._sessions:
                    self._refused_ids.append(sid)
            with contextlib.suppress(*FLIGHT_ERRORS):  # it hung up already
                writer.begin(SCHEMA)
                writer.write_metadata(session.refusal(exc).to_bytes())
            self._refused(who, exc)
        except WireError as exc:
            self._refused(who, exc)
        return None

    def _paired(
        self,
        who: str,
        context: flight.ServerCallContext,
        uplink: bool,
        sid: str,
        waiter: Waiter,
    ) -> bool:
        """Wait up to HANDSHAKE_TIMEOUT for the session's other call; False (reported, unless
        the hub is closing) if it did not come, the call was cancelled, or pushed out."""
        if waiter.wait(deadline_after(HANDSHAKE_TIMEOUT), context.is_cancelled, POLL_S):
            return True
        if not self._pairing.withdraw(uplink, sid, waiter):
            return True  # paired as it gave up
        if self._closing or waiter.dropped == "the hub is closing":
            return False
        with self._sessions:
            if uplink and sid in self._refused_ids:  # its downlink's refusal was reported
                return False
            if not uplink:  # reported here: its uplink, ending, is the same refusal
                self._refused_ids.append(sid)
        if uplink:
            call = f"the uplink of session {sid!r}"
        else:
            assert waiter.peer is not None
            call = repr(waiter.peer.client_id)
        if waiter.dropped is not None:
            how = waiter.dropped
        elif context.is_cancelled():
            how = "hung up"
        else:
            how = "came for no opening session" if uplink else "opened no uplink in time"
        self._refused(who, TransportError(f"{call} {how}"))
        return False

    def _serve_uplink(
        self,
        context: flight.ServerCallContext,
        session: str,
        reader: flight.MetadataRecordBatchReader,
    ) -> None:
        """Attach to the session's downlink, join its client, then deliver its messages."""
        who = caller(context)
        try:
            waiter = self._pairing.uplink(session, who, certificate_name(context), time.monotonic())
        except SessionRefused as exc:
            self._refused(who, TransportError(f"uplink for no opening session {session!r}: {exc}"))
            return
        if waiter is None:
            if not self._closing:
                self._refused(who, TransportError(f"a second uplink for session {session!r}"))
            return
        if not self._paired(who, context, True, session, waiter):
            return
        peer = waiter.peer
        assert peer is not None
        if self._admit(peer):
            self._end(peer, self._read_loop(peer, context, reader))

    def _admit(self, peer: Peer) -> bool:
        """Make ``peer`` the member for its client id (ending an older session), with its
        welcome first on its downlink; False if the hub is closing or the downlink broke
        before the welcome (the client then joined and left)."""
        cid = peer.client_id
        welcome = Job(control=peer.session.welcome().to_bytes())
        # The peer and the membership (its codecs and limits) before the welcome, which its
        # downlink thread may write at once: a client that has its welcome finds the hub
        # knowing this session; and in one hold of the lock senders look peers up under, so
        # that no send is queued before the welcome.
        welcomed = False
        with self._sessions:
            closing = self._closing
            if not closing:
                old = self._peers.get(cid)
                self._peers[cid] = peer
                replaced = self._member_from(peer.hello, peer)
                with contextlib.suppress(PeerGone):  # its downlink broke already: ended below
                    peer.submit(welcome)  # queued on its downlink, never waits
                    welcomed = True
        if closing:
            peer.stop("the hub is closing")
            return False
        if old is not None:
            log.info("flight: client %r reconnected; ending its old session", cid)
            old.stop("replaced by a new session")
        self._announce_member(cid, replaced)
        if peer.gone is not None:  # it ended while joining: its leave may have found no member
            self._end(peer, peer.gone)
            self._left(cid, peer.gone, session=peer)
        return welcomed

    def _write_loop(self, peer: Peer, writer: flight.MetadataRecordBatchWriter) -> None:
        """Write the peer's jobs until it is stopped; a failed write ends its session."""
        while (job := peer.jobs.get()) is not None:
            try:
                if job.control is not None:
                    writer.write_metadata(job.control)
                elif peer.gone is not None or job.abandoned:
                    job.error = PeerGone(f"client {peer.client_id!r} is gone: {peer.gone}")
                else:
                    assert job.enc is not None
                    for piece in pieces(job.enc, self._batch_bytes):
                        if job.abandoned:
                            break
                        writer.write_batch(batch_of(piece))
            except FLIGHT_ERRORS as exc:
                job.error = PeerGone(f"downlink to client {peer.client_id!r} broke: {exc}")
                self._end(peer, f"downlink broke: {exc}")
            except Exception as exc:  # handed to the sender, which raises it
                job.error = exc
            finally:
                job.finished_at = time.perf_counter()
                job.done.set()

    def _read_loop(
        self,
        peer: Peer,
        context: flight.ServerCallContext,
        reader: flight.MetadataRecordBatchReader,
    ) -> str:
        """Deliver the peer's messages until it leaves; return why it left."""
        stream = MessageStream(limits=self.limits, codec_lookup=get_codec)
        while True:
            try:
                chunk = reader.read_chunk()
            except StopIteration:
                return "its connection broke" if context.is_cancelled() else "ended its stream"
            except FLIGHT_ERRORS as exc:
                return f"stream broke: {exc}"
            if chunk.data is not None:
                try:
                    whole = feed(stream, chunk.data)
                except WireError as exc:  # the framing is lost: nothing after it is safe
                    self._deliver(peer, stream)
                    self._rejected(peer.client_id, exc)
                    return f"sent bytes that are not a tensorwire message ({exc})"
                if whole is not None and (
                    reason := self._received(peer.client_id, peer.session, whole)
                ):
                    return reason
                if reason := self._deliver(peer, stream):
                    return reason
            if chunk.app_metadata is not None:
                try:
                    msg = control_message(chunk.app_metadata, self.limits)
                except WireError as exc:
                    self._rejected(peer.client_id, exc)
                    continue
                if msg.kind == "data":
                    self._rejected(peer.client_id, WireError("data in app_metadata, not a batch"))
                    continue
                if reason := self._received(peer.client_id, peer.session, msg):
                    return reason

    def _deliver(self, peer: Peer, stream: MessageStream) -> str | None:
        """Act on the messages ``stream`` has completed, reporting the bad ones; return why
        the session ended, if one of them ended it."""
        while True:
            try:
                msg = stream.next_event()
            except WireError as exc:  # one bad message, skipped; the stream goes on
                self._rejected(peer.client_id, exc)
                continue
            if not isinstance(msg, Message):  # NEED_DATA: no whole message buffered yet
                return None
            if reason := self._received(peer.client_id, peer.session, msg):
                return reason

    def _end(self, peer: Peer, reason: str) -> None:
        """End a session (idempotent): it leaves, and its downlink says bye and ends."""
        with self._sessions:
            current = self._peers.get(peer.client_id) is peer
            if current:
                del self._peers[peer.client_id]
        peer.stop(reason)
        if current:
            self._left(peer.client_id, reason, session=peer)

    # -- Hub interface ---------------------------------------------------------------------

    def _submit(self, client_id: str, enc: EncodedMessage) -> tuple[Peer, Job]:
        with self._sessions:
            peer = self._peers.get(client_id)
        if peer is None:
            raise PeerGone(f"client {client_id!r} is not connected")
        job = Job(enc=enc)
        peer.submit(job)
        return peer, job

    def _finish(self, peer: Peer, job: Job, deadline: float | None) -> None:
        """Wait for a submitted send; past the deadline, drop its client and raise."""
        if not job.done.wait(remaining(deadline)):
            job.abandoned = True  # its stream may now hold half a message: end the session
            self._end(peer, "a send to it timed out")
            raise TransportTimeout(
                f"sending to {peer.client_id!r} did not finish in time; the client was dropped"
            )
        if job.error is not None:
            raise job.error

    def _send_encoded(self, client_id: str, enc: EncodedMessage, deadline: float | None) -> None:
        self._finish(*self._submit(client_id, enc), deadline)

    def _start_send(
        self, client_id: str, enc: EncodedMessage, deadline: float | None
    ) -> Callable[[], None]:
        """Queue a stream's message for the client's downlink thread and return at once (the
        call returned waits for its write): the stream's next message is encoded meanwhile."""
        peer, job = self._submit(client_id, enc)
        return lambda: self._finish(peer, job, deadline)

    def _send_many(
        self, clients: list[str], enc: EncodedMessage, deadline: float | None
    ) -> dict[str, float | Exception]:
        """Queue ``enc`` for every client at once: each downlink thread writes its own copy."""
        started = time.perf_counter()
        results: dict[str, float | Exception] = {}
        submitted = []
        for c in clients:
            try:
                submitted.append((c, *self._submit(c, enc)))
            except PeerGone as exc:
                results[c] = exc
        for c, peer, job in submitted:
            try:
                self._finish(peer, job, deadline)
            except Exception as exc:  # reported per client by broadcast()
                results[c] = exc
            else:
                results[c] = job.finished_at - started
        return results

    def _close_transport(self) -> None:
        with self._sessions:
            self._closing = True
            peers = list(self._peers.values())
        self._pairing.close()
        for peer in peers:  # clients hang up on the bye, which ends their sessions' calls
            peer.stop("the hub is closing")
        stopper = threading.Thread(
            target=self._server.shutdown, name="tensorwire-flight-shutdown", daemon=True
        )
        stopper.start()
        stopper.join(SHUTDOWN_TIMEOUT)
        if stopper.is_alive():
            log.warning(
                "flight: sessions of %s did not end within %s s; the server stops when they do",
                self.clients,
                SHUTDOWN_TIMEOUT,
            )
