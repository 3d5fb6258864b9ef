"""A zmq socket's monitor never stops its I/O thread, however many events wait unread.

libzmq sends monitor events blocking: behind pyzmq's default queue (1,000 events each side) a
crowd of connections closing while nobody reads stopped the socket's I/O thread, and
``disable_monitor`` (a hub's close) then waited for ever.
"""

from __future__ import annotations

import socket
import threading
import time

import zmq

from tensorwire.transports.zmq.sockets import MONITOR_EVENTS, monitor_socket

CONNECTIONS = 2_600  # more events than pyzmq's default queue holds (2 x 1,000)


def _flood(port: int) -> None:
    """Connections that open and close at once, each one monitor event."""
    for _ in range(CONNECTIONS):
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\1\0\0\0\0\0\0\0")


def _events(monitor: zmq.Socket, deadline: float, want: int) -> int:
    got = 0
    while got < want and time.monotonic() < deadline:
        if monitor.poll(200):
            while True:
                try:
                    monitor.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                got += 1
    return got


def test_unread_monitor_events_do_not_stop_the_socket_or_its_close() -> None:
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.linger = 0
    monitor = monitor_socket(router, MONITOR_EVENTS)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    try:
        _flood(port)  # nobody reads the monitor meanwhile
        # The I/O thread still serves: a peer's message arrives.
        dealer = ctx.socket(zmq.DEALER)
        dealer.linger = 0
        dealer.connect(f"tcp://127.0.0.1:{port}")
        dealer.send(b"still serving")
        assert router.poll(10_000), "the ROUTER's I/O thread stopped behind its monitor"
        assert router.recv_multipart()[1] == b"still serving"
        dealer.close()
        # Every event is there to read, in order, none dropped.
        got = _events(monitor, time.monotonic() + 30, CONNECTIONS)
        assert got >= CONNECTIONS
        # And closing the monitor returns (it waited for ever behind a full queue).
        _flood(port)
        done = threading.Event()
        closer = threading.Thread(target=lambda: (router.disable_monitor(), done.set()))
        closer.start()
        closer.join(timeout=20)
        assert done.is_set(), "disable_monitor hung behind unread monitor events"
    finally:
        monitor.close(linger=0)
        router.close(linger=0)
        ctx.term()
