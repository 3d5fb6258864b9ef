"""A hub's members: who joined on which connection, with what codecs and limits, and the
events, logs and callbacks their coming and going makes."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tensorwire.errors import TransportTimeout
from tensorwire.transports.base.dialling import deadline_after, remaining
from tensorwire.transports.base.endpoint import _Endpoint
from tensorwire.transports.base.logs import OPEN_DOOR, _log_limited, log
from tensorwire.transports.session import Authenticate, Hello
from tensorwire.transports.url import redacted

MAX_EVENTS = 10_000  # membership events kept per hub


@dataclass(frozen=True)
class MembershipEvent:
    """A change a hub's caller should see: ``kind`` is ``joined``, ``left``, ``refused``,
    ``replaced`` (a client's newer session took over), ``slow`` (a send missed its deadline),
    ``medium-lost`` / ``medium-back`` (the broker connection), ``broker-near-limit`` (the
    broker's connection limit is almost reached); ``at`` is unix seconds."""

    kind: str
    client_id: str | None
    reason: str
    at: float


@dataclass(frozen=True)
class _Member:
    decoders: frozenset[str]
    max_message_bytes: int | None  # the largest message it accepts; None: not announced
    session: object  # the connection it joined on (see Hub._joined)


class Membership(_Endpoint):
    """The membership half of a hub, which its transport's threads drive: ``_joined``,
    ``_left``, ``_refused``; ``clients`` and ``wait_for`` for its caller."""

    url: str
    authenticate: Authenticate | None
    on_join: Callable[[str], None] | None
    on_leave: Callable[[str, str], None] | None
    on_event: Callable[[MembershipEvent], None] | None
    _open_door_said: bool
    _cond: threading.Condition
    _members: dict[str, _Member]
    events: deque[MembershipEvent]
    _call_timeout: float | None

    def _session_options(self) -> dict[str, Any]:
        """Keyword arguments for a :class:`~tensorwire.transports.session.HubSession`."""
        return {
            "decoders": self.decoders,
            "max_message_bytes": self.limits.max_message_bytes,
            "authenticate": self.authenticate,
        }

    def _event(self, kind: str, client_id: str | None, reason: str) -> None:
        event = MembershipEvent(kind, client_id, reason, time.time())
        self.events.append(event)
        if self.on_event:
            try:
                self.on_event(event)
            except Exception:  # the caller's bug must not end a transport thread
                log.exception("%s: on_event(%s) raised", self.protocol, event)

    def _joined(
        self,
        client_id: str,
        decoders: frozenset[str],
        session: object = None,
        max_message_bytes: int | None = None,
    ) -> None:
        """``client_id`` is a member now. ``session`` (a connection object) ties the
        membership to one connection, so that an old connection's late :meth:`_left` cannot
        remove the client that has since reconnected."""
        self._announce_member(
            client_id, self._make_member(client_id, decoders, session, max_message_bytes)
        )

    def _make_member(
        self,
        client_id: str,
        decoders: frozenset[str],
        session: object = None,
        max_message_bytes: int | None = None,
    ) -> bool:
        """The membership half of :meth:`_joined` (no logs, events or callbacks), for a
        transport that must be a member before its welcome goes out; True if it replaced one."""
        with self._cond:
            replaced = client_id in self._members
            self._members[client_id] = _Member(decoders, max_message_bytes, session)
            self._cond.notify_all()
        return replaced

    def _member_from(self, hello: Hello, session: object) -> bool:
        """:meth:`_make_member` for the client ``hello`` names, with its codecs and limit, on
        ``session``: a hub calls it where the welcome is queued, in the same hold of the lock
        its sends look connections up under, then :meth:`_announce_member` outside it."""
        return self._make_member(
            hello.client_id, hello.decoders, session, max_message_bytes=hello.max_message_bytes
        )

    def _announce_member(self, client_id: str, replaced: bool) -> None:
        """The other half of :meth:`_joined`: the log line, event and ``on_join``."""
        log.info("%s: client %r joined", self.protocol, client_id)
        if self.authenticate is None and not self._open_door_said:
            self._open_door_said = True
            log.warning(
                "%s: the hub at %s accepts ANYONE who can reach it (%r joined with no "
                "credential): serve(..., auth=tensorwire.Keys.load(DIR)) and tls=tensorwire.TLS("
                "...) to admit only enrolled devices (tensorwire certs makes the files)",
                self.protocol,
                redacted(getattr(self, "url", "?")),
                client_id,
                extra={OPEN_DOOR: True},  # a benchmark's own loopback hubs say it once, their way
            )
        self._event("replaced" if replaced else "joined", client_id, "said hello")
        if self.on_join:
            self.on_join(client_id)

    def _left(self, client_id: str, reason: str, session: object = None) -> None:
        """``client_id`` left; with ``session``, only if that connection is still its own."""
        with self._cond:
            member = self._members.get(client_id)
            if member is None or (session is not None and member.session is not session):
                return  # unknown, or an older connection's end: the client is back on a newer one
            del self._members[client_id]
            self._cond.notify_all()
        log.info("%s: client %r left: %s", self.protocol, client_id, reason)
        self._event("left", client_id, reason)
        if self.on_leave:
            self.on_leave(client_id, reason)

    def _refused(self, who: str, exc: Exception) -> None:
        """A session was refused (bad hello, version, credential): logged, rate-limited."""
        # one key per kind of refusal and host (not port): a flood of connections logs once
        host = who.rsplit(":", 1)[0]
        _log_limited(
            f"refused {type(exc).__name__} {host}",
            f"{self.protocol}: refused a session from {who}: {exc}",
        )
        self._event("refused", None, f"{who}: {exc}")

    # -- for the hub's caller --------------------------------------------------------

    @property
    def clients(self) -> list[str]:
        """Ids of the clients connected now, sorted."""
        with self._cond:
            return sorted(self._members)

    def wait_for(self, n: int, timeout: float | None = None) -> list[str]:
        """Block until at least ``n`` clients have joined; return their ids."""
        if timeout is None:
            timeout = self._call_timeout
        deadline = deadline_after(timeout)
        with self._cond:
            while len(self._members) < n:
                left = remaining(deadline)
                if left == 0.0:
                    raise TransportTimeout(
                        f"only {len(self._members)} of {n} clients joined within {timeout} s: "
                        f"{sorted(self._members)}"
                    )
                self._cond.wait(left)
            return sorted(self._members)
