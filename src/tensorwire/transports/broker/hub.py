"""The hub of a broker transport: its members' sessions, payloads sealed for them, a unicast
or one publish for all, the medium lost / back, and members that go quiet (a grace to return).

A transport subclasses :class:`BrokerHub`: it publishes (:meth:`BrokerHub._publish_to`,
:meth:`BrokerHub._publish_all`), feeds what its broker delivers to the sessions, calls
:meth:`BrokerHub._tick` now and then from its consuming thread, and reports the medium.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from tensorwire.errors import PeerGone, TransportError
from tensorwire.transports.base import Hub, HubOptions, SendTime
from tensorwire.transports.broker.graces import Graces
from tensorwire.transports.broker.inflow import Inflow
from tensorwire.transports.broker.payloads import HUB_SENDER
from tensorwire.transports.brokers.sizing import NEAR_LIMIT
from tensorwire.transports.security import ReplayWindow, Sealer
from tensorwire.transports.session import HubSession
from tensorwire.wire import PREFIX_SIZE, EncodedMessage

log = logging.getLogger("tensorwire.transports.broker")


@dataclass(eq=False)
class BrokerPeer:
    """A hub's state for one member's session."""

    session: HubSession
    hello: bytes = b""  # the hello that opened it, as it came: a copy of it is answered, not read
    window: ReplayWindow = field(default_factory=ReplayWindow)  # its sealed payloads' numbers


P = TypeVar("P", bound=BrokerPeer)


class BrokerHub(Hub, Generic[P]):
    """A hub whose clients reach it through a broker. ``grace``: seconds of the medium's
    connected time a suspect member has to show itself; ``reassembly_timeout``: seconds a
    chunked message may go without a chunk."""

    sees_client_certificates = False  # they reach the broker, never the hub
    connection_max: int | None = None  # connections the broker lets in, if known
    _near_limit = False  # warned, and the members have not dropped below the mark since

    def __init__(
        self, url: str, options: HubOptions, *, grace: float, reassembly_timeout: float
    ) -> None:
        super().__init__(url, options)
        self._lock = threading.Lock()
        self._peers: dict[str, P] = {}  # open sessions, by client id
        self._changed = threading.Condition(self._lock)  # a member left, or is sure again
        self._seq = itertools.count()  # the numbers of the hub's sealed payloads, all sessions'
        most = PREFIX_SIZE + self.limits.max_header_bytes + self.limits.max_message_bytes
        self._inflow = Inflow(most, reassembly_timeout)
        self._graces = Graces(grace)
        self._medium_up = True

    # -- what a broker transport implements ----------------------------------------------

    def _publish_to(
        self, client_id: str, peer: P, enc: EncodedMessage, deadline: float | None, sealer: Any
    ) -> None:
        """Publish ``enc`` to one member's session, sealed by ``sealer`` if not None."""
        raise NotImplementedError

    def _publish_all(self, enc: EncodedMessage, deadline: float | None, sealer: Any) -> None:
        """Publish ``enc`` once for every member (the broker's fan-out)."""
        raise NotImplementedError

    def _unreachable(self, clients: list[str], deadline: float | None) -> dict[str, Exception]:
        """The error of each of ``clients`` a message cannot reach now (none by default)."""
        return {}

    # -- members ---------------------------------------------------------------------------

    def _peer_of(self, client_id: str) -> P | None:
        with self._lock:
            return self._peers.get(client_id)

    def _is_current(self, client_id: str, peer: P) -> bool:
        with self._lock:
            return self._peers.get(client_id) is peer

    def _add_peer(self, client_id: str, peer: P) -> P | None:
        """Make ``peer`` the member's session (a newer one replaces the old); return the old."""
        with self._lock:
            old = self._peers.get(client_id)
            self._peers[client_id] = peer
            self._graces.clear(client_id)
            members = len(self._peers)
        self._mind_room(members)
        return old

    def _mind_room(self, members: int) -> None:
        """Warn once the hub's connection and one per member fill :data:`NEAR_LIMIT` of the
        broker's ``connection_max`` (a log line and a ``broker-near-limit`` event); again
        after they fell below it. Devices past the limit are refused by the broker."""
        limit = self.connection_max
        if limit is None:
            return
        used = members + 1
        near = used >= NEAR_LIMIT * limit
        if near == self._near_limit:
            return
        self._near_limit = near
        if near:
            why = (
                f"the broker lets in {limit} connections (its connection limit) and this hub "
                f"and its {members} devices hold {used}: devices past the limit will be refused "
                "(BrokerFull); serve more on a broker sized for them (e.g. devices=N)"
            )
            log.warning("%s: %s", self.protocol, why)
            self._event("broker-near-limit", None, why)

    def _forget(self, client_id: str, peer: P, reason: str) -> bool:
        """``client_id`` left, if ``peer`` is still its session (False: replaced or gone)."""
        with self._changed:
            if self._peers.get(client_id) is not peer:
                return False
            del self._peers[client_id]
            self._graces.clear(client_id)
            self._changed.notify_all()
            members = len(self._peers)
        self._mind_room(members)
        self._left(client_id, reason, session=peer.session)
        return True

    def _tick(self) -> None:
        """Give up on messages whose chunks stopped coming, and on members whose grace ran out
        (while the medium is up: a grace counts connected time only)."""
        for source, exc in self._inflow.expire():
            self._rejected(str(source), exc)
        with self._lock:
            gone = self._graces.due(time.monotonic()) if self._medium_up else []
            peers = [(cid, why, self._peers.get(cid)) for cid, why in gone]
        for cid, why, peer in peers:
            if peer is not None:
                self._forget(cid, peer, why)

    # -- the medium ------------------------------------------------------------------------

    def _medium_lost(self, detail: str) -> None:
        with self._lock:
            self._medium_up = False
        log.warning("%s: the hub %s; its members stay while it reconnects", self.protocol, detail)
        self._event("medium-lost", None, detail)

    def _medium_back(self, detail: str) -> None:
        """Graces restart now: a member had no way to show itself while the medium was lost."""
        with self._lock:
            self._medium_up = True
            self._graces.restart(time.monotonic())
        log.warning("%s: the hub is %s", self.protocol, detail)
        self._event("medium-back", None, detail)

    # -- sending ---------------------------------------------------------------------------

    def _sealer(self, keys: list[bytes]) -> Sealer | None:
        """What seals the hub's payloads for sessions with these keys; None for none."""
        return Sealer(keys, HUB_SENDER, self._seq) if keys else None

    @staticmethod
    def _keys(peers: Iterable[BrokerPeer | None]) -> list[bytes]:
        """The session keys of those of ``peers`` that have one."""
        return [p.session.key for p in peers if p is not None and p.session.key is not None]

    def _send_encoded(self, client_id: str, enc: EncodedMessage, deadline: float | None) -> None:
        failed = self._unreachable([client_id], deadline)
        if failed:
            raise failed[client_id]
        peer = self._peer_of(client_id)
        if peer is None:
            raise PeerGone(f"client {client_id!r} is not connected")
        self._publish_to(client_id, peer, enc, deadline, self._sealer(self._keys([peer])))

    def _unicasts(
        self, clients: list[str], enc: EncodedMessage, deadline: float | None
    ) -> Mapping[str, float | SendTime | Exception]:
        """``enc`` to each of ``clients`` by unicast: concurrently by default (the template's)."""
        return super()._send_many(clients, enc, deadline)

    def _send_many(
        self, clients: list[str], enc: EncodedMessage, deadline: float | None
    ) -> Mapping[str, float | SendTime | Exception]:
        """One publish for all when ``clients`` are every member, sealed with each one's key
        (if some sessions have a key and others none, one unicast each); else unicasts."""
        with self._lock:
            everyone = set(clients) == set(self._peers)
        if not everyone:
            return self._unicasts(clients, enc, deadline)
        results: dict[str, float | SendTime | Exception] = dict(
            self._unreachable(clients, deadline)
        )
        reached = [c for c in clients if c not in results]
        with self._lock:
            peers = [self._peers.get(c) for c in reached]
        keys = self._keys(peers)
        if not reached or 0 < len(keys) < len(reached):
            return {**results, **self._unicasts(reached, enc, deadline)} if reached else results
        t = time.perf_counter()
        try:
            self._publish_all(enc, deadline, self._sealer(keys))
        except TransportError as exc:
            return {**results, **dict.fromkeys(reached, exc)}
        return {**results, **dict.fromkeys(reached, time.perf_counter() - t)}
