"""An elastic group's coordinator: the rendezvous hub, kept up for the group's life, deciding
which ranks are in the group (its *view*) after every operation.

It first gathers all ``size`` ranks as :class:`~tensorwire.collective.Rendezvous` does, and
gives each, with the listener table and the group's token, a key of its own. After each
operation every rank in the view reports (with its key) that it completed or failed, naming
the culprit; the coordinator answers every rank once each has reported or been named:

- **commit**: every report said done. Ranks that did not report by the deadline (the first
  report's time plus the operation's timeout) leave the view; ranks waiting to rejoin enter
  it (once their predecessors are out of it), from the next operation on, and the members
  link to them.
- **redo**: some rank failed. The culprits named and the ranks that did not report leave
  the view; the others do the operation again over the ranks left.
- **abort**: the ranks called different operations (a program's bug, not a fault), or no
  rank is left: the group is over.
- **dropped**, to a rank no longer in the view (a stopped rank that wakes up, a late one).

A report or hello that does not check out (garbage, a wrong key, a rank's report from a
client that is not that rank's) is refused, logged and counted in :attr:`refusals`.

On a hub served with credentials (``secured``) a rank must come as client id ``rank-N`` for
the rank it claims; with the enrolment's ``keys`` the coordinator makes a key for every pair
of ranks and sends each rank its own sealed under its secret
(:mod:`~tensorwire.collective.credentials`): in its welcome, and, for a pair with a rank
that rejoins (fresh keys), in the verdict that tells the members to dial it.
"""

from __future__ import annotations

import hmac
import logging
import secrets
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

from tensorwire.collective.credentials import (
    LINK_KEY_BYTES,
    make_link_keys,
    rank_id,
    seal_link_keys,
)
from tensorwire.errors import TransportError
from tensorwire.transports import Hub
from tensorwire.transports.security import Keys

log = logging.getLogger("tensorwire.collective")

POLL_S = 0.05  # how often the coordinator looks at the clock and the hub's clients
GRACE_S = 2.0  # past an operation's timeout, how long the last reports may take to come
MAX_TIMEOUT_S = 24 * 3600.0  # the longest deadline a report may ask the coordinator to wait
MAX_REFUSALS = 100


@dataclass(frozen=True)
class _Member:
    client: str  # its hub client id: a report must come from it
    key: str  # its secret: a report must carry it
    host: str
    port: int


@dataclass(frozen=True)
class _Report:
    ok: bool
    culprit: int
    mismatch: bool
    reason: str
    seq: int
    timeout: float


