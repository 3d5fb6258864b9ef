"""The shm:// channel: one control connection to the hub, a reader thread that queues the
hub's messages for ``recv``, its own :class:`Outbox` for what it sends."""

from __future__ import annotations

import socket
import threading
import time
from typing import Any, ClassVar

from tensorwire.errors import PeerGone, TransportError, WireError
from tensorwire.transports.base import Channel, ChannelOptions, Inbox
from tensorwire.transports.session import ClientSession, Closed, Welcomed
from tensorwire.transports.shm.connection import (
    Connection,
    check_peer_user,
    close_fds,
    count_of,
    recv_packet,
    send_packet,
)
from tensorwire.transports.shm.mappings import Mappings, without_frames
from tensorwire.transports.shm.options import (
    HANDSHAKE_TIMEOUT,
    INLINE_BYTES,
    ShmChannelOptions,
    address,
    name_of,
    require_linux,
    seed_bandwidth,
)
from tensorwire.transports.shm.outbox import Outbox, send_message
from tensorwire.transports.shm.releaser import Releaser
from tensorwire.wire import EncodedMessage, Message


class ShmChannel(Channel):
    """A client's connection to an :class:`ShmHub`, with :class:`ShmChannelOptions`; retries
    connecting for ``timeouts.connect`` seconds. ``key`` is its enrolled secret (bytes, hex,
    or a file of hex), proven in every hello; ``tls`` is accepted and not used (nothing leaves
    the host).
    """

    protocol = "shm"
    options_type: ClassVar[type[ChannelOptions]] = ShmChannelOptions
    options: ShmChannelOptions

    def __init__(self, url: str, options: ShmChannelOptions) -> None:
        super().__init__(url, options)
        require_linux()
        name = name_of(url)
        if not name:
            raise TransportError(f"{url!r} names no hub; write it as shm://NAME")
        seed_bandwidth(self.selector)
        self._address = address(name)
        # ("data", packet, msg, t) or ("shm", mappings, claim, t) from the reader thread, or
        # the WireError of a bad packet
        self._inbox = Inbox()
        self._conn: Connection | None = None
        self.reconnect()

    def _open(self, deadline: float | None) -> Welcomed:
        """One attempt: connect, say hello, read the answer by ``deadline`` (at most twice the
        hub's handshake window), then start reading. ``OSError`` when it may be worth
        retrying."""
        outbox = Outbox(self.options.max_segments, self.options.cache_bytes)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            sock.connect(self._address)
            check_peer_user(sock, self.options.trust_other_users)
            session = self._client_session(f"the hub at {self.url}")
            answer_by = time.monotonic() + 2 * HANDSHAKE_TIMEOUT
            if deadline is not None:
                answer_by = min(deadline, answer_by)
            send_packet(sock, [session.hello().to_bytes()], answer_by)
            buf = bytearray(INLINE_BYTES)
            n, fds = recv_packet(sock, memoryview(buf), answer_by)
            close_fds(fds)
            welcome = session.receive(self._decode_whole(memoryview(buf)[:n], time.perf_counter()))
        except BaseException:
            sock.close()
            raise
        assert isinstance(welcome, Welcomed)
        conn = Connection(sock, "hub")
        self._releaser = Releaser(f"tensorwire-shm-release-{self.client_id}")
        self._mappings = Mappings(conn, self._releaser.queue)
        self._outbox = outbox
        self._inbox = Inbox()
        self._conn = conn
        self._reader = threading.Thread(
            target=self._read_loop,
            args=(conn, session, self._mappings, outbox, self._inbox),
            name=f"tensorwire-shm-read-{self.client_id}",
            daemon=True,
        )
        self._reader.start()
        return welcome

    def _read_loop(
        self,
        conn: Connection,
        session: ClientSession,
        mappings: Mappings,
        outbox: Outbox,
        inbox: Inbox,
    ) -> None:
        """Queue the hub's messages for recv; handle releases, drops and bye at once."""
        buf = memoryview(bytearray(INLINE_BYTES))
        while True:
            fds: list[int] = []
            try:
                n, fds = recv_packet(conn.sock, buf)
                t = time.perf_counter()
                packet = bytearray(buf[:n])  # inline tensors are views of it; buf is reused
                msg = self._decode_whole(packet, t)
                if msg.kind == "data":
                    inbox.put(("data", packet, msg, t))
                elif msg.kind == "shm":
                    inbox.put(("shm", mappings, mappings.claim(msg.meta, fds), t))
                elif msg.kind == "release":
                    outbox.release(conn, count_of(msg.meta, "seg"))
                elif msg.kind == "drop":
                    mappings.drop(count_of(msg.meta, "seg"))
                elif isinstance(session.receive(msg), Closed):
                    self._lost(conn, outbox, inbox, session.closed_error())
                    return
            except WireError as exc:
                inbox.put(without_frames(exc))
            except PeerGone as exc:
                self._lost(conn, outbox, inbox, exc)
                return
            finally:
                close_fds(fds)

    @staticmethod
    def _lost(conn: Connection, outbox: Outbox, inbox: Inbox, exc: PeerGone) -> None:
        conn.alive = False
        outbox.forget(conn)
        inbox.fail(exc)

    def _recv_message(self, deadline: float | None, out: Any) -> Message:
        if self._conn is None:
            raise PeerGone("channel is closed; call reconnect()")
        item = self._inbox.get(deadline)
        if isinstance(item, WireError):
            raise item
        try:
            if item[0] == "data":
                _, packet, msg, t = item
                return msg if out is None else self._decode_whole(packet, t, out)
            _, mappings, claim, t = item
            return self._decode_whole(mappings.open(claim), t, out)
        except WireError as exc:
            raise without_frames(exc) from None

    def _send_encoded(self, enc: EncodedMessage, deadline: float | None) -> None:
        conn = self._conn
        if conn is None or not conn.alive:
            raise PeerGone("channel is closed; call reconnect()")
        failed = send_message(self._outbox, [conn], enc, deadline)
        if conn in failed:
            raise failed[conn]

    def _drop(self) -> None:
        """Cut the connection without a goodbye and stop its release thread."""
        conn, self._conn = self._conn, None
        if conn is None:
            return
        self._inbox.fail(PeerGone("channel is closed; call reconnect()"))
        conn.shutdown()
        self._reader.join(timeout=5)
        self._outbox.close()
        self._mappings.close()
        conn.sock.close()
        self._releaser.stop()
