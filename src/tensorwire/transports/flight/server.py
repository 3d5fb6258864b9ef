"""The gRPC server a :class:`~tensorwire.transports.flight.FlightHub` runs: Flight's service
(``arrow.flight.protocol.FlightService``) with its one method ``DoExchange``, on grpc's asyncio
server in a thread of its own. Every call is a coroutine on that thread's event loop, so a
hub holds its sessions without a thread each (pyarrow's Flight server, gRPC's synchronous
one, gave every call a thread until it ended: docs/transports/flight.md section 12). Other
methods of the service, and other services, get gRPC's ``UNIMPLEMENTED``."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from typing import Any

import grpc
import grpc.aio

SERVICE = "arrow.flight.protocol.FlightService"
PENDING_CALLS = 1 << 16
"""Calls gRPC holds before the hub's loop takes them (gRPC's default, 1,000, cancels calls
past it: 2,000 devices joining at once lost some)."""

Exchange = Callable[[AsyncIterator[bytes], grpc.aio.ServicerContext], Awaitable[None]]
"""``exchange(requests, context)``: a call's FlightData as they come (raw bytes), and its
context to write with (``context.read()`` is not used: it hangs beside the iterator)."""


def caller(context: grpc.aio.ServicerContext) -> str:
    """The caller's address without its port ("ipv4:127.0.0.1"): one key per host, so that
    a flood of calls from one host is logged as one."""
    peer = context.peer()
    return peer.rpartition(":")[0] or peer


def bind_address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class FlightServer:
    """Serves ``exchange(requests, context)`` for each ``DoExchange`` call on ``host:port``
    (0: a free port, see :attr:`port`), with ``credentials`` (TLS) or in plaintext, on a loop
    thread.

    Raises ``RuntimeError`` (gRPC's) or ``OSError`` when it cannot bind."""

    def __init__(
        self,
        host: str,
        port: int,
        exchange: Exchange,
        credentials: grpc.ServerCredentials | None = None,
    ) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self.loop.run_forever, name="tensorwire-flight-hub", daemon=True
        )
        self._thread.start()
        self._server: grpc.aio.Server | None = None
        try:
            self.port = self.run(self._start(bind_address(host, port), exchange, credentials))
        except BaseException:
            self._stop_loop()
            raise

    async def _start(
        self, address: str, exchange: Exchange, credentials: grpc.ServerCredentials | None
    ) -> int:
        server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", -1),  # the spec's: any size (section 3)
                ("grpc.max_send_message_length", -1),
                ("grpc.so_reuseport", 0),  # a port in use is an error, not shared
                ("grpc.server.max_pending_requests", PENDING_CALLS),
                ("grpc.server.max_pending_requests_hard_limit", 2 * PENDING_CALLS),
            ]
        )

        method = grpc.stream_stream_rpc_method_handler(exchange)  # raw bytes both ways
        server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(SERVICE, {"DoExchange": method}),)
        )
        if credentials is None:
            port = server.add_insecure_port(address)
        else:
            port = server.add_secure_port(address, credentials)
        if not port:
            raise OSError(f"gRPC could not bind {address}")
        await server.start()
        self._server = server
        return port

    @property
    def in_loop(self) -> bool:
        return threading.current_thread() is self._thread

    def run(self, coro: Coroutine[Any, Any, Any], timeout: float | None = None) -> Any:
        """Run ``coro`` on the loop and wait for its result (never from the loop itself)."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def call(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` on the loop: now if this is the loop's thread, else soon."""
        if self.in_loop:
            fn(*args)
        else:
            self.loop.call_soon_threadsafe(fn, *args)

    def post(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` on the loop later, from any thread; nothing once it is closed."""
        with contextlib.suppress(RuntimeError):  # the loop is closed: the hub is gone
            self.loop.call_soon_threadsafe(fn, *args)

    def shutdown(self, grace: float) -> bool:
        """Stop taking calls, give those running ``grace`` seconds to end, cancel the rest,
        and stop the loop; False if it did not stop in time (its thread is a daemon). Called
        on the loop itself (a hub closed from its own callback), it does so from a thread of
        its own and returns at once."""
        if self.in_loop:
            threading.Thread(
                target=self.shutdown, args=(grace,), name="tensorwire-flight-stop", daemon=True
            ).start()
            return True
        stopped = True
        if self._server is not None:
            try:
                self.run(self._server.stop(grace), timeout=grace + 5.0)
            except (TimeoutError, RuntimeError):
                stopped = False
        return self._stop_loop() and stopped

    def _stop_loop(self) -> bool:
        with contextlib.suppress(RuntimeError):  # closed already
            self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5.0)
        if self._thread.is_alive():
            return False
        self.loop.close()
        return True
