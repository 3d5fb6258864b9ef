"""The flight:// hub: a Flight server whose sessions are each two ``DoExchange`` calls, both
coroutines on the server's event loop: the downlink writes the session's queued jobs, the
uplink reads and delivers."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterable
from typing import ClassVar

import grpc
import grpc.aio

from tensorwire.codecs import get_codec
from tensorwire.errors import (
    AuthenticationError,
    PeerGone,
    SessionRefused,
    TransportError,
    TransportTimeout,
    WireError,
)
from tensorwire.transports.base import Hub, HubOptions, remaining
from tensorwire.transports.flight import frames
from tensorwire.transports.flight.batches import control_message, feed
from tensorwire.transports.flight.frames import FlightData
from tensorwire.transports.flight.options import (
    BYE_TIMEOUT,
    HANDSHAKE_TIMEOUT,
    MAX_HANDSHAKES,
    MAX_HANDSHAKES_PER_SOURCE,
    SHUTDOWN_TIMEOUT,
    UP,
    FlightHubOptions,
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
CALL_ERRORS = (grpc.RpcError, grpc.aio.AioRpcError, OSError)
"""What a call's read or write raises when the call failed (other than being cancelled)."""
ENDED, BROKE = "ended its stream", "its connection broke"  # why an uplink ended


