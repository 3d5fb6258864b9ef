"""The udp:// channel: a UDP socket connected to the hub, and a TCP control connection that
carries the session (hello -> welcome | refuse, bye) and the datagrams' control messages.

With ``tls=`` the control connection runs TLS 1.3 (handshaken here, before the I/O loop takes
the socket; then the loop feeds what it reads through the same ``secure.TlsPipe``) and the
datagrams are sealed under the key the welcome brings; ``key=`` proves the client's secret.
"""

from __future__ import annotations

import contextlib
import select
import socket
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from tensorwire.errors import PeerGone, SessionRefused, TransportError, WireError
from tensorwire.transports.base import (
    BYE_TIMEOUT,
    Channel,
    ChannelOptions,
    Inbox,
    deadline_after,
)
from tensorwire.transports.session import (
    CONTROL_KINDS,
    ClientSession,
    Closed,
    Welcomed,
    bye,
)
from tensorwire.transports.sockets import connect_stream, sendmsg_all, shutdown, wait_ready
from tensorwire.transports.udp.flow import Flow
from tensorwire.transports.udp.flow_base import control_limits
from tensorwire.transports.udp.loop import IoLoop
from tensorwire.transports.udp.loss import decode_received
from tensorwire.transports.udp.options import MODES, parse_udp_url
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
    connected_udp,
    drain,
)
from tensorwire.transports.udp.stats import UdpStats
from tensorwire.wire import EncodedMessage, Message
from tensorwire.wire.tensors import TensorPath, flatten

DRAIN_BUDGET = 1 << 16  # datagrams handled per wake-up before the loop looks at the control


def _close(sock: socket.socket) -> None:
    shutdown(sock)
    sock.close()


@dataclass
class _Connection:
    """What a successful hello leaves: the sockets, the open session, and what came after
    the welcome; ``rtt`` is the hello's round trip, seconds; ``seal`` the datagrams' (TLS)."""

    control: socket.socket
    udp: socket.socket
    reader: ControlReader
    session: ClientSession
    welcome: Welcomed
    rest: list[Message | WireError]
    rtt: float
    seal: DatagramSeal | None


def _tls_handshake(sock: socket.socket, tls: TlsPipe, deadline: float | None) -> None:
    """Run ``tls``'s client handshake over the blocking ``sock`` by ``deadline``."""
    while True:
        try:
            done = tls.handshake()
        except TransportError:
            with contextlib.suppress(TransportError, OSError):  # the alert tells the hub why
                sendmsg_all(sock, [tls.take_output()], deadline)
            raise
        out = tls.take_output()
        if out:
            sendmsg_all(sock, [out], deadline)
        if done:
            return
        wait_ready(sock, select.POLLIN, deadline, "TLS handshake")
        data = sock.recv(1 << 16)
        if not data:
            raise PeerGone("the hub closed the connection during the TLS handshake")
        tls.receive(data)


def _first_messages(reader: ControlReader, deadline: float | None) -> list[Message | WireError]:
    """Read until the first control message is in; return all that came with it."""
    while True:
        wait_ready(reader.sock, select.POLLIN, deadline, "hello: the hub's answer")
        items = reader.read()
        if items:
            return items


def _hub_udp_port(welcome: Welcomed, default: int) -> int:
    """The port the hub's welcome says its datagrams use (the URL's if it says none)."""
    port = welcome.meta.get("udp_port", default)
    if type(port) is not int or not 0 < port < 65536:
        raise SessionRefused(f"the hub's welcome names no valid UDP port ({port!r})")
    return port


