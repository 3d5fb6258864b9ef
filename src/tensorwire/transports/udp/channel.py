"""The udp:// channel: a UDP socket connected to the hub, and a TCP control connection that
carries the session (hello -> welcome | refuse, bye) and the datagrams' control messages."""

from __future__ import annotations

import contextlib
import select
import socket
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from tensorwire.errors import PeerGone, SessionRefused, TransportError, TransportTimeout, WireError
from tensorwire.transports.base import (
    Channel,
    ErrorLog,
    Inbox,
    _log_limited,
    deadline_after,
    default_client_id,
    dial,
    remaining,
)
from tensorwire.transports.session import (
    CONTROL_KINDS,
    ClientSession,
    Closed,
    Welcomed,
    bye,
)
from tensorwire.transports.stream_socket import send_encoded
from tensorwire.transports.udp.link import Link, UdpStats, control_limits, decode_received
from tensorwire.transports.udp.loop import IoLoop
from tensorwire.transports.udp.options import MODES, parse_udp_url
from tensorwire.transports.udp.sockets import (
    CONTROL_READ_BYTES,
    MAX_DATAGRAM,
    ControlReader,
    ControlWriter,
    connected_udp,
    drain,
)
from tensorwire.wire import EncodedMessage, Limits, Message
from tensorwire.wire.tensors import TensorPath, flatten

BYE_TIMEOUT = 1.0  # seconds spent saying goodbye before closing anyway
DRAIN_BUDGET = 1 << 16  # datagrams handled per wake-up before the loop looks at the control


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()


@dataclass
class _Connection:
    """What a successful hello leaves: the sockets, the open session, and what came after
    the welcome; ``rtt`` is the hello's round trip, seconds."""

    control: socket.socket
    udp: socket.socket
    reader: ControlReader
    session: ClientSession
    welcome: Welcomed
    rest: list[Message | WireError]
    rtt: float


def _first_messages(reader: ControlReader, deadline: float | None) -> list[Message | WireError]:
    """Read until the first control message is in; return all that came with it."""
    poller = select.poll()
    poller.register(reader.sock, select.POLLIN)
    while True:
        left = remaining(deadline)
        if left == 0.0:
            raise TransportTimeout("the hub did not answer hello in time")
        if poller.poll(None if left is None else max(int(left * 1000), 1)):
            items = reader.read()
            if items:
                return items


