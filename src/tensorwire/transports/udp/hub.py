"""The udp:// hub: one UDP socket for every client's datagrams, and a TCP listener on the
same port number for their control connections."""

from __future__ import annotations

import contextlib
import logging
import queue
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from tensorwire.errors import ChunkError, PeerGone, TransportError, WireError
from tensorwire.transports.base import PROTOCOL_VERSION, Hub, parse_hello
from tensorwire.transports.udp.link import Link, Received, UdpStats, decode_received
from tensorwire.transports.udp.loop import IoLoop
from tensorwire.transports.udp.options import parse_udp_url
from tensorwire.transports.udp.sockets import (
    MAX_DATAGRAM,
    ControlReader,
    bind_pair,
    drain,
    peer_key,
)
from tensorwire.wire import EncodedMessage, Message, parse_chunk
from tensorwire.wire.tensors import TensorPath, flatten

log = logging.getLogger("tensorwire.transports.udp")

HANDSHAKE_TIMEOUT = 10.0  # seconds a new control connection has to say hello
BYE_TIMEOUT = 1.0  # seconds spent saying goodbye to each client before closing anyway
DRAIN_BUDGET = 1 << 16  # datagrams handled per wake-up before the loop looks at other sockets


@dataclass(eq=False)
class _Handshake:
    sock: socket.socket
    address: Any
    reader: ControlReader
    expires: float  # time.perf_counter() seconds


@dataclass(frozen=True)
class _Joined:
    decoders: frozenset[str]


def _udp_port(msg: Message) -> int:
    port = msg.meta.get("udp_port")
    if type(port) is not int or not 0 < port < 65536:
        raise TransportError("hello: 'udp_port' must be the client's UDP port number")
    return port


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):  # already closed or never connected
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()


