"""The shm:// hub: it listens on its abstract address, runs one thread per connection, and
sends every client's big messages through one :class:`Outbox` (a broadcast writes one
segment that every client maps)."""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
import uuid
from typing import Any, ClassVar

from tensorwire.codecs import get_codec
from tensorwire.errors import PeerGone, SessionRefused, TransportError, WireError
from tensorwire.transports.base import Hub, HubOptions, deadline_after
from tensorwire.transports.security import TLS
from tensorwire.transports.session import HELLO_LIMITS, HubSession, State, bye
from tensorwire.transports.shm.connection import (
    Connection,
    check_peer_user,
    close_fds,
    count_of,
    recv_packet,
    send_packet,
    who,
)
from tensorwire.transports.shm.mappings import Mappings, without_frames
from tensorwire.transports.shm.options import (
    BYE_TIMEOUT,
    HANDSHAKE_TIMEOUT,
    INLINE_BYTES,
    ShmHubOptions,
    address,
    name_of,
    require_linux,
    seed_bandwidth,
)
from tensorwire.transports.shm.outbox import Outbox, send_message
from tensorwire.transports.shm.releaser import Releaser
from tensorwire.transports.sockets import Listener
from tensorwire.wire import EncodedMessage, decode_message

log = logging.getLogger("tensorwire.transports.shm")


