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
from typing import ClassVar

from tensorwire.codecs import get_codec
from tensorwire.errors import PeerGone, SessionRefused, TransportError, WireError
from tensorwire.transports.base import Hub, HubOptions, deadline_after
from tensorwire.transports.security import TLS
from tensorwire.transports.session import HELLO_LIMITS, Closed, Data, HubSession, bye
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
    MAX_HANDSHAKES,
    ShmHubOptions,
    address,
    name_of,
    require_linux,
    seed_bandwidth,
)
from tensorwire.transports.shm.outbox import Outbox, send_message
from tensorwire.transports.shm.releaser import Releaser
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
        self._lsock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self._lsock.bind(address(name))
        except OSError as exc:
            self._lsock.close()
            raise TransportError(
                f"cannot serve {self.url}: {exc} (another hub serves that name? pick another)"
            ) from None
        self._lsock.listen(options.backlog)
        self._outbox = Outbox(options.max_segments, options.cache_bytes)
        self._releaser = Releaser(f"tensorwire-shm-release-{name}")
        self._conns: dict[str, Connection] = {}
        self._lock = threading.Lock()
        self._threads: set[threading.Thread] = set()  # one per connection, until it ends
        self._accepting = threading.Thread(
            target=self._accept_loop, name=f"tensorwire-shm-accept-{name}", daemon=True
        )
        self._accepting.start()

    def _accept_loop(self) -> None:
        while True:
            try:
                sock, _ = self._lsock.accept()
            except OSError:
                return  # listening socket shut down by close()
            with self._lock:
                crowded = len(self._threads) - len(self._conns) >= MAX_HANDSHAKES
            if crowded:  # a flood of silent connections must not cost a thread each
                self._refused(who(sock), TransportError("too many handshakes"))
                sock.close()
                continue
            t = threading.Thread(
                target=self._serve_connection, args=(sock,), name="tensorwire-shm-conn", daemon=True
            )
            with self._lock:
                self._threads.add(t)
            t.start()

    def _handshake(self, sock: socket.socket) -> HubSession:
        """Read the hello (under HELLO_LIMITS) and answer it; raise why if it is refused."""
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
        send_packet(sock, [session.welcome().to_bytes()], deadline)
        return session

    def _serve_connection(self, sock: socket.socket) -> None:
        try:
            session = self._handshake(sock)
        except (WireError, TransportError) as exc:
            self._refused(who(sock), exc)
            sock.close()
            with self._lock:
                self._threads.discard(threading.current_thread())
            return
        hello = session.hello
        assert hello is not None
        cid = hello.client_id
        conn = Connection(sock, cid)
        mappings = Mappings(conn, self._releaser.queue)
        with self._lock:
            old = self._conns.get(cid)
            self._conns[cid] = conn
        if old is not None:
            log.info("shm: client %r reconnected; closing its old connection", cid)
            old.shutdown()
        self._joined(cid, hello.decoders, session=conn, max_message_bytes=hello.max_message_bytes)
        reason = self._read_loop(conn, mappings, session)
        with self._lock:
            current = self._conns.get(cid) is conn
            if current:
                del self._conns[cid]
            self._threads.discard(threading.current_thread())
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
        event = session.receive(msg)
        if isinstance(event, Data):
            self._delivered(conn.peer, msg)
        elif isinstance(event, Closed):
            return event.reason
        else:
            log.debug("shm: %r: %s", conn.peer, event)
        return None

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
        with contextlib.suppress(OSError):
            self._lsock.shutdown(socket.SHUT_RDWR)
        self._lsock.close()
        self._accepting.join(timeout=5)
        with self._lock:
            conns = list(self._conns.values())
            threads = list(self._threads)
        goodbye = bye("the hub is closing").to_bytes()
        for conn in conns:
            with contextlib.suppress(TransportError):
                conn.send([goodbye], deadline_after(BYE_TIMEOUT))
            conn.shutdown()
        for t in threads:
            t.join(timeout=5)
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
