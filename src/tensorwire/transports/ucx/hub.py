"""The ``ucx://`` hub: a UCX listener, a thread per connection, sends from the caller's thread.

The listener's callback runs on the worker's progress thread, so it only makes the endpoint
and starts the connection's thread: that thread reads the hello (under ``HELLO_LIMITS``, for
``HANDSHAKE_TIMEOUT`` seconds), welcomes or refuses it, then delivers the member's messages
until it leaves. At most ``MAX_HANDSHAKES`` connections may be saying hello at once; more are
closed at once, so silent strangers cost a bounded number of threads.

Closing lingers, as TCP's does: UCX may still hold bytes a side has sent when it closes its
endpoint, and closing drops them. So whoever says bye first waits (up to ``BYE_TIMEOUT``) for
the other's bye before closing, and each side answers a bye with its own, then waits a
moment for the other to close first: what was sent before a bye has then been read. A peer
that dies without a word is found by UCX (a socket's close, or its keepalive: see
:mod:`.settings`).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from tensorwire.errors import PeerGone, SessionRefused, TransportError, WireError
from tensorwire.transports.base import BYE_TIMEOUT, Hub, HubOptions, deadline_after, remaining
from tensorwire.transports.security import TLS
from tensorwire.transports.session import HELLO_LIMITS, HubSession, State, bye
from tensorwire.transports.ucx.pipe import LINGER_S, UcxPipe, send_closing
from tensorwire.transports.ucx.reach import refused_reach
from tensorwire.transports.ucx.settings import UcxSettings
from tensorwire.transports.ucx.workers import start_worker, stop_worker, ucx_api
from tensorwire.transports.url import host_port
from tensorwire.wire import EncodedMessage

log = logging.getLogger("tensorwire.transports.ucx")

HANDSHAKE_TIMEOUT = 10.0  # seconds a new connection has to say hello
MAX_HANDSHAKES = 256  # connections saying hello at once; more are closed unheard


@dataclass(eq=False)
class Peer:
    """A client whose hello the hub welcomed, on its connection."""

    client_id: str
    pipe: UcxPipe
    done: threading.Event = field(default_factory=threading.Event)  # its thread has ended


class UcxHub(Hub):
    """Hub listening on ``ucx://host:port`` (port 0 picks a free one; see :attr:`url`).

    ``auth=`` keys admit only enrolled clients and seal the session's bytes (see
    :mod:`~tensorwire.transports.ucx.records`); ``tls=`` is not used: UCX has no TLS, and
    one naming a CA needs ``auth=`` too.
    """

    protocol = "ucx"
    sees_client_certificates = False

    def __init__(self, url: str, options: HubOptions) -> None:
        super().__init__(url, options)
        settings = UcxSettings.from_url(url)
        host, port = host_port(url, default_port=0)
        if self.tls is not None:
            _no_tls(self.tls, self.authenticate is not None)
        api = ucx_api()
        self._worker = start_worker(settings)
        self._peers: dict[str, Peer] = {}
        self._handshakes: set[UcxPipe] = set()
        self._lock = threading.Lock()  # guards the two above and _stopping
        self._stopping = False
        self._threads: list[threading.Thread] = []
        self._listener: Any = None  # once made (its callback may come first)
        self._host = host  # a loopback host: connections from elsewhere are refused
        try:
            listener = api.UCXListener.create(
                worker=self._worker, port=port, cb_func=self._on_connect
            )
        except Exception as exc:
            stop_worker(self._worker)
            raise TransportError(
                f"cannot serve {url}: {exc} (is the port taken? pick another, or 0)"
            ) from None
        self._listener = listener
        self.url = f"ucx://{host}:{listener.port}{settings.query()}"

    def _on_connect(self, conn_request: Any) -> None:
        """A connection request (on the progress thread: start its thread, never block)."""
        while self._listener is None and not self._stopping:
            time.sleep(0)  # the listener's creation has not returned yet
        if self._stopping:
            return  # closing: its client's dial times out
        unreachable = refused_reach(self._host, conn_request)
        try:
            endpoint = self._listener.create_endpoint_from_conn_request(conn_request, True)
        except Exception as exc:
            why = unreachable or f"could not accept: {exc}"
            self._refused("a UCX peer", TransportError(why))
            return
        t = threading.Thread(
            target=self._connection,
            args=(endpoint, unreachable),
            name="tensorwire-ucx",
            daemon=True,
        )
        with self._lock:
            self._threads = [x for x in self._threads if x.is_alive()]
            self._threads.append(t)
        t.start()

    def _connection(self, endpoint: Any, unreachable: str | None = None) -> None:
        pipe = UcxPipe(endpoint, HELLO_LIMITS)
        with self._lock:
            crowded = len(self._handshakes) >= MAX_HANDSHAKES
            if self._stopping or crowded or unreachable:
                pipe.close()
                if unreachable or crowded:
                    why = unreachable or "too many handshakes at once"
                    self._refused("a UCX peer", TransportError(why))
                return
            self._handshakes.add(pipe)
        try:
            session = self._handshake(pipe)
        finally:
            with self._lock:
                self._handshakes.discard(pipe)
        if session is not None:
            self._serve(pipe, session)

    def _handshake(self, pipe: UcxPipe) -> HubSession | None:
        """Read and answer the hello; None (the connection closed) if it is refused."""
        session = HubSession(**self._session_options())
        deadline = deadline_after(HANDSHAKE_TIMEOUT)
        try:
            session.receive(pipe.read_message(deadline))
        except SessionRefused as exc:
            send_closing(pipe, session.refusal(exc), deadline_after(BYE_TIMEOUT))
            self._refused("a UCX peer", exc)
            pipe.linger(BYE_TIMEOUT)  # the client closes once it has read why: then close
            pipe.close()
            return None
        except (WireError, TransportError) as exc:
            self._refused("a UCX peer", exc)
            pipe.close()
            return None
        pipe.stream.limits = self.limits  # a member: its messages may be as large as ours
        return session

    def _serve(self, pipe: UcxPipe, session: HubSession) -> None:
        """A member's connection: membership and welcome, then its messages to its end."""
        hello = session.hello
        assert hello is not None
        cid = hello.client_id
        peer = Peer(cid, pipe)
        unwelcome = None
        with pipe.send_lock:  # no other send reaches it before its welcome
            with self._lock:
                old = self._peers.get(cid)
                self._peers[cid] = peer
            if old is not None:
                log.info("ucx: client %r reconnected; closing its old connection", cid)
                old.pipe.close()
            replaced = self._member_from(hello, peer)
            try:
                pipe.send_locked(session.welcome(), deadline_after(HANDSHAKE_TIMEOUT))
            except TransportError as exc:
                unwelcome = f"the welcome could not be sent: {exc}"
            if session.key is not None:
                pipe.seal(session.key, hub=True)
        self._announce_member(cid, replaced)
        reason = unwelcome or self._read_loop(peer, session)
        with self._lock:
            current = self._peers.get(cid) is peer
            if current:
                del self._peers[cid]
        pipe.close()
        peer.done.set()
        if current:
            self._left(cid, reason, session=peer)

    def _read_loop(self, peer: Peer, session: HubSession) -> str:
        """Deliver the peer's messages until it leaves; return why it left."""
        pipe = peer.pipe
        while True:
            try:
                msg = pipe.read_message(None)
            except WireError as exc:
                self._rejected(peer.client_id, exc)
                if pipe.stream.broken:
                    return f"sent bytes that are not a tensorwire message ({exc})"
                continue
            except TransportError as exc:
                return "the hub is closing" if self._stopping else str(exc)
            if msg.kind == "data" and session.state is State.OPEN:  # receive's Data, unmade
                self._delivered(peer.client_id, msg)
            elif reason := self._received(peer.client_id, session, msg):
                if not self._stopping:  # its bye came first: answer it (see the module doc)
                    send_closing(pipe, bye(), deadline_after(BYE_TIMEOUT))
                    pipe.linger(LINGER_S)
                return reason

    def _send_encoded(self, client_id: str, enc: EncodedMessage, deadline: float | None) -> None:
        peer = self._peers.get(client_id)  # one dict lookup: atomic, no lock
        if peer is None:
            raise PeerGone(f"client {client_id!r} is not connected")
        try:
            peer.pipe.send(enc, deadline)
        except TransportError:
            peer.pipe.close()  # a half-sent message leaves the stream unusable
            raise

    def _close_transport(self) -> None:
        with self._lock:
            self._stopping = True
            peers = list(self._peers.values())
            waiting = list(self._handshakes)
        goodbye = bye("the hub is closing")
        for peer in peers:
            if peer.pipe.send_lock.acquire(timeout=BYE_TIMEOUT):
                try:
                    send_closing_locked(peer.pipe, goodbye)
                finally:
                    peer.pipe.send_lock.release()
        deadline = deadline_after(BYE_TIMEOUT)
        for peer in peers:  # each answers bye with bye: then all it sent has been read
            peer.done.wait(remaining(deadline))
            peer.pipe.close()
        for pipe in waiting:
            pipe.close()
        with self._lock:
            threads = list(self._threads)
        for t in threads:
            t.join(timeout=5)
        stop_worker(self._worker)
        self._listener = None  # (only now: its callback may be running until the worker stops)


def send_closing_locked(pipe: UcxPipe, enc: EncodedMessage) -> None:
    """A goodbye by a thread holding the pipe's send lock, if it can go within BYE_TIMEOUT."""
    with contextlib.suppress(TransportError):
        pipe.send_locked(enc, deadline_after(BYE_TIMEOUT))


def _no_tls(tls: TLS, checked: bool) -> None:
    """ucx:// runs no TLS: a certificate check asked for (``tls.ca``) with nothing else to
    check clients would leave the door open."""
    if tls.ca is not None and not checked:
        raise TransportError(
            "ucx:// runs no TLS (UCX has none), so it cannot check client certificates: give "
            "auth= keys (tensorwire certs writes keys.json) to admit only enrolled clients; "
            "their session keys seal the traffic"
        )
    log.info("ucx: tls= is not used: enrolled keys admit clients and seal the traffic")