class ShmHub(Hub):
    """Hub at ``shm://name`` (``shm://`` alone picks a free name; see :attr:`url`), with
    :class:`ShmHubOptions`. ``auth=`` keys admit only enrolled clients; ``tls=`` is not used
    (nothing leaves the host), and one naming a CA needs ``auth=`` too.
    """

    protocol = "shm"
    options_type: ClassVar[type[HubOptions]] = ShmHubOptions
    options: ShmHubOptions

    def __init__(self, url: str, options: ShmHubOptions) -> None:
        super().__init__(url, options)
        require_linux()
        name = name_of(url) or f"tw-{uuid.uuid4().hex[:12]}"
        if self.tls is not None:
            credentials = options.credentials
            _no_tls(self.tls, credentials.keys is not None or credentials.authenticate is not None)
        seed_bandwidth(self.selector)
        self.url = f"shm://{name}"
        lsock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            lsock.bind(address(name))
        except OSError as exc:
            lsock.close()
            raise TransportError(
                f"cannot serve {self.url}: {exc} (another hub serves that name? pick another)"
            ) from None
        lsock.listen(options.backlog)
        self._outbox = Outbox(options.max_segments, options.cache_bytes)
        self._releaser = Releaser(f"tensorwire-shm-release-{name}")
        self._conns: dict[str, Connection] = {}
        self._lock = threading.Lock()  # guards _conns
        self._listener = Listener(
            lsock,
            name=f"tensorwire-shm-{name}",
            handshake=self._handshake,
            serve=self._serve_connection,
            refused=self._refused,
            who=who,
        )

    def _handshake(self, sock: socket.socket, _address: Any) -> tuple[socket.socket, HubSession]:
        """Read the hello (under HELLO_LIMITS); raise why if it is refused. Its welcome goes
        out as the client becomes a member (:meth:`_serve_connection`)."""
        deadline = deadline_after(HANDSHAKE_TIMEOUT)
        buf = bytearray(HELLO_LIMITS.max_message_bytes)
        n, fds = recv_packet(sock, memoryview(buf), deadline)
        close_fds(fds)
        session = HubSession(**self._session_options())
        try:
            check_peer_user(sock, self.options.trust_other_users)
            session.receive(
                decode_message(memoryview(buf)[:n], limits=HELLO_LIMITS, codec_lookup=get_codec)
            )
        except SessionRefused as exc:
            with contextlib.suppress(TransportError):  # it hung up: nothing to tell
                send_packet(sock, [session.refusal(exc).to_bytes()], deadline_after(BYE_TIMEOUT))
            raise
        return sock, session

    def _serve_connection(self, admitted: tuple[socket.socket, HubSession]) -> None:
        """An admitted connection's thread: membership, then reading to its end."""
        sock, session = admitted
        hello = session.hello
        assert hello is not None
        cid = hello.client_id
        conn = Connection(sock, cid)
        mappings = Mappings(conn, self._releaser.queue)
        # The connection and the membership (its codecs and limits) before the welcome: a
        # client that has its welcome finds the hub knowing this session; and in one hold of
        # the lock senders look connections up under, so that no send reaches it before the
        # welcome.
        with self._lock:
            old = self._conns.get(cid)
            self._conns[cid] = conn
            replaced = self._member_from(hello, conn)
            try:  # a new connection's buffer is empty: the welcome never waits for room
                send_packet(sock, [session.welcome().to_bytes()], deadline_after(BYE_TIMEOUT))
            except TransportError as exc:
                unwelcome: str | None = f"the welcome could not be sent: {exc}"
            else:
                unwelcome = None
        if old is not None:
            log.info("shm: client %r reconnected; closing its old connection", cid)
            old.shutdown()
        self._announce_member(cid, replaced)
        reason = unwelcome or self._read_loop(conn, mappings, session)
        with self._lock:
            current = self._conns.get(cid) is conn
            if current:
                del self._conns[cid]
        conn.shutdown()
        self._outbox.forget(conn)
        mappings.close()
        sock.close()
        if current:
            self._left(cid, reason, session=conn)

    def _read_loop(self, conn: Connection, mappings: Mappings, session: HubSession) -> str:
        """Handle the client's packets until it leaves; return why it left."""
        buf = memoryview(bytearray(INLINE_BYTES))
        while True:
            fds: list[int] = []
            try:
                n, fds = recv_packet(conn.sock, buf)
                if reason := self._on_packet(conn, mappings, session, buf[:n], fds):
                    return reason
            except WireError as exc:
                self._rejected(conn.peer, without_frames(exc))
            except PeerGone as exc:
                return str(exc)
            finally:
                close_fds(fds)

    def _on_packet(
        self,
        conn: Connection,
        mappings: Mappings,
        session: HubSession,
        packet: memoryview,
        fds: list[int],
    ) -> str | None:
        """Act on one packet; return why the session ended, if it did. (A method of its own so
        that no local of the read loop keeps a delivered message's segment held.)"""
        t = time.perf_counter()
        # A copy of the packet: inline tensors are views of it, and the buffer is reused.
        msg = self._decode_whole(bytearray(packet), t)
        if msg.kind == "shm":
            msg = self._decode_whole(mappings.open(mappings.claim(msg.meta, fds)), t)
        elif msg.kind == "release":
            self._outbox.release(conn, count_of(msg.meta, "seg"))
            return None
        elif msg.kind == "drop":
            mappings.drop(count_of(msg.meta, "seg"))
            return None
        if msg.kind == "data" and session.state is State.OPEN:  # receive's Data, unmade
            self._delivered(conn.peer, msg)
            return None
        return self._received(conn.peer, session, msg)

    def _send_many(
        self, clients: list[str], enc: EncodedMessage, deadline: float | None
    ) -> dict[str, float | Exception]:
        """Write ``enc`` once (into one segment all of them map) and notify each client."""
        t = time.perf_counter()
        with self._lock:
            conns = {c: self._conns.get(c) for c in clients}
        results: dict[str, float | Exception] = {
            c: PeerGone(f"client {c!r} is not connected") for c, conn in conns.items() if not conn
        }
        live = {conn: c for c, conn in conns.items() if conn is not None}
        failed = send_message(self._outbox, list(live), enc, deadline)
        wire_s = time.perf_counter() - t
        for conn, c in live.items():
            results[c] = failed.get(conn, wire_s)
        return results

    def _send_encoded(self, client_id: str, enc: EncodedMessage, deadline: float | None) -> None:
        result = self._send_many([client_id], enc, deadline)[client_id]
        if isinstance(result, Exception):
            raise result

    def _close_transport(self) -> None:
        self._listener.close()
        with self._lock:
            conns = list(self._conns.values())
        goodbye = bye("the hub is closing").to_bytes()
        for conn in conns:
            with contextlib.suppress(TransportError):
                conn.send([goodbye], deadline_after(BYE_TIMEOUT))
            conn.shutdown()
        self._listener.join(timeout=5)
        self._outbox.close()
        self._releaser.stop()


def _no_tls(tls: TLS, checked: bool) -> None:
    """Check a hub's ``tls=``, which shm:// does not use: a certificate check it asks for
    (``tls.ca``) with no other check of clients (``auth=`` keys, an ``authenticate`` hook)
    to stand in for it would leave the door open."""
    if tls.ca is not None and not checked:
        raise TransportError(
            "shm:// runs no TLS (nothing leaves this host), so it cannot check client "
            "certificates: give auth= keys (tensorwire certs writes keys.json) to admit only "
            "enrolled clients"
        )
    log.info("shm: tls= is not used: nothing leaves this host; the uid check and keys admit")
