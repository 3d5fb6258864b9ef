"""The udp:// hub: one UDP socket for every client's datagrams, and a TCP listener on the
same port number for their control connections.

Each control connection carries one session (``docs/session.md``): its first message, read
under :data:`~tensorwire.transports.session.HELLO_LIMITS`, is the client's ``hello`` (with
its ``udp_port``); the hub answers ``welcome`` (with its ``mode`` and UDP port) or
``refuse``; then its flow's ``sent`` / ``ack`` / ``nack`` / ``drop`` go both ways, and
``bye`` ends it. Data messages come and go as datagrams (``flow.py``). One I/O thread reads
every socket; a decode thread turns what it reassembled into messages, in arrival order.

With ``tls=`` the control connections run TLS 1.3 (mutual when the settings name a CA: the
certificate's name must be the hello's client id), handshaken in the I/O thread
(``secure.TlsPipe``), and the welcome carries a fresh random key from which both sides derive
the AEAD key of the session's datagrams (with the session key, when ``auth=`` enrols keys).
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from tensorwire.errors import (
    AuthenticationError,
    PeerGone,
    SessionRefused,
    TransportError,
    TransportTimeout,
    WireError,
)
from tensorwire.transports.base import Hub, HubOptions, deadline_after
from tensorwire.transports.security import peer_common_name
from tensorwire.transports.session import (
    CONTROL_KINDS,
    HELLO_LIMITS,
    Closed,
    Hello,
    HubSession,
    Joined,
    bye,
)
from tensorwire.transports.sockets import MAX_HANDSHAKES, shutdown, tune
from tensorwire.transports.udp.flow import Flow
from tensorwire.transports.udp.flow_base import control_limits
from tensorwire.transports.udp.flow_timers import FlowTimers
from tensorwire.transports.udp.loop import IoLoop
from tensorwire.transports.udp.loss import Received, decode_received
from tensorwire.transports.udp.options import parse_udp_url
from tensorwire.transports.udp.secure import (
    DATAGRAM_KEY_BYTES,
    DatagramSeal,
    TlsPipe,
    check_sealed_mtu,
    datagram_key,
)
from tensorwire.transports.udp.sockets import (
    CONTROL_READ_BYTES,
    MAX_DATAGRAM,
    ControlReader,
    ControlWriter,
    bind_pair,
    drain,
    peer_key,
)
from tensorwire.transports.udp.stats import UdpStats
from tensorwire.transports.udp.strangers import StrangerReport
from tensorwire.wire import EncodedMessage, Message
from tensorwire.wire.format import MAGIC
from tensorwire.wire.tensors import TensorPath, flatten

log = logging.getLogger("tensorwire.transports.udp")

HANDSHAKE_TIMEOUT = 10.0  # seconds a new control connection has to say hello
BYE_TIMEOUT = 1.0  # seconds spent saying goodbye to all clients before closing anyway
DRAIN_BUDGET = 1 << 16  # datagrams handled per wake-up before the loop looks at other sockets


@dataclass(eq=False)
class _Handshake:
    sock: socket.socket
    address: Any
    reader: ControlReader
    writer: ControlWriter
    expires: float  # time.perf_counter() seconds
    session: HubSession | None = None  # made when the hello comes (after the TLS handshake)
    welcome_key: bytes | None = None  # TLS only: sent in the welcome, the datagrams' key


@dataclass(frozen=True)
class _Joined:
    hello: Hello
    replaced: bool  # it took the place of a session of the same client


def _close(sock: socket.socket) -> None:
    shutdown(sock)
    sock.close()


class UdpHub(Hub):
    """Hub at ``udp://host:port?mode=reliable|best-effort&mtu=1472&rate=5mbit``.

    Port 0 picks a free one; :attr:`url` has the real port and the options, for clients.
    ``udp_stats`` counts datagrams, retransmits, losses and dropped strangers' (and, secured,
    unverified) datagrams over every client. ``tls=`` / ``auth=`` as for every hub: TLS on
    the control connections, sealed datagrams, enrolled clients only.
    """

    protocol = "udp"

    def __init__(self, url: str, options: HubOptions) -> None:
        super().__init__(url, options)
        host, port, self.settings = parse_udp_url(url, default_port=0)
        self.mode = self.settings.mode or "reliable"
        self._ssl = None if self.tls is None else self.tls.server_context()
        if self._ssl is not None:
            check_sealed_mtu(self.settings.mtu)
        self._udp, self._listener = bind_pair(host, port, self.settings.buffer)
        shown = f"[{host}]" if ":" in host else host
        self.url = f"udp://{shown}:{self._udp.getsockname()[1]}?{self.settings.query(self.mode)}"
        self.udp_stats = UdpStats()
        self._control_limits = control_limits(self.limits)
        self._lock = threading.Lock()
        self._flows: dict[str, Flow] = {}  # client id -> flow (read by sender threads)
        self._by_address: dict[tuple[str, int], Flow] = {}  # I/O thread only
        self._handshakes: dict[socket.socket, _Handshake] = {}  # I/O thread only
        self._timers = FlowTimers()  # I/O thread only
        self._previous: dict[str, dict[TensorPath, np.ndarray]] = {}  # best-effort "out"
        self._rxbuf = bytearray(MAX_DATAGRAM)
        self._controlbuf = bytearray(CONTROL_READ_BYTES)  # every control reader's, in turn
        self._plainbuf = bytearray(CONTROL_READ_BYTES)  # and, under TLS, what it decrypts to
        self._strangers = StrangerReport()
        # Joins, messages, errors and leaves, in the order the I/O thread saw them.
        self._inbound: queue.SimpleQueue[
            tuple[Flow, Received | WireError | PeerGone | _Joined] | None
        ] = queue.SimpleQueue()
        self._decoder = threading.Thread(
            target=self._decode_loop, name="tensorwire-udp-decode", daemon=True
        )
        self._listener.setblocking(False)
        self._loop = IoLoop("tensorwire-udp-hub", self._tick)
        self._loop.add(self._udp, self._drain)
        self._loop.add(self._listener, self._accept)
        self._decoder.start()
        self._loop.start()

    # -- I/O thread: datagrams -----------------------------------------------------------

    def _tick(self, now: float) -> float | None:
        """Handshakes past their time; the flows touched or due (``FlowTimers``)."""
        soonest = self._timers.tick(now)
        while self._handshakes:
            hs = next(iter(self._handshakes.values()))  # the oldest: it expires first
            if now < hs.expires:
                soonest = hs.expires if soonest is None else min(soonest, hs.expires)
                break
            self._refused(
                hs.address[0],
                TransportTimeout(
                    f"{hs.address[0]}:{hs.address[1]} said no hello within {HANDSHAKE_TIMEOUT} s"
                ),
            )
            self._end_handshake(hs)
        return None if soonest is None else max(soonest - now, 0.0)

    def _drain(self) -> None:
        drain(self._udp, self._rxbuf, self._on_datagram, DRAIN_BUDGET)

    def _on_datagram(self, view: memoryview, sender: tuple[str, int], now: float) -> None:
        flow = self._by_address.get(sender)
        if flow is None:
            self._stranger(sender, len(view))
            return
        self._timers.touch(flow)
        try:
            flow.on_datagram(view, now)
        except WireError as exc:
            self._rejected(flow.label, exc)
        except PeerGone:
            pass  # its ack could not be written: the writer's on_broken ends the session

    def _stranger(self, sender: tuple[str, int], nbytes: int) -> None:
        """Drop a datagram from an address no joined client said was its own: counted in
        ``udp_stats``, reported (``errors``, log) at most once per ``STRANGER_REPORT_S``."""
        self.udp_stats.add(stranger_datagrams=1)
        error = self._strangers.note(sender, nbytes)
        if error is not None:
            self._rejected("stranger", error)

    # -- I/O thread: control connections -------------------------------------------------

    def _accept(self) -> None:
        try:
            conn, address = self._listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:  # out of file descriptors, say: the loop tries again
            log.warning("udp: accept failed: %s", exc)
            return
        if len(self._handshakes) >= MAX_HANDSHAKES:  # a flood of silent connections
            self._refused(
                address[0],
                TransportError(
                    f"{address[0]}:{address[1]}: {MAX_HANDSHAKES} connections are already "
                    "waiting to say hello"
                ),
            )
            _close(conn)
            return
        tune(conn)
        tls = None if self._ssl is None else TlsPipe(self._ssl, server_side=True)
        hs = _Handshake(
            conn,
            address,
            ControlReader(conn, HELLO_LIMITS, self._controlbuf, tls, self._plainbuf),
            ControlWriter(conn, self._loop, lambda exc: self._end_handshake(hs), tls=tls),
            time.perf_counter() + HANDSHAKE_TIMEOUT,
        )
        self._handshakes[conn] = hs
        self._loop.add(conn, lambda: self._on_handshake(hs))

    def _new_session(self, hs: _Handshake) -> HubSession:
        """The session of a connection whose first message came (its TLS handshake done)."""
        options = self._session_options()
        authenticate = options["authenticate"]
        host = hs.address[0]

        def check(hello: Hello, tls_name: str | None = None) -> Any:
            # the credential first: a stranger learns nothing of whose port is whose
            result = ({}, None) if authenticate is None else authenticate(hello, tls_name)
            self._check_udp_port(host, hello)
            return result

        options["authenticate"] = check
        welcome = {"mode": self.mode, "udp_port": self._udp.getsockname()[1]}
        tls_name = None
        if hs.reader.tls is not None:
            tls_name = peer_common_name(hs.reader.tls)
            hs.welcome_key = os.urandom(DATAGRAM_KEY_BYTES)
            welcome["datagram_key"] = hs.welcome_key  # inside TLS, only ever
        return HubSession(**options, tls_name=tls_name, welcome_meta=welcome)

    def _check_udp_port(self, host: str, hello: Hello) -> None:
        """Refuse a hello without a ``udp_port``, or naming another client's: datagrams to
        and from that address would be taken for this client's."""
        port = hello.meta.get("udp_port")
        if type(port) is not int or not 0 < port < 65536:
            raise SessionRefused("hello: 'udp_port' must be the client's UDP port number")
        owner = self._by_address.get((host, port))
        if owner is not None and owner.label != hello.client_id:
            raise SessionRefused(f"hello: UDP port {host}:{port} is another client's")

    def _end_handshake(self, hs: _Handshake) -> None:
        if self._handshakes.pop(hs.sock, None) is not None:
            self._loop.remove(hs.sock)
            _close(hs.sock)

    def _on_handshake(self, hs: _Handshake) -> None:
        host = hs.address[0]
        try:
            items = hs.reader.read()
        except PeerGone:
            log.debug("udp: %s closed its control connection before saying hello", hs.address)
            self._end_handshake(hs)
            return
        except TransportError as exc:  # the TLS handshake failed
            tls, why = hs.reader.tls, exc
            if tls is not None and tls.opening == MAGIC:
                # a client without tls= said hello in clear: a clear refusal tells it at once
                why = AuthenticationError("this hub takes TLS only: connect with tls= or ?ca=")
                with contextlib.suppress(OSError):
                    hs.sock.send(HubSession.refusal(why).to_bytes(), socket.MSG_DONTWAIT)
            elif tls is not None:
                self._say(hs, None)  # its alert tells the peer why
            self._refused(host, why)
            self._end_handshake(hs)
            return
        if hs.reader.tls is not None and not self._say(hs, None):
            return  # its handshake messages could not be sent: the writer ended it
        if not items:
            return
        first, rest = items[0], items[1:]
        hs.session = session = self._new_session(hs)
        try:
            if isinstance(first, WireError):
                raise first
            event = session.receive(first)
        except SessionRefused as exc:
            self._say(hs, HubSession.refusal(exc))  # the peer may not read: told if it fits
            self._refused(host, exc)
            self._end_handshake(hs)
            return
        except WireError as exc:
            self._refused(host, exc)
            self._end_handshake(hs)
            return
        assert isinstance(event, Joined)
        del self._handshakes[hs.sock]  # its connection goes on as the flow's
        hs.reader.stream.limits = self._control_limits  # a member now: its control messages
        self._open_flow(hs, event.hello, rest)

    @staticmethod
    def _say(hs: _Handshake, enc: EncodedMessage | None) -> bool:
        """Write ``enc`` (None: what TLS has to say) on a connection not yet joined, without
        waiting; False if the connection broke."""
        try:
            if enc is None:
                hs.writer.push_tls()
            else:
                hs.writer.write(enc)
        except TransportError:
            return False
        return True

    def _open_flow(self, hs: _Handshake, hello: Hello, rest: list[Message | WireError]) -> None:
        cid = hello.client_id
        address = (hs.address[0], hello.meta["udp_port"])
        session = hs.session
        assert session is not None
        seal = None
        if hs.welcome_key is not None:
            seal = DatagramSeal(datagram_key(hs.welcome_key, session.key), hub=True)
        flow = Flow(
            label=cid,
            mode=self.mode,
            options=self.settings,
            udp=self._udp,
            address=address,
            reader=hs.reader,
            writer=hs.writer,
            deliver=lambda item: self._inbound.put((flow, item)),
            reject=lambda exc: self._rejected(cid, exc),
            stats=self.udp_stats,
            limits=self.limits,
            session=session,
            seal=seal,
        )
        hs.writer.on_broken = lambda exc: self._broken(flow, exc)
        # The flow and the membership (the client's codecs and limits) before the welcome,
        # which may leave at once: a client that has its welcome finds the hub knowing this
        # session; and in one hold of the lock senders look flows up under, so that no send
        # reaches it before the welcome.
        with self._lock:
            old = self._flows.get(cid)
            self._flows[cid] = flow
            replaced = self._member_from(hello, flow)
            try:
                flow.writer.write(session.welcome())  # queued, never waits
            except PeerGone as exc:
                broken: PeerGone | None = exc
            else:
                broken = None
        if old is not None:
            log.info("udp: client %r reconnected from %s; closing its old session", cid, address)
            self._drop_flow(old, "replaced by a new session")
        self._by_address[peer_key(address)] = flow
        self._loop.set_reader(hs.sock, lambda: self._on_control(flow))
        self._inbound.put((flow, _Joined(hello, replaced)))
        if broken is not None:  # joined, and gone
            self._drop_flow(flow, f"the welcome could not be sent: {broken}")
            return
        self._handle_control(flow, rest)

    def _broken(self, flow: Flow, exc: PeerGone) -> None:
        """Writing to a client failed: take what it said before (an ack, say), then drop it."""
        self._on_control(flow)
        self._drop_flow(flow, str(exc))

    def _on_control(self, flow: Flow) -> None:
        self._drain()  # datagrams sent before this control message are counted first
        try:
            items = flow.reader.read()
        except PeerGone as exc:
            self._drop_flow(flow, str(exc))
            return
        self._handle_control(flow, items)

    def _handle_control(self, flow: Flow, items: list[Message | WireError]) -> None:
        now = time.perf_counter()
        self._timers.touch(flow)
        for item in items:
            if flow.closed:
                return
            if isinstance(item, WireError):
                self._rejected(flow.label, item)
                if flow.reader.stream.broken:
                    self._drop_flow(flow, f"sent bytes that are not a tensorwire message ({item})")
                    return
                continue
            try:
                if item.kind in CONTROL_KINDS:
                    event = flow.session.receive(item)
                    if isinstance(event, Closed):
                        self._drop_flow(flow, event.reason)
                        return
                    log.debug("udp: %r: %s", flow.label, event)
                else:
                    flow.on_control(item, now)
            except WireError as exc:
                self._rejected(flow.label, exc)
            except PeerGone:  # an answer could not be written: the writer's on_broken ends
                continue  # the session once the rest of what the peer said (acks) is taken

    def _drop_flow(self, flow: Flow, reason: str) -> None:
        """Forget a client's session (in the I/O thread); it leaves unless it reconnected."""
        if flow.closed:
            return
        flow.flush(time.perf_counter())
        flow.close(PeerGone(f"client {flow.label!r} left: {reason}"))
        self._timers.discard(flow)
        self._loop.remove(flow.control)
        _close(flow.control)
        if self._by_address.get(peer_key(flow.address)) is flow:
            del self._by_address[peer_key(flow.address)]
        with self._lock:
            current = self._flows.get(flow.label) is flow
            if current:
                del self._flows[flow.label]
        if current:
            self._inbound.put((flow, PeerGone(reason)))  # after its messages, then it leaves

    # -- decode thread ---------------------------------------------------------------------

    def _decode_loop(self) -> None:
        """Decode what flows deliver, off the I/O thread, in arrival order."""
        while (item := self._inbound.get()) is not None:
            flow, got = item
            try:
                self._take(flow, got)
            except Exception as exc:  # an on_join/on_leave callback's, say: go on
                log.exception("udp: handling %s from %r failed: %s", type(got).__name__, flow, exc)

    def _take(self, flow: Flow, got: Received | WireError | PeerGone | _Joined) -> None:
        cid = flow.label
        if isinstance(got, _Joined):
            self._previous.pop(cid, None)  # a new session starts from fresh arrays
            self._announce_member(cid, got.replaced)  # a member since its welcome
        elif isinstance(got, PeerGone):
            self._previous.pop(cid, None)
            self._left(cid, str(got), session=flow)
        elif isinstance(got, WireError):
            self._rejected(cid, got)
        else:
            self._deliver(flow, cid, got)

    def _deliver(self, flow: Flow, cid: str, got: Received) -> None:
        out = None if flow.reliable else self._previous.get(cid)
        try:
            msg = decode_received(self, got, out)
        except WireError as exc:
            self._rejected(cid, exc)
            return
        if not flow.reliable:
            self._previous[cid] = dict(flatten(msg.tensors))
        if msg.kind == "data":
            self._delivered(cid, msg)

    # -- sending and closing -----------------------------------------------------------

    def _send_encoded(self, client_id: str, enc: EncodedMessage, deadline: float | None) -> None:
        with self._lock:
            flow = self._flows.get(client_id)
        if flow is None:
            raise PeerGone(f"client {client_id!r} is not connected")
        flow.send_message(enc, deadline)

    def _close_transport(self) -> None:
        with self._lock:
            flows = list(self._flows.values())
        goodbye = bye("the hub is closing")
        for flow in flows:
            with contextlib.suppress(TransportError):  # gone already: nothing to say
                flow.writer.write(goodbye)
        self._loop.stop()
        with self._lock:  # the loop may have dropped some since: those are closed already
            flows = list(self._flows.values())
        deadline = deadline_after(BYE_TIMEOUT)  # one for all: hung clients cost 1 s in all
        for flow in flows:
            flow.writer.flush(deadline)
            flow.close(PeerGone("the hub closed"))
            _close(flow.control)
        for hs in list(self._handshakes.values()):
            _close(hs.sock)
        self._listener.close()
        self._udp.close()
        self._inbound.put(None)
        self._decoder.join(timeout=5)
