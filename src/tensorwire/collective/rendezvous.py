"""Rendezvous through a tensorwire hub: every rank announces where its listener is and
receives everyone's, with the token that proves a connection belongs to the group.

The hub is any tensorwire transport's (``tcp://``, ``quic://``, ``mqtt://`` ...): a
:class:`Rendezvous` serves it (on rank 0, or on a coordinator of its own) and answers once
all ``size`` ranks have announced; :func:`announce` is a rank's side.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import threading
import time
from typing import Any, NamedTuple
from urllib.parse import urlsplit

from tensorwire.collective.credentials import (
    GroupCredentials,
    hub_credentials,
    make_link_keys,
    open_link_keys,
    rank_id,
    seal_link_keys,
)
from tensorwire.errors import AuthenticationError, CollectiveError, TransportError
from tensorwire.transports import connect, serve

log = logging.getLogger("tensorwire.collective")

Address = tuple[str, int]


class Meeting(NamedTuple):
    """What a rank learns at the rendezvous: every rank's listener, the group's token, and
    (a secured rendezvous that knows the ranks' secrets) its link keys: other rank -> key."""

    addresses: list[Address]
    token: str
    link_keys: dict[int, bytes] | None = None


class Rendezvous:
    """A hub at ``url`` that gathers ``size`` ranks' announcements and sends each the table
    of every rank's listener and a fresh token; it stops once it has (or at ``timeout``
    seconds, telling the ranks that came which did not). ``url`` is the hub's own, with the
    port the kernel picked when the given one was 0.

    ``elastic=True``: the hub is an elastic group's coordinator (:attr:`coordinator`), up
    until :meth:`close`; the ranks join with ``elastic=True`` (with credentials too: it
    admits and gives out link keys the same way, for ranks that rejoin as well).

    ``credentials``: the hub's (a :class:`~tensorwire.transports.base.options.Credentials`,
    a :class:`~tensorwire.collective.GroupCredentials` with ``hub``, or a directory
    ``tensorwire certs`` wrote): then only enrolled ranks get in, each as client id
    ``rank-N`` for the rank it claims, and with the enrolment's keys each rank gets its link
    keys sealed under its secret (:mod:`~tensorwire.collective.credentials`)."""

    def __init__(
        self,
        url: str,
        size: int,
        timeout: float = 60.0,
        elastic: bool = False,
        credentials: Any = None,
    ) -> None:
        self.size = size
        hub = hub_credentials(credentials)
        self._secured = hub is not None
        self._keys = None if hub is None else hub.keys
        self._hub = serve(url) if hub is None else serve(url, credentials=hub)
        self.url = self._hub.url
        self._timeout = timeout
        self.error: str | None = None
        self.coordinator = None
        run = self._run
        if elastic:
            from tensorwire.collective.coordinator import Coordinator

            self.coordinator = Coordinator(self._hub, size, timeout, self._secured, self._keys)
            run = self.coordinator.run
        self._thread = threading.Thread(target=run, name="rendezvous", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        hub = self._hub
        deadline = time.monotonic() + self._timeout
        clients: dict[int, str] = {}
        addresses: dict[int, Address] = {}
        while len(addresses) < self.size:
            left = deadline - time.monotonic()
            try:
                client, msg = hub.recv(timeout=max(left, 0.001))
            except TransportError:
                missing = sorted(set(range(self.size)) - set(addresses))
                self.error = f"ranks {missing} did not come to the rendezvous at {self.url}"
                break
            meta = msg.meta
            rank, size = meta.get("rank"), meta.get("size")
            if size != self.size:
                problem = f"it says size={size!r}, the rendezvous was set up for {self.size}"
            elif not isinstance(rank, int) or not 0 <= rank < self.size:
                problem = f"rank={rank!r} is not in 0..{self.size - 1}"
            elif self._secured and client != rank_id(rank):
                problem = f"it is enrolled as {client!r}, not as {rank_id(rank)!r}"
            elif rank in addresses:
                problem = f"rank {rank} has come already (from {clients[rank]!r})"
            else:
                clients[rank] = client
                addresses[rank] = (str(meta.get("host")), int(meta.get("port", 0)))
                continue
            log.warning("rendezvous refused %s: %s", client, problem)
            self._answer(client, {"error": problem})
        if self.error is not None:
            answer: dict[str, object] = {"error": self.error}
        else:
            answer = {
                "hosts": [addresses[r][0] for r in range(self.size)],
                "ports": [addresses[r][1] for r in range(self.size)],
                "token": secrets.token_hex(16),
            }
        link_keys = make_link_keys(self.size) if self._keys and "token" in answer else None
        for rank, client in clients.items():
            secret = None if self._keys is None else self._keys.get(client)
            if link_keys is None or secret is None:
                self._answer(client, answer)
                continue
            sealed = seal_link_keys(secret, rank, str(answer["token"]), link_keys[rank])
            self._answer(client, {**answer, "keys": sealed})

    def _answer(self, client: str, answer: dict[str, object]) -> None:
        try:
            self._hub.send(client, meta=answer)
        except TransportError as exc:  # it left: it has nothing to wait for
            log.warning("rendezvous could not answer %s: %s", client, exc)

    def close(self) -> None:
        """Wait for the answers to go out (stop coordinating), then close the hub."""
        if self.coordinator is not None:
            self.coordinator.stop()
        self._thread.join(self._timeout)
        self._hub.close()

    def __enter__(self) -> Rendezvous:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def serve_if_asked(
    url: str,
    rank: int,
    size: int,
    serve: bool | None,
    opts: Any,
    credentials: Any,
    elastic: bool = False,
) -> Rendezvous | None:
    """The rendezvous this rank serves at ``url`` (rank 0 unless ``serve`` says), with the
    hub's credentials: ``opts.credentials`` when it names a directory (the hub's files are
    there), else this rank's ``credentials``; None when another serves it."""
    if not (serve if serve is not None else rank == 0):
        return None
    given = opts.credentials
    hub = given if isinstance(given, str | os.PathLike) else credentials
    return Rendezvous(url, size, timeout=opts.connect_timeout, elastic=elastic, credentials=hub)


def announce(
    url: str,
    rank: int,
    size: int,
    address: Address,
    timeout: float,
    credentials: GroupCredentials | None = None,
) -> Meeting:
    """Tell the rendezvous at ``url`` that ``rank`` of ``size`` listens at ``address``;
    return every rank's listener address, the group's token and, with ``credentials``
    holding a secret, the link keys the rendezvous sealed for it."""
    # unique: a second "rank 3" is refused (a secured hub tells them apart by credentials)
    name = rank_id(rank) if credentials else f"rank-{rank}-{secrets.token_hex(4)}"
    secured: dict[str, Any] = {} if credentials is None else {"credentials": credentials.channel()}
    try:
        with connect(url, client_id=name, timeout=timeout, **secured) as ch:
            ch.send(meta={"rank": rank, "size": size, "host": address[0], "port": address[1]})
            answer = ch.recv(timeout=timeout).meta
    except AuthenticationError as exc:
        raise AuthenticationError(
            f"rank {rank}: the rendezvous at {url} refused it: {exc}"
        ) from exc
    except TransportError as exc:
        raise CollectiveError(f"rank {rank}: the rendezvous at {url} failed: {exc}") from exc
    if "error" in answer:
        raise CollectiveError(f"rank {rank}: the rendezvous at {url} refused: {answer['error']}")
    hosts, ports, token = answer["hosts"], answer["ports"], str(answer["token"])
    addresses = [(str(h), int(p)) for h, p in zip(hosts, ports, strict=True)]
    link_keys = None
    if credentials is not None and credentials.secret is not None and "keys" in answer:
        link_keys = open_link_keys(credentials.secret, rank, token, answer["keys"], size)
    return Meeting(addresses, token, link_keys)


def address_toward(url: str) -> str:
    """The local address this host reaches ``url``'s host from (loopback for a loopback
    hub; ``127.0.0.1`` when the URL names no host, as ``mem://`` URLs do not)."""
    host = urlsplit(url).hostname
    if not host:
        return "127.0.0.1"
    try:
        family, _, _, _, where = socket.getaddrinfo(host, 9, type=socket.SOCK_DGRAM)[0]
    except (socket.gaierror, UnicodeError):  # no host, or a name that is not a host's (mem://)
        return "127.0.0.1"
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        probe.connect(where)  # a UDP connect sends nothing: it only asks for a route
        return str(probe.getsockname()[0])
