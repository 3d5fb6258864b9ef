"""Sockets for udp://: big kernel buffers, the hub's UDP + TCP pair on one port, draining
datagrams, reading and writing control messages without blocking, and the control connection's
RTT."""

from __future__ import annotations

import contextlib
import errno
import logging
import select
import socket
import struct
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from tensorwire.errors import PeerGone, TransportError, WireError
from tensorwire.transports.sockets import cannot_serve, wait_ready
from tensorwire.transports.udp.loop import IoLoop
from tensorwire.transports.udp.secure import TlsPipe
from tensorwire.wire import NEED_DATA, EncodedMessage, Limits, Message, MessageStream

log = logging.getLogger("tensorwire.transports.udp")

SO_SNDBUFFORCE = getattr(socket, "SO_SNDBUFFORCE", 32)  # Linux values; Python lacks the names
SO_RCVBUFFORCE = getattr(socket, "SO_RCVBUFFORCE", 33)
MAX_DATAGRAM = 65535
PAIR_ATTEMPTS = 32  # free UDP ports tried before giving up finding one whose TCP twin is free
_TCP_INFO_RTT = struct.Struct("<I")  # tcpi_rtt (smoothed, microseconds) at offset 68
_TCP_INFO_RTT_OFFSET = 68
_TCP_INFO_MIN_RTT_OFFSET = 148  # tcpi_min_rtt (microseconds), Linux 4.6 and later
_TCP_INFO_BYTES = _TCP_INFO_MIN_RTT_OFFSET + 4
_NO_RTT = 0xFFFFFFFF  # tcpi_min_rtt before the connection's first RTT sample

CONTROL_READ_BYTES = 64 << 10  # bytes a control connection is read in at a time
MAX_CONTROL_BACKLOG = 16 << 20  # bytes of control messages a peer may leave unread


def set_buffers(sock: socket.socket, nbytes: int) -> None:
    """Ask for ``nbytes`` of kernel send and receive buffer; above ``net.core.[rw]mem_max``
    only with CAP_NET_ADMIN (the FORCE options), else the kernel caps it quietly."""
    for force, plain in ((SO_SNDBUFFORCE, socket.SO_SNDBUF), (SO_RCVBUFFORCE, socket.SO_RCVBUF)):
        try:
            sock.setsockopt(socket.SOL_SOCKET, force, nbytes)
        except OSError:  # not privileged: take what the sysctl allows
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, plain, nbytes)


def _family(host: str, port: int) -> tuple[socket.AddressFamily, Any]:
    try:
        family, _, _, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)[0]
    except socket.gaierror as exc:
        raise TransportError(f"cannot resolve {host!r}: {exc}") from None
    return family, address


def bind_pair(host: str, port: int, buffer: int) -> tuple[socket.socket, socket.socket]:
    """A UDP socket and a listening TCP socket on the same port number (port 0: any free).

    The URL names one port; datagrams and the control connection both use it.
    """
    family, _ = _family(host, port)
    last: OSError | None = None
    for _ in range(PAIR_ATTEMPTS if port == 0 else 1):
        udp = socket.socket(family, socket.SOCK_DGRAM)
        try:
            udp.bind((host, port))
            real = udp.getsockname()[1]
            tcp = socket.create_server((host, real), family=family, backlog=128)
        except OSError as exc:
            udp.close()
            last = exc
            continue
        set_buffers(udp, buffer)
        udp.setblocking(False)
        return udp, tcp
    assert last is not None
    raise cannot_serve(f"udp://{host}:{port} (UDP and TCP port {port})", last)


def connected_udp(host: str, port: int, buffer: int) -> socket.socket:
    """A UDP socket connected to the hub: the kernel drops datagrams from anyone else."""
    family, address = _family(host, port)
    sock = socket.socket(family, socket.SOCK_DGRAM)
    set_buffers(sock, buffer)
    sock.connect(address)
    sock.setblocking(False)
    return sock


def peer_key(address: Any) -> tuple[str, int]:
    """(host, port) of a socket address, IPv4 or IPv6, to look senders up by."""
    return address[0], address[1]