class UdpHub(Hub):
    """Hub at ``udp://host:port?mode=reliable|best-effort&mtu=1472&rate=5mbit``.

    Port 0 picks a free one; :attr:`url` has the real port and the options, for clients.
    ``udp_stats`` counts datagrams, retransmits and losses over every client.
    """

    protocol = "udp"

    def __init__(self, url: str, **options: Any) -> None:
        super().__init__(**options)
        host, port, self.options = parse_udp_url(url, default_port=0)
        self.mode = self.options.mode or "reliable"
        self._udp, self._listener = bind_pair(host, port, self.options.buffer)
        shown = f"[{host}]" if ":" in host else host
        self.url = f"udp://{shown}:{self._udp.getsockname()[1]}?{self.options.query(self.mode)}"
        self.udp_stats = UdpStats()
        self._lock = threading.Lock()
        self._links: dict[str, Link] = {}  # client id -> link (read by sender threads)
        self._by_address: dict[tuple[str, int], Link] = {}  # I/O thread only
        self._handshakes: dict[socket.socket, _Handshake] = {}  # I/O thread only
        self._previous: dict[str, dict[TensorPath, np.ndarray]] = {}  # best-effort "out"
        self._rxbuf = bytearray(MAX_DATAGRAM)
        # Joins, messages, errors and leaves, in the order the I/O thread saw them.
        self._inbound: queue.SimpleQueue[
            tuple[Link, Received | WireError | PeerGone | _Joined] | None
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

    # -- I/O thread ----------------------------------------------------------------------

    def _tick(self, now: float) -> float | None:
        soonest: float | None = None
        for hs in [h for h in self._handshakes.values() if now >= h.expires]:
            log.warning("udp: %s did not say hello within %s s", hs.address, HANDSHAKE_TIMEOUT)
            self._end_handshake(hs)
        for hs in self._handshakes.values():
            soonest = hs.expires - now if soonest is None else min(soonest, hs.expires - now)
        for link in list(self._by_address.values()):
            due = link.tick(now)
            if due is not None:
                soonest = due if soonest is None else min(soonest, due)
        return None if soonest is None else max(soonest, 0.0)

    def _drain(self) -> None:
        drain(self._udp, self._rxbuf, self._on_datagram, DRAIN_BUDGET)

    def _on_datagram(self, view: memoryview, sender: tuple[str, int], now: float) -> None:
        link = self._by_address.get(sender)
        try:
            if link is None:
                parse_chunk(view)  # junk says what is wrong with it; a valid chunk is a stranger
                raise ChunkError(
                    f"a chunk from {sender[0]}:{sender[1]}, which has not joined: a client "
                    "joins over the control connection first"
                )
            link.on_datagram(view, now)
        except WireError as exc:
            self._rejected(link.label if link else f"udp:{sender[0]}:{sender[1]}", exc)
        except TransportError as exc:  # answering it over the control connection failed
            assert link is not None
            self._drop_link(link, str(exc))

    def _accept(self) -> None:
        try:
            conn, address = self._listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            log.warning("udp: accept failed: %s", exc)
            return
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        hs = _Handshake(conn, address, ControlReader(conn), time.perf_counter() + HANDSHAKE_TIMEOUT)
        self._handshakes[conn] = hs
        self._loop.add(conn, lambda: self._on_handshake(hs))

    def _end_handshake(self, hs: _Handshake, close: bool = True) -> None:
        self._handshakes.pop(hs.sock, None)
        self._loop.remove(hs.sock)
        if close:
            _close(hs.sock)

    def _on_handshake(self, hs: _Handshake) -> None:
        where = f"tcp:{hs.address[0]}:{hs.address[1]}"
        try:
            items = hs.reader.read()
        except PeerGone:
            self._end_handshake(hs)
            return
        if not items:
            return
        first, rest = items[0], items[1:]
        if isinstance(first, WireError):
            self._rejected(where, first)
            self._end_handshake(hs)
            return
        try:
            cid, decoders = parse_hello(first)
            address = (hs.address[0], _udp_port(first))
        except TransportError as exc:
            log.warning("udp: refused control connection from %s: %s", where, exc)
            self._end_handshake(hs)
            return
        self._end_handshake(hs, close=False)
        link = Link(
            label=cid,
            mode=self.mode,
            options=self.options,
            udp=self._udp,
            address=address,
            reader=hs.reader,
            deliver=lambda item: self._inbound.put((link, item)),
            stats=self.udp_stats,
            limits=self.limits,
        )
        with self._lock:
            old = self._links.get(cid)
            self._links[cid] = link
        if old is not None:
            log.info("udp: client %r reconnected from %s; closing its old session", cid, where)
            self._drop_link(old, "reconnected")
        self._by_address[peer_key(address)] = link
        try:
            link.send_control(
                "welcome",
                {"decoders": self.decoders, "version": PROTOCOL_VERSION, "mode": self.mode},
            )
        except TransportError as exc:
            self._drop_link(link, str(exc))
            return
        self._loop.add(hs.sock, lambda: self._on_control(link))
        self._inbound.put((link, _Joined(decoders)))
        self._handle_control(link, rest)

    def _on_control(self, link: Link) -> None:
        self._drain()  # datagrams sent before this control message are counted first
        try:
            items = link.reader.read()
        except PeerGone as exc:
            self._drop_link(link, str(exc))
            return
        self._handle_control(link, items)

    def _handle_control(self, link: Link, items: list[Message | WireError]) -> None:
        now = time.perf_counter()
        for item in items:
            if isinstance(item, WireError):
                self._rejected(link.label, item)
                if link.reader.stream.broken:
                    self._drop_link(link, f"sent bytes that are not a tensorwire message ({item})")
                    return
                continue
            if item.kind == "bye":
                self._drop_link(link, "said goodbye")
                return
            try:
                link.on_control(item, now)
            except WireError as exc:
                self._rejected(link.label, exc)
            except TransportError as exc:
                self._drop_link(link, str(exc))
                return

    def _drop_link(self, link: Link, reason: str) -> None:
        """Forget a client's session (in the I/O thread); it leaves unless it reconnected."""
        if link.closed:
            return
        link.flush(time.perf_counter())
        link.close(PeerGone(f"client {link.label!r} left: {reason}"))
        self._loop.remove(link.control)
        _close(link.control)
        if self._by_address.get(peer_key(link.address)) is link:
            del self._by_address[peer_key(link.address)]
        with self._lock:
            current = self._links.get(link.label) is link
            if current:
                del self._links[link.label]
        if current:
            self._inbound.put((link, PeerGone(reason)))  # after its messages, then it leaves

    # -- decode thread ---------------------------------------------------------------------

    def _decode_loop(self) -> None:
        """Decode what links deliver, off the I/O thread, in arrival order."""
        while (item := self._inbound.get()) is not None:
            link, got = item
            cid = link.label
            if isinstance(got, _Joined):
                self._joined(cid, got.decoders)
            elif isinstance(got, PeerGone):
                self._previous.pop(cid, None)
                self._left(cid, str(got))
            elif isinstance(got, WireError):
                self._rejected(cid, got)
            else:
                self._deliver(link, cid, got)

    def _deliver(self, link: Link, cid: str, got: Received) -> None:
        out = None if link.reliable else self._previous.get(cid)
        try:
            msg = decode_received(self, got, out)
        except WireError as exc:
            self._rejected(cid, exc)
            return
        if not link.reliable:
            self._previous[cid] = dict(flatten(msg.tensors))
        if msg.kind == "data":
            self._delivered(cid, msg)

    # -- sending and closing -----------------------------------------------------------

    def _send_encoded(self, client_id: str, enc: EncodedMessage, deadline: float | None) -> None:
        with self._lock:
            link = self._links.get(client_id)
        if link is None:
            raise PeerGone(f"client {client_id!r} is not connected")
        link.send_message(enc, deadline)

    def _close_transport(self) -> None:
        with self._lock:
            links = list(self._links.values())
        for link in links:
            link.send_control_quietly("bye", {}, BYE_TIMEOUT)
        self._loop.stop()
        for link in links:
            link.close(PeerGone("the hub closed"))
            _close(link.control)
        for hs in list(self._handshakes.values()):
            _close(hs.sock)
        self._listener.close()
        self._udp.close()
        self._inbound.put(None)
        self._decoder.join(timeout=5)
