"""``mem://NAME``: a hub and its channels in one process (threads), over in-memory queues.

For what sits above the transports (fl, bench, code under test) where sockets are not the
point. Messages are encoded and decoded as on a wire and sessions are the same (hello,
welcome, device keys checked); nothing leaves the process, so nothing is encrypted (TLS
settings are accepted and unused, as on shm://). A channel's message is taken by the hub on
the sending thread; the hub's wait in a bounded inbox per channel, so a channel that stops
reading holds up only sends to itself, each until its deadline.
"""

from __future__ import annotations

import contextlib
import threading
import time
import weakref
from typing import Any
from urllib.parse import urlsplit

from tensorwire.errors import PeerGone, SessionRefused, TransportError, WireError
from tensorwire.transports import base
from tensorwire.transports.base import Channel, ChannelOptions, Hub, HubOptions, Inbox
from tensorwire.transports.session import (
    HELLO_LIMITS,
    Closed,
    Data,
    HubSession,
    Joined,
    State,
    Welcomed,
    bye,
)
from tensorwire.transports.url import query_options
from tensorwire.wire import EncodedMessage, Message, decode_message

QUEUE_MESSAGES = 256  # messages the hub may have waiting for one channel

_hubs: dict[str, MemHub] = {}  # the hubs of this process, by name
_hubs_lock = threading.Lock()


def _name(url: str) -> str:
    query_options(url, ())
    if not urlsplit(url).netloc:
        raise TransportError(f"{url!r} names no hub: write it as mem://NAME")
    return urlsplit(url).netloc


class _Connection:
    """One channel's session with the hub, and the hub's messages waiting for it."""

    def __init__(self, hub: MemHub) -> None:
        self.hub = hub
        self.session = HubSession(**hub._session_options())
        self.to_channel = Inbox(QUEUE_MESSAGES)
        self.name = f"mem-connection-{id(self):x}"

    def hang_up(self, reason: str) -> None:
        self.to_channel.fail(PeerGone(f"the connection ended: {reason}"))
        if self.session.client_id is not None:
            self.hub._left(self.session.client_id, reason, session=self)


class MemHub(Hub):
    """A hub that channels of this process reach by its name."""

    protocol = "mem"
    sees_client_certificates = False

    def __init__(self, url: str, options: HubOptions) -> None:
        super().__init__(url, options)
        self._name = _name(url)
        with _hubs_lock:
            if self._name in _hubs:
                raise TransportError(f"a hub already serves {url} in this process")
            _hubs[self._name] = self

    def _accept(self) -> _Connection:
        if self._closed:
            raise PeerGone(f"the hub at {self.url} is closed")
        return _Connection(self)

    def _take(self, conn: _Connection, data: bytes) -> None:
        """What a channel sent, on its own thread: its hello, data, or its goodbye."""
        started = time.perf_counter()
        opening = conn.session.client_id is None
        try:
            if opening:
                msg = decode_message(data, limits=HELLO_LIMITS, copy=True)
            else:
                msg = self._decode_whole(data, started)
            event = conn.session.receive(msg)
        except SessionRefused as exc:
            self._refused(conn.name, exc)
            conn.to_channel.put(HubSession.refusal(exc).to_bytes())
            conn.hang_up("refused")
            return
        except WireError as exc:
            if opening:
                self._refused(conn.name, exc)
                conn.hang_up("no hello")
            else:
                self._rejected(conn.session.client_id or conn.name, exc)
            return
        if isinstance(event, Joined):
            # A member before its welcome (sends read the membership without a lock): a
            # client that has its welcome finds the hub knowing its codecs.
            with self._cond:
                replaced = self._member_from(event.hello, conn)
                conn.to_channel.put(conn.session.welcome().to_bytes())  # a new queue: room
            self._announce_member(event.client_id, replaced)
        elif isinstance(event, Data):
            self._delivered(conn.session.client_id or conn.name, msg)
        elif isinstance(event, Closed):
            conn.hang_up(event.reason)

    def _send_encoded(self, client_id: str, enc: EncodedMessage, deadline: float | None) -> None:
        with self._cond:
            member = self._members.get(client_id)
        if member is None or not isinstance(member.session, _Connection):
            raise PeerGone(self._not_connected(client_id))
        member.session.to_channel.put(enc.to_bytes(), deadline)

    def _close_transport(self) -> None:
        with _hubs_lock:
            if _hubs.get(self._name) is self:
                del _hubs[self._name]
        with self._cond:
            connections = [m.session for m in self._members.values()]
        for conn in connections:
            if isinstance(conn, _Connection):
                with contextlib.suppress(OSError):
                    conn.to_channel.put(bye().to_bytes(), base.deadline_after(base.BYE_TIMEOUT))
                conn.to_channel.fail(PeerGone(f"the hub at {self.url} closed"))


class MemChannel(Channel):
    """A channel to the hub of this process that its URL names."""

    protocol = "mem"

    def __init__(self, url: str, options: ChannelOptions) -> None:
        super().__init__(url, options)
        self._name = _name(url)
        self.reconnect()

    def _open(self, deadline: float | None) -> Welcomed:
        with _hubs_lock:
            hub = _hubs.get(self._name)
        if hub is None:
            raise PeerGone(f"no hub serves {self.url} in this process (yet)")
        conn = hub._accept()
        session = self._client_session(f"the hub at {self.url}")
        hub._take(conn, session.hello().to_bytes())
        event = None
        while not isinstance(event, Welcomed):
            try:
                event = session.receive(decode_message(conn.to_channel.get(deadline), copy=True))
            except BaseException:
                conn.hang_up("its hello went unanswered")
                raise
        self._conn, self._session = conn, session
        # a channel dropped without close() leaves as a killed process's connection would
        self._finalizer = weakref.finalize(self, conn.hang_up, "its channel is gone")
        return event

    def _send_encoded(self, enc: EncodedMessage, deadline: float | None) -> None:
        if self._closed or self._conn.to_channel.failed:
            raise PeerGone(f"the channel to {self.url} is closed; call reconnect()")
        self._conn.hub._take(self._conn, enc.to_bytes())

    def _recv_message(self, deadline: float | None, out: Any) -> Message:
        if self._closed:
            raise PeerGone(f"the channel to {self.url} is closed; call reconnect()")
        while True:
            data = self._conn.to_channel.get(deadline)
            try:
                msg = self._decode_whole(data, time.perf_counter(), out)
            except WireError as exc:
                self._rejected(exc)
                continue
            session = self._session  # open-session data first: receive's Data, unmade
            if (msg.kind == "data" and session.state is State.OPEN) or self._is_data(session, msg):
                return msg

    def _drop(self) -> None:
        self._finalizer()
        self._closed = True