class FlightHub(Hub):
    """Hub serving Flight on ``flight://host:port`` (port 0 picks a free one; see :attr:`url`),
    with :class:`FlightHubOptions`. With ``tls=`` it serves gRPC over TLS only (mutual when
    ``tls.ca`` is set), never plaintext.

    Its calls are coroutines on one event loop (:class:`FlightServer`): a session costs no
    thread, only its two calls' state.
    """

    protocol = "flight"
    options_type: ClassVar[type[HubOptions]] = FlightHubOptions
    options: FlightHubOptions

    def __init__(self, url: str, options: FlightHubOptions) -> None:
        super().__init__(url, options)
        query_options(url, ())
        host, port = host_port(url, default_port=0)
        credentials = None if self.tls is None else server_tls(self.tls)
        self._batch_bytes = options.batch_bytes
        self._peers: dict[str, Peer] = {}  # members, by client id
        self._pairing = Pairing(MAX_HANDSHAKES, MAX_HANDSHAKES_PER_SOURCE)
        # ids of the latest refused hellos: their uplinks, ending, are the same refusal
        self._refused_ids: collections.deque[str] = collections.deque(maxlen=MAX_HANDSHAKES)
        self._sessions = threading.Lock()  # guards the above and _closing
        self._closing = False
        try:
            self._server = FlightServer(host, port, self._exchange, credentials)
        except (OSError, RuntimeError) as exc:  # gRPC's says only "Failed to bind"
            raise cannot_serve(url, tcp_bind_problem(host, port) or exc) from None
        self.url = f"flight://{host}:{self._server.port}"

    # -- a session's two calls, each a coroutine on the server's loop ----------------------

    @property
    def _handshakes(self) -> int:
        """Calls waiting for their session's other call now."""
        return len(self._pairing)

    async def _exchange(
        self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext
    ) -> None:
        """A ``DoExchange`` call: a downlink (the hello in a CMD descriptor), an uplink (the
        path ``tensorwire/up/SESSION``), or refused."""
        who = caller(context)
        try:
            raw = await asyncio.wait_for(anext(requests, None), HANDSHAKE_TIMEOUT)
            if raw is None:
                raise WireError("the call ended before its descriptor")
            first = frames.parse(raw)
        except TimeoutError:  # it costs no thread, but holds a call: not for ever
            self._refused(who, TransportError(f"no descriptor in {HANDSHAKE_TIMEOUT} s"))
            return
        except WireError as exc:
            self._refused(who, exc)
            return
        desc = first.descriptor
        if desc is not None and desc.type == frames.CMD:
            await self._serve_downlink(who, context, desc.cmd)
            return
        if desc is not None and desc.type == frames.PATH and len(desc.path) == 3:
            sid = desc.path[2].decode("ascii", "replace")
            if desc.path[:2] == UP:
                await self._serve_uplink(who, requests, context, sid, first)
                return
        self._refused(who, TransportError(f"unknown descriptor {desc!r}"))
        await context.abort(
            grpc.StatusCode.UNKNOWN,
            f"unknown descriptor {desc!r}: this is a tensorwire hub; "
            "use tensorwire.connect('flight://...')",
        )

    async def _serve_downlink(
        self, who: str, context: grpc.aio.ServicerContext, command: bytes
    ) -> None:
        """Take the hello, wait for the uplink, then write the client's messages."""
        waiter = await self._open_session(who, context, command)
        if waiter is None:
            return
        peer = waiter.peer
        assert peer is not None
        with contextlib.suppress(*CALL_ERRORS):  # hung up: the wait below sees it
            await context.write(frames.SCHEMA_FRAME)
        if not await self._paired(who, context, False, peer.hello.session, waiter):
            return
        peer.downlink = asyncio.current_task()
        await self._write_loop(peer, context)

    async def _open_session(
        self, who: str, context: grpc.aio.ServicerContext, command: bytes
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
            peer = Peer(hello, session, tls_name, post=self._server.post)
            return self._pairing.downlink(peer, who, time.monotonic())
        except SessionRefused as exc:
            sid = None if msg is None else msg.meta.get("session")
            if isinstance(sid, str):  # before the answer: the client hangs up its uplink after
                with self._sessions:
                    self._refused_ids.append(sid)
            self._refused(who, exc)
            with contextlib.suppress(*CALL_ERRORS):  # it hung up already
                await context.write(frames.SCHEMA_FRAME)
                await context.write(frames.metadata_frame(session.refusal(exc).to_bytes()))
        except WireError as exc:
            self._refused(who, exc)
        return None

    async def _paired(
        self,
        who: str,
        context: grpc.aio.ServicerContext,
        uplink: bool,
        sid: str,
        waiter: Waiter,
    ) -> bool:
        """Wait up to HANDSHAKE_TIMEOUT for the session's other call; False (reported, unless
        the hub is closing) if it did not come or was pushed out. A call its client hung up
        meanwhile is reported, then ends (``CancelledError``)."""
        hung_up = False
        try:
            if await waiter.wait(HANDSHAKE_TIMEOUT):
                return True
        except asyncio.CancelledError:
            hung_up = True
        if not self._pairing.withdraw(uplink, sid, waiter):
            if hung_up:  # paired as it hung up: its other call ends the session
                raise asyncio.CancelledError
            return True  # paired as it gave up
        self._report_unpaired(who, uplink, sid, waiter, hung_up)
        if hung_up:
            raise asyncio.CancelledError
        return False

    def _report_unpaired(
        self, who: str, uplink: bool, sid: str, waiter: Waiter, hung_up: bool
    ) -> None:
        if self._closing or waiter.dropped == "the hub is closing":
            return
        with self._sessions:
            if uplink and sid in self._refused_ids:  # its downlink's refusal was reported
                return
            if not uplink:  # reported here: its uplink, ending, is the same refusal
                self._refused_ids.append(sid)
        if uplink:
            call = f"the uplink of session {sid!r}"
        else:
            assert waiter.peer is not None
            call = repr(waiter.peer.client_id)
        if waiter.dropped is not None:
            how = waiter.dropped
        elif hung_up:
            how = "hung up"
        else:
            how = "came for no opening session" if uplink else "opened no uplink in time"
        self._refused(who, TransportError(f"{call} {how}"))

    async def _serve_uplink(
        self,
        who: str,
        requests: AsyncIterator[bytes],
        context: grpc.aio.ServicerContext,
        session: str,
        first: FlightData,
    ) -> None:
        """Attach to the session's downlink, join its client, then deliver its messages."""
        try:
            waiter = self._pairing.uplink(session, who, certificate_name(context), time.monotonic())
        except SessionRefused as exc:
            self._refused(who, TransportError(f"uplink for no opening session {session!r}: {exc}"))
            return
        if waiter is None:
            if not self._closing:
                self._refused(who, TransportError(f"a second uplink for session {session!r}"))
            return
        if not await self._paired(who, context, True, session, waiter):
            return
        peer = waiter.peer
        assert peer is not None
        if not self._admit(peer):
            return
        reason = BROKE
        try:
            reason = await self._read_loop(peer, requests, first)
            if reason == ENDED:  # a broken connection ends the requests, then cancels the call
                await asyncio.sleep(BYE_TIMEOUT)  # (then the finally below says it broke)
        finally:  # cancelled too: the client hung up, or the hub is closing
            self._end(peer, reason)

    def _admit(self, peer: Peer) -> bool:
        """Make ``peer`` the member for its client id (ending an older session), with its
        welcome first on its downlink; False if the hub is closing or the downlink broke
        before the welcome (the client then joined and left)."""
        cid = peer.client_id
        welcome = Job(control=peer.session.welcome().to_bytes())
        # The peer and the membership (its codecs and limits) before the welcome, which its
        # downlink may write at once: a client that has its welcome finds the hub knowing
        # this session; and in one hold of the lock senders look peers up under, so that no
        # send is queued before the welcome.
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
            peer.stop("the hub is closing", BYE_TIMEOUT)
            return False
        if old is not None:
            log.info("flight: client %r reconnected; ending its old session", cid)
            old.stop("replaced by a new session", BYE_TIMEOUT)
        self._announce_member(cid, replaced)
        if peer.gone is not None:  # it ended while joining: its leave may have found no member
            self._end(peer, peer.gone)
            self._left(cid, peer.gone, session=peer)
        return welcomed

    async def _write_loop(self, peer: Peer, context: grpc.aio.ServicerContext) -> None:
        """Write the peer's jobs until it is stopped; a failed write ends its session."""
        job: Job | None = None
        try:
            while (job := await peer.next_job()) is not None:
                await self._write_job(peer, job, context)
                job = None
        except asyncio.CancelledError:  # its client hung up, or we cut it (Peer.stop)
            if not peer.cut:
                raise
        finally:
            if job is not None:
                self._finish_job(job, PeerGone(f"downlink to {peer.client_id!r} was cut"))
            self._end(peer, BROKE)
            while (rest := peer.jobs.popleft() if peer.jobs else None) is not None:
                self._finish_job(rest, PeerGone(f"client {peer.client_id!r} is gone"))
        if peer.cut:  # a status, unlike a cancelled task, ends the call at gRPC's level
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"session ended: {peer.gone}")

    async def _write_job(self, peer: Peer, job: Job, context: grpc.aio.ServicerContext) -> None:
        error: Exception | None = None
        try:
            if job.control is not None:
                await context.write(frames.metadata_frame(job.control))
            elif peer.gone is not None or job.abandoned:
                error = PeerGone(f"client {peer.client_id!r} is gone: {peer.gone}")
            else:
                assert job.frames is not None
                for frame in job.frames:
                    if job.abandoned:
                        break
                    await context.write(frame)
        except CALL_ERRORS as exc:
            error = PeerGone(f"downlink to client {peer.client_id!r} broke: {exc}")
            self._end(peer, f"downlink broke: {exc}")
        except Exception as exc:  # handed to the sender, which raises it
            error = exc
        self._finish_job(job, error)

    @staticmethod
    def _finish_job(job: Job, error: Exception | None) -> None:
        job.error = error
        job.finished_at = time.perf_counter()
        job.done.set()

    async def _read_loop(
        self, peer: Peer, requests: AsyncIterator[bytes], first: FlightData
    ) -> str:
        """Deliver the peer's messages until it leaves; return why it left."""
        stream = MessageStream(limits=self.limits, codec_lookup=get_codec)
        data: FlightData | None = first
        while True:
            if data is None:
                try:
                    raw = await anext(requests, None)
                except CALL_ERRORS as exc:
                    return f"stream broke: {exc}"
                if raw is None:
                    return ENDED
                try:
                    data = frames.parse(raw)
                except WireError as exc:
                    self._rejected(peer.client_id, exc)
                    return f"sent bytes that are not a tensorwire message ({exc})"
            if reason := self._take(peer, stream, data):
                return reason
            data = None

    def _take(self, peer: Peer, stream: MessageStream, data: FlightData) -> str | None:
        """Act on one FlightData of an uplink; return why the session ended, if it did."""
        if data.header is not None:
            try:
                if frames.is_schema(data.header):
                    body = None
                else:
                    body = frames.batch_bytes(data.header, data.body)
                whole = None if body is None else feed(stream, body)
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
        if data.metadata is not None:
            try:
                msg = control_message(data.metadata, self.limits)
            except WireError as exc:
                self._rejected(peer.client_id, exc)
                return None
            if msg.kind == "data":
                self._rejected(peer.client_id, WireError("data in app_metadata, not a batch"))
                return None
            return self._received(peer.client_id, peer.session, msg)
        return None

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
        peer.stop(reason, BYE_TIMEOUT)
        if current:
            self._left(peer.client_id, reason, session=peer)

    # -- Hub interface ---------------------------------------------------------------------

    def _frames(self, enc: EncodedMessage, shared: bool = False) -> Iterable[bytes]:
        """``enc``'s FlightData. A message of one frame (or one that every member of a
        broadcast writes) is built here, on the sender's thread, so the hub's loop only
        writes it; a bigger one to one member, frame by frame as it is written, so only a
        frame or two of it is ever copied at once (fresh memory, page faulted, cost more
        than the copy: a 64 MiB send took twice the hub's CPU built whole)."""
        built = frames.message_frames(enc, self._batch_bytes)
        if shared or enc.nbytes <= self._batch_bytes:
            return list(built)
        return built

    def _submit(
        self, client_id: str, enc: EncodedMessage, shared: Iterable[bytes] | None = None
    ) -> tuple[Peer, Job]:
        with self._sessions:
            peer = self._peers.get(client_id)
        if peer is None:
            raise PeerGone(f"client {client_id!r} is not connected")
        job = Job(frames=self._frames(enc) if shared is None else shared)
        peer.submit(job)
        return peer, job

    def _finish(self, peer: Peer, job: Job, deadline: float | None) -> None:
        """Wait for a submitted send; past the deadline, drop its client and raise. On the
        hub's loop (a callback of ours sends) it returns at once: the loop writes it."""
        if self._server.in_loop:
            return
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
        """Queue a stream's message for the client's downlink and return at once (the
        call returned waits for its write): the stream's next message is encoded meanwhile."""
        peer, job = self._submit(client_id, enc)
        return lambda: self._finish(peer, job, deadline)

    def _send_many(
        self, clients: list[str], enc: EncodedMessage, deadline: float | None
    ) -> dict[str, float | Exception]:
        """Queue ``enc`` for every client at once: its FlightData are built once, and each
        downlink writes them."""
        started = time.perf_counter()
        results: dict[str, float | Exception] = {}
        submitted = []
        shared = self._frames(enc, shared=True)
        for c in clients:
            try:
                submitted.append((c, *self._submit(c, enc, shared)))
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
        self._server.call(self._pairing.close)
        for peer in peers:  # clients hang up on the bye, which ends their sessions' calls
            peer.stop("the hub is closing", BYE_TIMEOUT)
        if not self._server.shutdown(SHUTDOWN_TIMEOUT):
            log.warning(
                "flight: the server of %s did not stop within %s s; its thread is left to end",
                self.url,
                SHUTDOWN_TIMEOUT,
            )
