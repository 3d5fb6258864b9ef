"""The udp:// channel: a UDP socket connected to the hub, and a TCP control connection."""

from __future__ import annotations

import contextlib
import select
import socket
import threading
import time
from collections import deque
from typing import Any

import numpy as np

from tensorwire.errors import PeerGone, TransportError, TransportTimeout, WireError
from tensorwire.transports.base import (
    PROTOCOL_VERSION,
    Channel,
    deadline_after,
    default_client_id,
    remaining,
)
from tensorwire.transports.stream_socket import send_encoded
from tensorwire.transports.udp.link import Link, Received, UdpStats, decode_received
from tensorwire.transports.udp.loop import IoLoop
from tensorwire.transports.udp.options import parse_udp_url
from tensorwire.transports.udp.sockets import MAX_DATAGRAM, ControlReader, connected_udp, drain
from tensorwire.wire import EncodedMessage, Limits, Message, encode_message
from tensorwire.wire.tensors import TensorPath, flatten

BYE_TIMEOUT = 1.0  # seconds spent saying goodbye before closing anyway
DRAIN_BUDGET = 1 << 16  # datagrams handled per wake-up before the loop looks at the control


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()


class UdpChannel(Channel):
    """A client of a :class:`UdpHub`; retries reaching it for ``timeout`` seconds.

    The hub's mode applies (a ``mode=`` in this URL must agree with it). In best-effort
    mode, :meth:`recv` decodes into the previous message's arrays unless given ``out=``, so
    a lost range keeps the last round's values; ``msg.loss`` reports the lost fraction per
    tensor (in either mode). ``udp_stats`` counts datagrams, retransmits and losses.
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
        host, port, self.options = parse_udp_url(url)
        self._host, self._port = host, port
        self.client_id = client_id or default_client_id()
        self.mode = self.options.mode or "reliable"
        self.udp_stats = UdpStats()
        self._cond = threading.Condition()
        self._inbox: deque[Received | Exception] = deque()
        self._previous: dict[TensorPath, np.ndarray] | None = None
        self._rxbuf = bytearray(MAX_DATAGRAM)
        self._closed = True
        self.reconnect(timeout)

    # -- connecting ----------------------------------------------------------------------

    def _dial(self, deadline: float | None, timeout: float) -> socket.socket:
        delay = 0.02
        while True:
            try:
                sock = socket.create_connection((self._host, self._port), timeout=timeout)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                return sock
            except OSError as exc:  # hub not up yet: keep trying until the deadline
                if deadline is not None and time.monotonic() + delay > deadline:
                    raise TransportTimeout(
                        f"could not connect to {self.url} within {timeout} s: {exc}"
                    ) from None
                time.sleep(delay)
                delay = min(delay * 2, 0.5)

    def reconnect(self, timeout: float = 30.0) -> None:
        """(Re)join the hub with the same client id, over new sockets."""
        if not self._closed:
            self._drop()
        deadline = deadline_after(timeout)
        control = self._dial(deadline, timeout)
        udp = connected_udp(self._host, self._port, self.options.buffer)
        reader = ControlReader(control)
        try:
            hello = {
                "client_id": self.client_id,
                "decoders": self.decoders,
                "version": PROTOCOL_VERSION,
                "udp_port": udp.getsockname()[1],
            }
            t = time.perf_counter()
            send_encoded(control, encode_message(None, hello, kind="hello"), deadline)
            items = self._await_welcome(reader, deadline)
            rtt = time.perf_counter() - t
        except (WireError, TransportError):
            _close(control)
            udp.close()
            raise
        welcome, rest = items[0], items[1:]
        hub_mode = welcome.meta.get("mode") if isinstance(welcome, Message) else None
        problem = None
        if not isinstance(welcome, Message) or welcome.kind != "welcome":
            problem = f"hub at {self.url} did not answer with a welcome"
        elif hub_mode not in ("reliable", "best-effort"):
            problem = f"hub at {self.url} runs an unknown mode {hub_mode!r}"
        elif self.options.mode is not None and self.options.mode != hub_mode:
            problem = (
                f"hub at {self.url} runs mode={hub_mode}, this channel asked for "
                f"mode={self.options.mode}: use the hub's URL"
            )
        if problem is not None:
            _close(control)
            udp.close()
            raise TransportError(problem)
        assert isinstance(welcome, Message)
        self.mode = hub_mode
        self.hub_decoders = frozenset(welcome.meta.get("decoders", []))
        self._udp = udp
        self._link = Link(
            label="hub",
            mode=self.mode,
            options=self.options,
            udp=udp,
            address=None,
            reader=reader,
            deliver=self._push,
            stats=self.udp_stats,
            limits=self.limits,
            rtt_fallback=rtt,
        )
        with self._cond:
            self._inbox.clear()
        self._previous = None
        self._closed = False
        self._loop = IoLoop(f"tensorwire-udp-{self.client_id}", self._link.tick)
        self._loop.add(udp, self._drain)
        self._loop.add(control, self._on_control)
        if rest:
            self._loop.call(lambda: self._handle_control(rest))
        self._loop.start()

    @staticmethod
    def _await_welcome(reader: ControlReader, deadline: float | None) -> list[Any]:
        """Read until the first control message (the welcome) is in; return all read."""
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

    # -- I/O thread ------------------------------------------------------------------------

    def _push(self, item: Received | Exception) -> None:
        with self._cond:
            self._inbox.append(item)
            self._cond.notify_all()

    def _drain(self) -> None:
        drain(self._udp, self._rxbuf, self._on_datagram, DRAIN_BUDGET)

    def _on_datagram(self, view: memoryview, sender: tuple[str, int], now: float) -> None:
        try:
            self._link.on_datagram(view, now)
        except WireError as exc:
            self._push(exc)
        except TransportError as exc:
            self._lost(exc)

    def _on_control(self) -> None:
        self._drain()  # datagrams sent before this control message are counted first
        try:
            items = self._link.reader.read()
        except PeerGone as exc:
            self._lost(exc)
            return
        self._handle_control(items)

    def _handle_control(self, items: list[Any]) -> None:
        now = time.perf_counter()
        for item in items:
            if isinstance(item, WireError):
                self._push(item)
                if self._link.reader.stream.broken:
                    self._lost(PeerGone(f"the hub sent bytes that are not a message ({item})"))
                    return
            elif item.kind == "bye":
                self._lost(PeerGone(f"hub at {self.url} closed the session"))
                return
            else:
                try:
                    self._link.on_control(item, now)
                except WireError as exc:
                    self._push(exc)
                except TransportError as exc:
                    self._lost(exc)
                    return

    def _lost(self, exc: Exception) -> None:
        """The session ended: fail waiting sends; ``recv`` raises after queued messages."""
        if self._link.closed:
            return
        gone = exc if isinstance(exc, PeerGone) else PeerGone(str(exc))
        self._link.flush(time.perf_counter())
        self._link.close(gone)
        self._loop.remove(self._link.control)
        self._loop.remove(self._udp)
        self._push(gone)

    # -- API ---------------------------------------------------------------------------------

    def _send_encoded(self, enc: EncodedMessage, deadline: float | None) -> None:
        if self._closed:
            raise PeerGone("channel is closed; call reconnect()")
        self._link.send_message(enc, deadline)

    def _recv_message(self, deadline: float | None, out: Any) -> Message:
        while True:
            with self._cond:
                while not self._inbox:
                    if self._closed or self._link.closed:
                        raise PeerGone("channel is closed; call reconnect()")
                    left = remaining(deadline)
                    if left == 0.0:
                        raise TransportTimeout("no message from the hub in time")
                    self._cond.wait(left)
                got = self._inbox.popleft()
            if isinstance(got, Exception):
                raise got
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
        self._link.close(PeerGone("channel is closed; call reconnect()"))
        _close(self._link.control)
        self._udp.close()
        with self._cond:
            self._cond.notify_all()

    def close(self) -> None:
        """Say goodbye to the hub and close the sockets."""
        if self._closed:
            return
        if not self._link.closed:
            self._link.send_control_quietly("bye", {}, BYE_TIMEOUT)
        self._drop()
