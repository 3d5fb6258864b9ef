"""The Dask comm backend: listener, connector and address handling for ``tensorwire+tcp://``.

Registered by entry point (group ``distributed.comm.backends``), so
``Scheduler(protocol="tensorwire+tcp")`` or ``LocalCluster(protocol="tensorwire+tcp://")``
and a worker given a ``tensorwire+tcp://host:port`` scheduler address use it.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable
from typing import Any

from distributed.comm.addressing import parse_host_port, unparse_host_port
from distributed.comm.core import BaseListener, CommClosedError, Connector
from distributed.comm.registry import Backend
from distributed.utils import ensure_ip, get_ip

from tensorwire.integrations.dask.comm import TensorwireComm, comm_limits
from tensorwire.integrations.dask.protocol import MessageProtocol

SCHEME = "tensorwire+tcp"
PREFIX = SCHEME + "://"
logger = logging.getLogger(__name__)


def _socket_address(transport: asyncio.BaseTransport | None, which: str) -> str:
    assert transport is not None
    host, port = transport.get_extra_info(which)[:2]
    return PREFIX + unparse_host_port(host, port)


def _tune(transport: asyncio.BaseTransport | None) -> None:
    assert transport is not None
    sock = transport.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)


class TensorwireConnector(Connector):
    async def connect(
        self, address: str, deserialize: bool = True, **kwargs: Any
    ) -> TensorwireComm:
        host, port = parse_host_port(address)
        loop = asyncio.get_running_loop()
        limits = comm_limits()
        try:
            transport, protocol = await loop.create_connection(
                lambda: MessageProtocol(limits), host, port
            )
        except OSError as e:
            raise CommClosedError(f"tensorwire: cannot connect to {address}: {e}") from e
        _tune(transport)
        local = _socket_address(transport, "sockname")
        return TensorwireComm(protocol, local, PREFIX + address, deserialize)


class TensorwireListener(BaseListener):
    prefix = PREFIX  # Dask's workers log f"{listener.prefix}{ip}:{port}"

    def __init__(
        self,
        address: str,
        comm_handler: Callable[[TensorwireComm], Any],
        deserialize: bool = True,
        allow_offload: bool = True,
        default_port: int = 0,
        **connection_args: Any,
    ) -> None:
        super().__init__()
        self.ip, self.port = parse_host_port(address, default_port)
        self.comm_handler = comm_handler
        self.deserialize = deserialize
        self.allow_offload = allow_offload
        self.server: asyncio.Server | None = None
        self._bound: tuple[str, int] | None = None
        self._handling: set[asyncio.Future[None]] = set()

    async def start(self) -> None:
        limits = comm_limits()
        loop = asyncio.get_running_loop()
        self.server = await loop.create_server(
            lambda: MessageProtocol(limits, self._made), self.ip or None, self.port
        )
        self._bound = self.server.sockets[0].getsockname()[:2]

    def stop(self) -> None:
        server, self.server = self.server, None
        if server is not None:
            server.close()  # stops accepting; established comms stay open (as Dask's tcp)

    def _made(self, protocol: MessageProtocol) -> None:
        task = asyncio.ensure_future(self._handle(protocol))
        self._handling.add(task)
        task.add_done_callback(self._handling.discard)

    async def _handle(self, protocol: MessageProtocol) -> None:
        transport = protocol.transport
        _tune(transport)
        peer = _socket_address(transport, "peername")
        local = _socket_address(transport, "sockname")
        comm = TensorwireComm(protocol, local, peer, self.deserialize)
        comm.allow_offload = self.allow_offload
        if self.server is None:  # stopped between accept and here: nobody would handshake
            comm.abort()
            return
        try:
            await self.on_connection(comm)
        except CommClosedError:
            logger.info("tensorwire: connection from %s closed before its handshake", peer)
            return
        await self.comm_handler(comm)

    def get_host_port(self) -> tuple[str, int]:
        if self._bound is None:
            raise ValueError("invalid operation on a TensorwireListener not started")
        return self._bound

    @property
    def listen_address(self) -> str:
        return PREFIX + unparse_host_port(*self.get_host_port())

    @property
    def contact_address(self) -> str:
        host, port = self.get_host_port()
        if host in ("0.0.0.0", "::", ""):
            host = get_ip()
        return PREFIX + unparse_host_port(host, port)


class TensorwireBackend(Backend):
    """Dask's backend object for the ``tensorwire+tcp`` scheme."""

    def get_connector(self) -> TensorwireConnector:
        return TensorwireConnector()

    def get_listener(
        self, loc: str, handle_comm: Any, deserialize: bool, **connection_args: Any
    ) -> TensorwireListener:
        return TensorwireListener(loc, handle_comm, deserialize, **connection_args)

    def get_address_host(self, loc: str) -> str:
        return parse_host_port(loc)[0]

    def get_address_host_port(self, loc: str) -> tuple[str, int]:
        return parse_host_port(loc)

    def resolve_address(self, loc: str) -> str:
        host, port = parse_host_port(loc)
        return unparse_host_port(ensure_ip(host), port)

    def get_local_address_for(self, loc: str) -> str:
        host = ensure_ip(parse_host_port(loc)[0])
        return unparse_host_port(get_ip(host), None)