def control_rtt(sock: socket.socket, fallback: float) -> float:
    """The round-trip time of a TCP connection's path, seconds: the kernel's minimum RTT
    (where it keeps one), else its smoothed RTT, else ``fallback``.

    The minimum, because on a lossy link the smoothed RTT measures TCP's recovery, not the
    path: an ACK that is lost is answered by the next one, which may come with the peer's
    next message, a second later (measured at 20 % loss on a veth with a 0.05 ms round trip:
    up to 1.6 s)."""
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _TCP_INFO_BYTES)
        (rtt_us,) = _TCP_INFO_RTT.unpack_from(info, _TCP_INFO_RTT_OFFSET)
        if len(info) >= _TCP_INFO_BYTES:
            (min_us,) = _TCP_INFO_RTT.unpack_from(info, _TCP_INFO_MIN_RTT_OFFSET)
            if 0 < min_us < _NO_RTT:
                rtt_us = min(min_us, rtt_us or min_us)
    except (OSError, AttributeError, struct.error):
        return fallback
    return rtt_us / 1e6 if rtt_us else fallback


def drain(
    sock: socket.socket,
    buf: bytearray,
    handle: Callable[[memoryview, tuple[str, int], float], None],
    budget: int,
) -> int:
    """Hand each queued datagram to ``handle(view, sender, now)`` until none is left or
    ``budget`` were handled; return how many. ``sock`` must be non-blocking."""
    view = memoryview(buf)
    for i in range(budget):
        try:
            n, address = sock.recvfrom_into(buf)
        except (BlockingIOError, InterruptedError):
            return i
        except ConnectionRefusedError:  # an ICMP error for an earlier send: the control
            continue  # connection says whether the peer is gone
        handle(view[:n], peer_key(address), time.perf_counter())
    return budget


def send_datagram(
    sock: socket.socket,
    parts: list[Any],
    address: Any,
    deadline: float | None,
) -> None:
    """Send one datagram made of ``parts`` (to ``address``, or the connected peer if None),
    waiting for buffer space if the non-blocking socket has none."""
    while True:
        try:
            if address is None:
                sock.sendmsg(parts)
            else:
                sock.sendmsg(parts, (), 0, address)
            return
        except (BlockingIOError, InterruptedError):
            pass
        except ConnectionRefusedError:
            raise PeerGone("the peer's UDP port refused the datagram: it is gone") from None
        except OSError as exc:
            if exc.errno == errno.ENOBUFS:  # a full queue dropped it, like a lossy link would
                return
            raise TransportError(f"cannot send a datagram: {exc}") from None
        wait_ready(sock, select.POLLOUT, deadline, "waiting for room in the UDP send buffer")


class ControlReader:
    """Reads control messages from a TCP socket the I/O loop found readable, never blocking.

    ``buf`` is where bytes land before the stream takes them: the readers of one I/O thread
    share one, so a connection that says nothing costs no buffer of its own. With ``tls``
    (a :class:`~tensorwire.transports.udp.secure.TlsPipe`) they are ciphertext: each read
    advances the handshake until it is complete, then decrypts into ``plain`` (shared too).
    """

    def __init__(
        self,
        sock: socket.socket,
        limits: Limits,
        buf: bytearray,
        tls: TlsPipe | None = None,
        plain: bytearray | None = None,
    ) -> None:
        self.sock = sock
        self.stream = MessageStream(limits=limits)
        self.tls = tls
        self._buf = buf
        self._plain = None if tls is None else memoryview(plain or bytearray(len(buf)))

    def read(self) -> list[Message | WireError]:
        """The messages (or the errors of bad ones) the bytes available now complete, in
        order; ``PeerGone`` at EOF or on reset, and a ``TransportError`` if TLS fails. After a
        framing error ``stream.broken`` is true and the connection is unusable: close it."""
        try:
            n = self.sock.recv_into(self._buf, len(self._buf), socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError):
            n = None  # nothing new; a TLS pipe may still hold records from an earlier read
        except OSError as exc:
            raise PeerGone(f"control connection lost: {exc}") from None
        if n == 0:
            raise PeerGone("control connection closed")
        framing: WireError | None = None
        try:
            if self.tls is None:
                if n is None:
                    return []
                self.stream.receive_data(memoryview(self._buf)[:n])
            else:
                self._decrypt(self.tls, n)
        except WireError as exc:
            framing = exc
        items: list[Message | WireError] = []
        while True:
            try:
                event = self.stream.next_event()
            except WireError as exc:
                items.append(exc)
                continue
            if event is NEED_DATA:
                break
            items.append(event)
        if framing is not None:
            items.append(framing)
        return items

    def _decrypt(self, tls: TlsPipe, n: int | None) -> None:
        """Take ``n`` bytes of ciphertext in ``buf`` and hand the stream what they decrypt to
        (at most what arrived: a peer cannot make this loop longer than its bytes)."""
        if n:
            tls.receive(memoryview(self._buf)[:n])
        if not tls.done and not tls.handshake():
            return
        plain = self._plain
        assert plain is not None
        while got := tls.read_into(plain):
            self.stream.receive_data(plain[:got])
            # a record that did not fill the buffer was taken whole: with no ciphertext left,
            # asking again would only cost a call into OpenSSL (which lets go of the GIL)
            if got < len(plain) and not tls.buffered:
                break


