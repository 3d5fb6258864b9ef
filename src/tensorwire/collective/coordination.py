"""A rank's side of an elastic group's coordinator (:mod:`.coordinator`): the hub channel it
keeps for the group's life, its hello, and after every operation its report and the
coordinator's verdict. Wire-format messages with scalar fields only (no pickle).

With credentials the channel is the rank's (client id ``rank-N``, its certificate and/or
secret) and the link keys the coordinator sealed for it open with its secret."""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass
from typing import Any

from tensorwire.collective.credentials import GroupCredentials, open_link_keys, rank_id
from tensorwire.collective.rendezvous import Address
from tensorwire.errors import (
    AuthenticationError,
    CollectiveError,
    CollectiveMismatch,
    CoordinatorLost,
    PeerGone,
    RankDropped,
    TransportError,
    TransportTimeout,
)
from tensorwire.transports import Channel, connect

VERDICT_SLACK_S = 5.0  # past the operation's timeout, how long a rank waits for a verdict


@dataclass(frozen=True)
class Welcome:
    """What the coordinator gives a rank that comes: every member's listener (by rank),
    the token, the view, the operation to start at and the wire sequence number; its link
    keys (other rank -> key) when the coordinator sealed them for it."""

    addresses: list[Address]
    token: str
    view: list[int]
    op: int
    seq: int
    late: bool  # a rank that rejoins a running group (the members dial it)
    link_keys: dict[int, bytes] | None = None


@dataclass(frozen=True)
class Verdict:
    """The coordinator's answer to a report: ``kind`` is commit or redo (with the view from
    now on, the sequence number to go on from, and the ranks that rejoin: their listeners
    and, sealed for this rank, its fresh link keys with them)."""

    kind: str
    view: list[int]
    seq: int
    joiners: dict[int, Address]
    fence: bool  # the links are fenced before the next attempt
    link_keys: dict[int, bytes] | None = None


def _list(meta: dict[str, Any], key: str) -> list[Any]:
    value = meta.get(key)
    if not isinstance(value, list):
        raise CollectiveError(f"the coordinator's answer has no list {key!r}: {meta!r}"[:300])
    return value


class Coordination:
    """Rank ``rank``'s channel to the coordinator at ``url``: :meth:`hello`, then
    :meth:`report` after every operation; with ``credentials``, this rank's."""

    def __init__(
        self,
        url: str,
        rank: int,
        size: int,
        timeout: float,
        credentials: GroupCredentials | None = None,
    ) -> None:
        self.url = url
        self.rank = rank
        self.size = size
        self._key = ""
        self._token = ""
        self._secret = None if credentials is None else credentials.secret
        # unique without credentials; with them the rank's enrolled id (a restart replaces it)
        name = f"rank-{rank}-{secrets.token_hex(8)}" if credentials is None else rank_id(rank)
        secured: dict[str, Any] = (
            {} if credentials is None else {"credentials": credentials.channel()}
        )
        try:
            self._channel: Channel = connect(url, client_id=name, timeout=timeout, **secured)
        except AuthenticationError as exc:
            raise AuthenticationError(
                f"rank {rank}: the coordinator at {url} refused it: {exc}"
            ) from exc
        except TransportError as exc:
            raise CoordinatorLost(f"rank {rank}: the coordinator at {url}: {exc}") from exc

    def hello(self, address: Address, timeout: float) -> Welcome:
        """Say where this rank listens; the coordinator's welcome (once every rank came, or
        for a rank that rejoins, at the next operation the group completes)."""
        host, port = address
        hello = {"rank": self.rank, "size": self.size, "host": host, "port": port}
        what = "welcome this rank (a rank rejoins once the group dropped its predecessor)"
        meta = self._ask({**hello, "elastic": True}, timeout, what)
        addresses = [
            (str(h), int(p))
            for h, p in zip(_list(meta, "hosts"), _list(meta, "ports"), strict=True)
        ]
        self._key = str(meta.get("key"))
        self._token = str(meta.get("token"))
        view = [int(r) for r in _list(meta, "view")]
        return Welcome(
            addresses,
            self._token,
            view,
            int(meta.get("op", 1)),
            int(meta.get("seq", 0)),
            bool(meta.get("late")),
            self._link_keys(meta, view),
        )

    def _link_keys(self, meta: dict[str, Any], peers: list[int]) -> dict[int, bytes] | None:
        """The link keys with ``peers`` the coordinator sealed for this rank in ``meta``
        (None: this rank has no secret, or the coordinator knows none: certificates only)."""
        if self._secret is None or "keys" not in meta:
            return None
        keys = open_link_keys(self._secret, self.rank, self._token, meta["keys"], self.size)
        return {p: keys[p] for p in peers if p != self.rank}

    def report(self, op: int, seq: int, error: CollectiveError | None, timeout: float) -> Verdict:
        """Tell the coordinator how operation ``op`` ended here; its verdict. Raises
        :class:`RankDropped` when this rank is out of the group, the error of a group that is
        over (a mismatch), or :class:`CoordinatorLost`."""
        culprit = getattr(error, "rank", -1) if error is not None else -1
        report = {
            "report": op,
            "rank": self.rank,
            "key": self._key,
            "seq": seq,
            "ok": error is None,
            "culprit": culprit if isinstance(culprit, int) else -1,
            "mismatch": isinstance(error, CollectiveMismatch),
            "reason": getattr(error, "reason", str(error or "")),
            "timeout": timeout,
        }
        meta = self._ask(report, timeout + VERDICT_SLACK_S, f"give its verdict on #{op}")
        kind = meta.get("verdict")
        if kind == "dropped":
            raise RankDropped(self.rank, str(meta.get("reason")))
        if kind == "abort":
            if error is not None:
                raise error
            raise CollectiveError(f"rank {self.rank}: the group is over: {meta.get('reason')}")
        if kind not in ("commit", "redo"):
            raise CollectiveError(f"rank {self.rank}: the coordinator answered {meta!r}"[:300])
        joiners = [int(j) for j in _list(meta, "joiners")]
        addresses = zip(_list(meta, "hosts"), _list(meta, "ports"), strict=True)
        return Verdict(
            str(kind),
            [int(r) for r in _list(meta, "view")],
            int(meta.get("seq", 0)),
            {j: (str(h), int(p)) for j, (h, p) in zip(joiners, addresses, strict=True)},
            meta.get("fence") is True,
            self._link_keys(meta, joiners) if joiners else None,
        )

    def _ask(self, meta: dict[str, Any], timeout: float, what: str) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        try:
            self._channel.send(meta=meta, timeout=timeout)
            answer = self._channel.recv(timeout=max(deadline - time.monotonic(), 0.001)).meta
        except TransportTimeout:
            raise CoordinatorLost(
                f"rank {self.rank}: the coordinator at {self.url} did not {what} in {timeout:.1f} s"
            ) from None
        except (PeerGone, TransportError) as exc:
            raise CoordinatorLost(
                f"rank {self.rank}: the coordinator at {self.url} is gone: {exc}"
            ) from None
        if not isinstance(answer, dict):
            raise CollectiveError(f"rank {self.rank}: the coordinator answered no fields")
        if "error" in answer:
            raise CollectiveError(f"rank {self.rank}: the coordinator refused: {answer['error']}")
        return answer

    def close(self) -> None:
        self._channel.close()