class UdpChannel(Channel):
    """A client of a :class:`UdpHub`; retries reaching it for ``timeout`` seconds.

    The hub's mode applies (a ``mode=`` in this URL must agree with it). In best-effort
    mode, :meth:`recv` decodes into the previous message's arrays unless given ``out=``, so
    a lost range keeps the last round's values; ``msg.loss`` reports the lost fraction per
    tensor (in either mode), and a message the hub sent whose header or half whose bytes
    were lost raises ``TruncatedMessage`` (the next ``recv`` goes on). ``udp_stats`` counts
    datagrams, retransmits and losses; ``errors`` keeps what was dropped (bad chunks).
    """

    protocol = "udp"

    def __init__(
        self,
        url: str,
        *,
        client_id: str | None = None,
        codec: Any = "auto",
        checksum: bool = True,
        limits: Limits = Limits(),
        timeout: float = 30.0,
    ) -> None:
        super().__init__(codec, checksum, limits)
        self.url = url
        self._host, self._port, self.options = parse_udp_url(url)
        self.client_id = client_id or default_client_id()
        self.mode = self.options.mode or "reliable"
        self.udp_stats = UdpStats()
        self.errors = ErrorLog()
        self._rxbuf = bytearray(MAX_DATAGRAM)
        self._closed = True
        self.reconnect(timeout)

    # -- connecting ----------------------------------------------------------------------

    def _open(self, deadline: float | None) -> _Connection:
        control = socket.create_connection((self._host, self._port), timeout=remaining(deadline))
        try:
            control.settimeout(None)  # blocking: deadlines are per call, never the socket's
            control.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            udp = connected_udp(self._host, self._port, self.options.buffer)
            try:
                return self._hello(control, udp, deadline)
            except BaseException:
                udp.close()
                raise
        except BaseException:
            _close(control)
            raise

    def _hello(
        self, control: socket.socket, udp: socket.socket, deadline: float | None
    ) -> _Connection:
        """Say hello on ``control`` (naming ``udp``'s port); return the open session."""
        session = ClientSession(
            self.client_id,
            decoders=self.decoders,
            max_message_bytes=self.limits.max_message_bytes,
            hello_meta={"udp_port": udp.getsockname()[1]},
            where=f"the hub at {self.url}",
        )
        reader = ControlReader(control, control_limits(self.limits), bytearray(CONTROL_READ_BYTES))
        t = time.perf_counter()
        send_encoded(control, session.hello(), deadline)
        items = _first_messages(reader, deadline)
        rtt = time.perf_counter() - t
        if isinstance(items[0], WireError):
            raise items[0]
        welcome = session.receive(items[0])  # raises the hub's refusal
        if not isinstance(welcome, Welcomed):
            raise TransportError(f"the hub at {self.url} did not answer with a welcome")
        mode = welcome.meta.get("mode")
        if mode not in MODES:
            raise SessionRefused(f"the hub at {self.url} runs an unknown mode {mode!r}")
        if self.options.mode is not None and self.options.mode != mode:
            raise SessionRefused(
                f"the hub at {self.url} runs mode={mode}, this channel asked for "
                f"mode={self.options.mode}: use the hub's URL"
            )
        return _Connection(control, udp, reader, session, welcome, items[1:], rtt)

    def reconnect(self, timeout: float = 30.0) -> None:
        """(Re)join the hub with the same client id, over new sockets."""
        if not self._closed:
            self._drop()
        conn = dial(self._open, what=self.url, timeout=timeout)
        self.mode = conn.welcome.meta["mode"]
        self.hub_decoders = conn.welcome.decoders
        self.hub_max_bytes = conn.welcome.max_message_bytes
        self._udp = conn.udp
        self._inbox = Inbox()
        self._previous: dict[TensorPath, np.ndarray] | None = None
        self._loop = IoLoop(f"tensorwire-udp-{self.client_id}", lambda now: self._link.tick(now))
        self._link = Link(
            label="hub",
            mode=self.mode,
            options=self.options,
            udp=conn.udp,
            address=None,
            reader=conn.reader,
            writer=ControlWriter(conn.control, self._loop, self._broken),
            deliver=self._inbox.put,
            reject=self._reject,
            stats=self.udp_stats,
            limits=self.limits,
            session=conn.session,
            rtt_fallback=conn.rtt,
        )
        self._loop.add(conn.udp, self._drain)
        self._loop.add(conn.control, self._on_control)
        if conn.rest:
            self._loop.call(lambda: self._handle_control(conn.rest))
        self._closed = False
        self._loop.start()

    # -- I/O thread ------------------------------------------------------------------------

    def _reject(self, exc: WireError) -> None:
        """Input dropped, not raised from ``recv``: kept in ``errors``, logged (rate-limited)."""
        self.errors.append(("hub", exc))
        _log_limited(
            f"udp channel {self.client_id}", f"udp: {self.client_id}: dropped input: {exc}"
        )

    def _drain(self) -> None:
        drain(self._udp, self._rxbuf, self._on_datagram, DRAIN_BUDGET)

    def _on_datagram(self, view: memoryview, sender: tuple[str, int], now: float) -> None:
        try:
            self._link.on_datagram(view, now)
        except WireError as exc:
            self._reject(exc.with_traceback(None))  # its frames hold buffers
        except PeerGone:
            pass  # its ack could not be written: the writer's on_broken ends the session

    def _broken(self, exc: PeerGone) -> None:
        """Writing to the hub failed: take what it said before (an ack, say), then end."""
        self._on_control()
        self._lost(exc)

    def _on_control(self) -> None:
        self._drain()  # datagrams sent before this control message are counted first
        try:
            items = self._link.reader.read()
        except PeerGone as exc:
            self._lost(exc)
            return
        self._handle_control(items)

    def _handle_control(self, items: list[Message | WireError]) -> None:
        now = time.perf_counter()
        link = self._link
        for item in items:
            if link.closed:
                return
            if isinstance(item, WireError):
                self._reject(item.with_traceback(None))
                if link.reader.stream.broken:
                    self._lost(PeerGone(f"the hub sent bytes that are not a message ({item})"))
                    return
                continue
            try:
                if item.kind in CONTROL_KINDS:
                    if isinstance(link.session.receive(item), Closed):
                        self._lost(link.session.closed_error())
                        return
                else:
                    link.on_control(item, now)
            except WireError as exc:
                self._reject(exc.with_traceback(None))
            except PeerGone:  # an answer could not be written: the writer's on_broken ends
                continue  # the session once the rest of what the hub said (acks) is taken

    def _lost(self, exc: Exception) -> None:
        """The session ended: fail waiting sends; ``recv`` raises after queued messages."""
        link = self._link
        if link.closed:
            return
        gone = exc if isinstance(exc, PeerGone) else PeerGone(str(exc))
        link.flush(time.perf_counter())
        link.close(gone)
        self._loop.remove(link.control)
        self._loop.remove(self._udp)
        with contextlib.suppress(OSError):  # the hub learns at once that this session ended
            link.control.shutdown(socket.SHUT_RDWR)
        self._inbox.fail(gone)

    # -- API ---------------------------------------------------------------------------------

    def _send_encoded(self, enc: EncodedMessage, deadline: float | None) -> None:
        if self._closed:
            raise PeerGone("channel is closed; call reconnect()")
        self._link.send_message(enc, deadline)

    def _recv_message(self, deadline: float | None, out: Any) -> Message:
        if self._closed:
            raise PeerGone("channel is closed; call reconnect()")
        while True:
            got = self._inbox.get(deadline)
            if isinstance(got, Exception):
                raise got  # a message the hub announced was lost
            best_effort = not self._link.reliable
            msg = decode_received(self, got, self._previous if out is None and best_effort else out)
            if best_effort:
                self._previous = dict(flatten(msg.tensors))
            if msg.kind == "data":
                return msg

    def _drop(self) -> None:
        """Close the sockets without a goodbye (the hub sees the connection drop)."""
        if self._closed:
            return
        self._closed = True
        self._loop.stop()
        gone = PeerGone("channel is closed; call reconnect()")
        self._link.close(gone)
        _close(self._link.control)
        self._udp.close()
        self._inbox.fail(gone)

    def close(self) -> None:
        """Say goodbye to the hub and close the sockets."""
        if self._closed:
            return
        if not self._link.closed:
            with contextlib.suppress(TransportError):  # gone already: nothing to say
                self._link.writer.write(bye())
        self._loop.stop()
        self._link.writer.flush(deadline_after(BYE_TIMEOUT))
        self._drop()