class ControlWriter:
    """Writes control messages to a TCP socket without ever blocking the writing thread.

    What the kernel does not take at once waits in a queue that the I/O loop sends from when
    the socket is writable, in order. A peer that lets more than ``max_backlog`` bytes pile
    up is not reading its control connection (hung, or hostile): the writer breaks, every
    later :meth:`write` raises ``PeerGone``, and ``on_broken(exc)`` runs in the loop's thread.
    With ``tls`` it writes the records that carry each message, made under the writer's lock
    so they are sent in the order they were made.
    """

    def __init__(
        self,
        sock: socket.socket,
        loop: IoLoop,
        on_broken: Callable[[PeerGone], None],
        max_backlog: int = MAX_CONTROL_BACKLOG,
        tls: TlsPipe | None = None,
    ) -> None:
        self.sock = sock
        self.tls = tls
        self._loop = loop
        self.on_broken = on_broken
        self._max_backlog = max_backlog
        self._queue: deque[memoryview] = deque()
        self._queued = 0  # bytes in the queue
        self._lock = threading.Lock()
        self.broken: PeerGone | None = None

    def write(self, enc: EncodedMessage) -> None:
        """Send ``enc`` now, or queue what the kernel did not take; ``PeerGone`` if the
        connection is broken or its backlog would pass ``max_backlog`` bytes."""
        data = enc.to_bytes()  # control messages are small: one copy, one syscall
        with self._lock:
            first = self._put(data if self.tls is None else self.tls.encrypt(data))
        if first:
            self._loop.want_write(self.sock, self._on_writable)

    def push_tls(self) -> None:
        """Send (or queue) what the TLS pipe has to say by itself: handshake messages, an
        alert. ``PeerGone`` as :meth:`write`."""
        assert self.tls is not None
        with self._lock:
            data = self.tls.take_output()
            first = bool(data) and self._put(data)
        if first:
            self._loop.want_write(self.sock, self._on_writable)

    def _put(self, data: bytes) -> bool:
        """Send ``data`` or queue it behind what waits, with the lock held; True if the queue
        was empty and is not now (the loop must watch for room)."""
        if self.broken is not None:
            raise self.broken
        view = memoryview(data)
        if not self._queue:
            view = view[self._send(view) :]
            if not view:
                return False
        if self._queued + len(view) > self._max_backlog:
            self._break(
                PeerGone(
                    f"the peer has not read {self._queued + len(view)} bytes of control "
                    "messages: is its process stuck?"
                )
            )
            raise self.broken  # type: ignore[misc]
        self._queue.append(view)
        self._queued += len(view)
        return len(self._queue) == 1

    def _send(self, data: memoryview) -> int:
        """Bytes of ``data`` the kernel took now (0 if none fit); breaks the writer on error."""
        try:
            return self.sock.send(data, socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError):
            return 0
        except OSError as exc:
            self._break(PeerGone(f"control connection lost: {exc}"))
            raise self.broken from None  # type: ignore[misc]

    def _break(self, exc: PeerGone) -> None:
        if self.broken is None:
            self.broken = exc
            self._queue.clear()
            self._queued = 0
            self._loop.call(lambda: self.on_broken(exc))

    def _push(self) -> bool:
        """Send from the queue until it is empty (True) or the kernel takes no more."""
        while self._queue:
            head = self._queue[0]
            n = self._send(head)
            self._queued -= n
            if n < len(head):
                self._queue[0] = head[n:]
                return False
            self._queue.popleft()
        return True

    def _on_writable(self) -> None:
        with self._lock:
            try:
                done = self.broken is not None or self._push()
            except PeerGone:
                done = True
        if done:
            self._loop.want_write(self.sock, None)

    def flush(self, deadline: float | None) -> bool:
        """Block until the queue is sent (True) or ``deadline`` passes (False); for the last
        goodbye, once the I/O loop has stopped."""
        if self.sock.fileno() < 0:
            return False  # closed: the connection ended meanwhile
        poller = select.poll()
        poller.register(self.sock, select.POLLOUT)
        while True:
            with self._lock:
                try:
                    if self.broken is not None or self._push():
                        return self.broken is None
                except PeerGone:
                    return False
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return False
            poller.poll(None if left is None else max(int(left * 1000), 1))