class Coordinator:
    """Decides the view of a ``size``-rank elastic group on ``hub`` (see the module doc);
    gives up gathering the first ranks after ``timeout`` seconds. :meth:`run` is its loop."""

    def __init__(
        self,
        hub: Hub,
        size: int,
        timeout: float,
        secured: bool = False,
        keys: Keys | None = None,
    ) -> None:
        self.size = size
        self._hub = hub
        self._secured = secured
        self._keys = keys  # the ranks' secrets: their link keys are sealed under them
        self._pairs: list[list[bytes]] = [[b""] * size for _ in range(size)]
        self._timeout = timeout
        self._token = secrets.token_hex(16)
        self._members: dict[int, _Member] = {}  # by rank: the latest process of each
        self._pending: dict[int, _Member] = {}  # ranks waiting to rejoin
        self._dropped: dict[str, str] = {}  # a dropped process's key -> why it was dropped
        self._reports: dict[int, _Report] = {}
        self._deadline: float | None = None  # for the current operation's reports
        self._seq = 0  # the wire sequence number the ranks set at the last verdict
        self._stop = threading.Event()
        self.view: list[int] = []
        """The ranks in the group now, in order."""
        self.op = 1
        """The operation (counted from 1) whose reports the coordinator waits for."""
        self.refusals: deque[tuple[str, str]] = deque(maxlen=MAX_REFUSALS)
        """Messages refused (client id, why): the most recent 100."""
        self.error: str | None = None

    def run(self) -> None:
        if not self._gather():
            return
        while not self._stop.is_set():
            try:
                client, msg = self._hub.recv(timeout=POLL_S)
            except TransportError:  # no message (or the hub closed: stop() comes)
                pass
            else:
                self._handle(client, msg.meta or {})
            self._settle()

    def stop(self) -> None:
        self._stop.set()

    # -- forming the group --------------------------------------------------------------

    def _gather(self) -> bool:
        deadline = time.monotonic() + self._timeout
        while len(self._members) < self.size:
            left = deadline - time.monotonic()
            if self._stop.is_set() or left <= 0:
                missing = sorted(set(range(self.size)) - set(self._members))
                self.error = f"ranks {missing} did not come to the rendezvous"
                for member in self._members.values():
                    self._send(member.client, {"error": self.error})
                return False
            try:
                client, msg = self._hub.recv(timeout=min(left, POLL_S * 4))
            except TransportError:
                continue
            meta = msg.meta or {}
            hello = self._hello(client, meta)
            if isinstance(hello, str):
                self._refuse(client, hello)
            elif hello[0] in self._members:
                self._refuse(client, f"rank {hello[0]} has come already")
            else:
                self._members[hello[0]] = hello[1]
        self.view = sorted(self._members)
        if self._keys is not None:
            self._pairs = make_link_keys(self.size)
        for rank in self.view:
            self._welcome(rank, late=False)
        return True

    def _hello(self, client: str, meta: dict[str, Any]) -> tuple[int, _Member] | str:
        """A rank's hello parsed, or why it is refused."""
        rank, size, host, port = (meta.get(k) for k in ("rank", "size", "host", "port"))
        if meta.get("elastic") is not True:
            return "it is not an elastic rank's hello (join with elastic=True)"
        if size != self.size:
            return f"it says size={size!r}, the group has {self.size}"
        if not isinstance(rank, int) or not 0 <= rank < self.size:
            return f"rank={rank!r} is not in 0..{self.size - 1}"
        if not isinstance(host, str) or not isinstance(port, int) or not 0 < port < 65536:
            return f"its listener ({host!r}, {port!r}) is not an address"
        if self._secured and client != rank_id(rank):
            return f"it is enrolled as {client!r}, not as {rank_id(rank)!r}"
        return rank, _Member(client, secrets.token_hex(16), host, port)

    def _welcome(self, rank: int, late: bool) -> None:
        view = self.view
        hosts = [self._members[r].host if r in view else "" for r in range(self.size)]
        ports = [self._members[r].port if r in view else 0 for r in range(self.size)]
        answer = {
            "hosts": hosts,
            "ports": ports,
            "token": self._token,
            "key": self._members[rank].key,
            "view": view,
            "op": self.op,
            "seq": self._seq,
            "late": late,
        }
        self._send(self._members[rank].client, self._sealed(rank, answer, view))

    def _sealed(self, rank: int, answer: dict[str, Any], peers: list[int]) -> dict[str, Any]:
        """``answer`` with rank ``rank``'s link keys with ``peers`` sealed under its secret
        (as it is, without the enrolment's keys or that rank's secret)."""
        client = self._members[rank].client
        secret = None if self._keys is None else self._keys.get(client)
        if secret is None:
            return answer
        mine = [self._pairs[rank][p] if p in peers and p != rank else b"" for p in range(self.size)]
        return {**answer, "keys": seal_link_keys(secret, rank, self._token, mine)}

    def _fresh_keys(self, joiners: list[int]) -> None:
        """New keys for every pair with a rank that rejoins (its predecessor's are stale)."""
        for j in joiners:
            for m in self.view:
                if m != j:
                    self._pairs[j][m] = self._pairs[m][j] = secrets.token_bytes(LINK_KEY_BYTES)

    # -- messages -----------------------------------------------------------------------

    def _handle(self, client: str, meta: dict[str, Any]) -> None:
        if "report" in meta:
            self._report(client, meta)
        elif "host" in meta:
            self._rejoin(client, meta)
        else:
            self._refuse(client, "it sent neither a hello nor a report")

    def _rejoin(self, client: str, meta: dict[str, Any]) -> None:
        hello = self._hello(client, meta)
        if isinstance(hello, str):
            return self._refuse(client, hello)
        rank, member = hello
        waiting = self._pending.get(rank)
        # a secured rank's restart comes as the same client id: the hub replaced the old
        if waiting is not None and waiting.client != client and waiting.client in self._hub.clients:
            return self._refuse(client, f"rank {rank} is waiting to rejoin already")
        self._pending[rank] = member
        log.info("coordinator: rank %d waits to rejoin (at the next commit)", rank)

    def _report(self, client: str, meta: dict[str, Any]) -> None:
        rank, key = meta.get("rank"), meta.get("key")
        if isinstance(key, str) and key in self._dropped:
            if self._taken_over(client, key):  # its restart has its client id: tell it nothing
                log.warning("coordinator: a dropped %r reported after its restart came", client)
                return
            self._send(client, {"verdict": "dropped", "reason": self._dropped[key]})
            return
        member = self._members.get(rank) if isinstance(rank, int) else None
        if (
            member is None
            or member.client != client
            or not isinstance(key, str)
            or not hmac.compare_digest(key.encode(), member.key.encode())
        ):
            return self._refuse(client, f"a report for rank {rank!r} without that rank's key")
        if rank not in self.view:
            self._send(client, {"verdict": "dropped", "reason": "it is not in the group"})
            return
        op, seq, timeout = meta.get("report"), meta.get("seq"), meta.get("timeout")
        culprit = meta.get("culprit")
        if op != self.op or rank in self._reports:
            return self._refuse(client, f"rank {rank} reported operation {op!r} at {self.op}")
        if (
            not isinstance(seq, int)
            or not isinstance(timeout, int | float)
            or not isinstance(culprit, int)
        ):
            return self._refuse(client, f"rank {rank}'s report is malformed")
        timeout = min(max(float(timeout), 0.0), MAX_TIMEOUT_S)
        self._reports[rank] = _Report(
            meta.get("ok") is True,
            culprit,
            meta.get("mismatch") is True,
            str(meta.get("reason", ""))[:1000],
            seq,
            timeout,
        )
        if self._deadline is None:
            self._deadline = time.monotonic() + timeout + GRACE_S

    def _taken_over(self, client: str, key: str) -> bool:
        """Whether another process (one that rejoined or waits to) has ``client``'s id now:
        a secured rank's restart comes as the same id, and the hub then sends it all."""
        others = [*self._members.values(), *self._pending.values()]
        return any(m.client == client and m.key != key for m in others)

    def _refuse(self, client: str, why: str) -> None:
        log.warning("coordinator refused a message from %r: %s", client, why)
        self.refusals.append((client, why))
        self._send(client, {"error": why})

    def _send(self, client: str, meta: dict[str, Any]) -> None:
        try:
            self._hub.send(client, meta=meta, timeout=GRACE_S)
        except TransportError as exc:  # it left: it has nothing to wait for
            log.warning("coordinator could not answer %r: %s", client, exc)

    # -- verdicts -----------------------------------------------------------------------

    def _settle(self) -> None:
        """Give the verdict on the current operation once it can be given."""
        if not self._reports or self._deadline is None:
            return
        named = {r.culprit for r in self._reports.values() if not r.ok} & set(self.view)
        connected = set(self._hub.clients)
        waiting = [
            m
            for m in self.view
            if m not in self._reports and m not in named and self._members[m].client in connected
        ]
        if waiting and time.monotonic() < self._deadline:
            return
        self._decide(named)

    def _decide(self, named: set[int]) -> None:
        reports, op = self._reports, self.op
        self._reports, self._deadline = {}, None
        self._seq = max(r.seq for r in reports.values()) + 1
        why = {m: f"it did not report operation #{op} in time" for m in self.view}
        for r, report in sorted(reports.items()):
            if not report.ok and report.culprit in named:
                why[report.culprit] = f"rank {r} found: {report.reason}"
        gone = {m for m in self.view if m in named or m not in reports}
        left = [m for m in self.view if m not in gone]
        mismatch = [r for r in reports.values() if r.mismatch]
        if mismatch or not left:
            reason = mismatch[0].reason if mismatch else "no rank is left"
            self.error = f"operation #{op}: {reason}"
            log.warning("coordinator: the group is over: %s", self.error)
            for r in reports:
                self._send(self._members[r].client, {"verdict": "abort", "reason": self.error})
            self.view = []
            return
        for m in sorted(gone):
            self._dropped[self._members[m].key] = why[m]
            log.warning("coordinator: rank %d leaves the group: %s", m, why[m])
        commit = all(r.ok for r in reports.values())
        self.view = left
        joiners = self._admit() if commit else []
        if commit:
            self.op += 1
        if joiners and self._keys is not None:
            self._fresh_keys(joiners)
        verdict = {
            "verdict": "commit" if commit else "redo",
            "op": op,
            "seq": self._seq,
            "view": self.view,
            "fence": not commit or bool(gone),
            "joiners": joiners,
            "hosts": [self._members[j].host for j in joiners],
            "ports": [self._members[j].port for j in joiners],
        }
        for m in left:
            self._send(self._members[m].client, self._sealed(m, verdict, joiners))
        for j in joiners:
            self._welcome(j, late=True)
        for r in sorted(set(reports) & gone):
            member = self._members[r]
            if not self._taken_over(member.client, member.key):
                self._send(member.client, {"verdict": "dropped", "reason": why[r]})

    def _admit(self) -> list[int]:
        """The ranks waiting to rejoin that enter the view now: those still connected whose
        predecessors are out of it (a process restarted at once waits for the group to
        drop the one it replaces)."""
        connected = set(self._hub.clients)
        joiners = []
        for rank, member in sorted(self._pending.items()):
            if member.client not in connected:
                del self._pending[rank]  # it gave up
            elif rank not in self.view:
                self._members[rank] = self._pending.pop(rank)
                joiners.append(rank)
        self.view = sorted([*self.view, *joiners])
        return joiners