class UdpChannel(Channel):
    """A client of a :class:`UdpHub`; retries reaching it for ``timeouts.connect`` seconds.

    The hub's mode applies (a ``mode=`` in this URL must agree with it). In best-effort
    mode, :meth:`recv` decodes into the previous message's arrays unless given ``out=``, so
    a lost range keeps the last round's values; ``msg.loss`` reports the lost fraction per
    tensor (in either mode), and a message the hub sent whose header or half whose bytes
    were lost raises ``TruncatedMessage`` (the next ``recv`` goes on). ``udp_stats`` counts
    datagrams, retransmits and losses; ``errors`` keeps what was dropped (bad chunks, and
    datagrams that do not verify). ``tls=`` runs the control connection under TLS and seals the
    datagrams; ``key=`` (the enrolled secret) proves this client's id to a hub with keys.
    """

    protocol = "udp"
    options: ChannelOptions

    def __init__(self, url: str, options: ChannelOptions) -> None:
        super().__init__(url, options)
        self._host, self._port, self.settings = parse_udp_url(url)
        self.mode = self.settings.mode or "reliable"
        self._ssl = None if self.tls is None else self.tls.client_context()
        if self._ssl is not None:
            check_sealed_mtu(self.settings.mtu)
        self.udp_stats = UdpStats()
        self._rxbuf = bytearray(MAX_DATAGRAM)
        self.reconnect()

    # -- connecting ----------------------------------------------------------------------

    def _open(self, deadline: float | None) -> Welcomed:
        control = connect_stream((self._host, self._port), deadline)
        try:
            udp = connected_udp(self._host, self._port, self.settings.buffer)
            try:
                conn = self._hello(control, udp, deadline)
            except BaseException:
                udp.close()
                raise
        except BaseException:
            _close(control)
            raise
        self._start(conn)
        return conn.welcome

    def _hello(
        self, control: socket.socket, udp: socket.socket, deadline: float | None
    ) -> _Connection:
        """Say hello on ``control`` (naming ``udp``'s port), under TLS if this channel has
        it; return the open session."""
        tls = None
        if self._ssl is not None:
            assert self.tls is not None
            name = self.tls.server_name or self._host
            tls = TlsPipe(self._ssl, server_side=False, server_hostname=name)
            _tls_handshake(control, tls, deadline)
        session = self._client_session(f"the hub at {self.url}", udp_port=udp.getsockname()[1])
        buf = bytearray(CONTROL_READ_BYTES)
        reader = ControlReader(control, control_limits(self.limits), buf, tls)
        t = time.perf_counter()
        hello = session.hello().to_bytes()
        sendmsg_all(control, [hello if tls is None else tls.encrypt(hello)], deadline)
        items = _first_messages(reader, deadline)
        rtt = time.perf_counter() - t
        if isinstance(items[0], WireError):
            raise SessionRefused(
                f"the hub at {self.url} answered with bytes that are not a tensorwire message "
                f"({items[0]}): does it run TLS (tls=) where this channel does not?"
            )
        welcome = session.receive(items[0])  # raises the hub's refusal
        if not isinstance(welcome, Welcomed):
            raise TransportError(f"the hub at {self.url} did not answer with a welcome")
        mode = welcome.meta.get("mode")
        if mode not in MODES:
            raise SessionRefused(f"the hub at {self.url} runs an unknown mode {mode!r}")
        if self.settings.mode is not None and self.settings.mode != mode:
            raise SessionRefused(
                f"the hub at {self.url} runs mode={mode}, this channel asked for "
                f"mode={self.settings.mode}: use the hub's URL"
            )
        port = _hub_udp_port(welcome, self._port)
        if port != self._port:  # the control connection reaches the hub through a proxy, say
            peer = udp.getpeername()
            udp.connect((peer[0], port, *peer[2:]))
        seal = None
        if tls is not None:
            welcome_key = welcome.meta.get("datagram_key")
            if not isinstance(welcome_key, bytes) or len(welcome_key) != DATAGRAM_KEY_BYTES:
                raise SessionRefused(f"the hub at {self.url} sent no key for the datagrams")
            seal = DatagramSeal(datagram_key(welcome_key, session.key), hub=False)
        return _Connection(control, udp, reader, session, welcome, items[1:], rtt, seal)

    def _start(self, conn: _Connection) -> None:
        """Run the session a hello opened: its flow, and the I/O loop that drives it."""
        self.mode = conn.welcome.meta["mode"]
        self._udp = conn.udp
        self._inbox = Inbox()
        self._previous: dict[TensorPath, np.ndarray] | None = None
        self._loop = IoLoop(f"tensorwire-udp-{self.client_id}", lambda now: self._flow.tick(now))
        self._flow = Flow(
            label="hub",
            mode=self.mode,
            options=self.settings,
            udp=conn.udp,
            address=None,
            reader=conn.reader,
            writer=ControlWriter(conn.control, self._loop, self._broken, tls=conn.reader.tls),
            deliver=self._inbox.put,
            reject=self._rejected,
            stats=self.udp_stats,
            limits=self.limits,
            session=conn.session,
            rtt_fallback=conn.rtt,
            seal=conn.seal,
        )
        self._loop.add(conn.udp, self._drain)
        self._loop.add(conn.control, self._on_control)
        if conn.rest:
            self._loop.call(lambda: self._handle_control(conn.rest))
        self._loop.start()

    # -- I/O thread ------------------------------------------------------------------------

    def _drain(self) -> None:
        drain(self._udp, self._rxbuf, self._on_datagram, DRAIN_BUDGET)

    def _on_datagram(self, view: memoryview, sender: tuple[str, int], now: float) -> None:
        try:
            self._flow.on_datagram(view, now)
        except WireError as exc:
            self._rejected(exc)
        except PeerGone:
            pass  # its ack could not be written: the writer's on_broken ends the session

    def _broken(self, exc: PeerGone) -> None:
        """Writing to the hub failed: take what it said before (an ack, say), then end."""
        self._on_control()
        self._lost(exc)

    def _on_control(self) -> None:
        self._drain()  # datagrams sent before this control message are counted first
        try:
            items = self._flow.reader.read()
        except PeerGone as exc:
            self._lost(exc)
            return
        self._handle_control(items)

    def _handle_control(self, items: list[Message | WireError]) -> None:
        now = time.perf_counter()
        flow = self._flow
        for item in items:
            if flow.closed:
                return
            if isinstance(item, WireError):
                self._rejected(item)
                if flow.reader.stream.broken:
                    self._lost(PeerGone(f"the hub sent bytes that are not a message ({item})"))
                    return
                continue
            try:
                if item.kind in CONTROL_KINDS:
                    if isinstance(flow.session.receive(item), Closed):
                        self._lost(flow.session.closed_error())
                        return
                else:
                    flow.on_control(item, now)
            except WireError as exc:
                self._rejected(exc)
            except PeerGone:  # an answer could not be written: the writer's on_broken ends
                continue  # the session once the rest of what the hub said (acks) is taken

    def _lost(self, exc: Exception) -> None:
        """The session ended: fail waiting sends; ``recv`` raises after queued messages."""
        flow = self._flow
        if flow.closed:
            return
        gone = exc if isinstance(exc, PeerGone) else PeerGone(str(exc))
        flow.flush(time.perf_counter())
        flow.close(gone)
        self._loop.remove(flow.control)
        self._loop.remove(self._udp)
        shutdown(flow.control)  # the hub learns at once that this session ended
        self._inbox.fail(gone)

    # -- API ---------------------------------------------------------------------------------

    def _send_encoded(self, enc: EncodedMessage, deadline: float | None) -> None:
        if self._closed:
            raise PeerGone("channel is closed; call reconnect()")
        self._flow.send_message(enc, deadline)

    def _recv_message(self, deadline: float | None, out: Any) -> Message:
        if self._closed:
            raise PeerGone("channel is closed; call reconnect()")
        while True:
            got = self._inbox.get(deadline)
            if isinstance(got, Exception):
                raise got  # a message the hub announced was lost
            best_effort = not self._flow.reliable
            msg = decode_received(self, got, self._previous if out is None and best_effort else out)
            if best_effort:
                self._previous = dict(flatten(msg.tensors))
            if msg.kind == "data":
                return msg

    def _drop(self) -> None:
        """Close the sockets without a goodbye (the hub sees the connection drop)."""
        if self._closed:
            return
        self._loop.stop()
        gone = PeerGone("channel is closed; call reconnect()")
        self._flow.close(gone)
        _close(self._flow.control)
        self._udp.close()
        self._inbox.fail(gone)

    def _say_goodbye(self) -> None:
        """Queue ``bye`` on the control connection, stop the I/O loop and give the bye
        ``BYE_TIMEOUT`` seconds to go out."""
        if not self._flow.closed:
            with contextlib.suppress(TransportError):  # gone already: nothing to say
                self._flow.writer.write(bye())
        self._loop.stop()
        self._flow.writer.flush(deadline_after(BYE_TIMEOUT))
