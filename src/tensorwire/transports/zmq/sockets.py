"""The ZeroMQ socket settings and calls both ends use: high-water marks, monitors, queueing a
piece without blocking, reading a message's frames."""

from __future__ import annotations

import itertools

import zmq

from tensorwire.errors import TransportTimeout
from tensorwire.transports.base import remaining
from tensorwire.transports.zmq.collector import start_zero_copy_collector
from tensorwire.transports.zmq.pieces import COPY_BYTES, PIECE_BYTES

_monitors = itertools.count()  # names the inproc endpoints of a process's monitors
MAX_FRAME_BYTES = 2 * PIECE_BYTES  # a peer sending a bigger frame is disconnected by libzmq
QUEUE_PIECES = 32  # ZeroMQ messages each socket queues per peer and direction (high-water mark)
HEARTBEAT_IVL_MS = 5_000  # ZMTP pings find connections whose peer vanished without a FIN
HEARTBEAT_TIMEOUT_MS = 30_000
BACKLOG = 4096  # connections the kernel completes before the hub's I/O thread accepts them
# What a socket monitor reports: a connection closed, or its ZMTP handshake failed.
MONITOR_EVENTS = (
    zmq.EVENT_DISCONNECTED
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
)
# A channel's monitor also says when its TCP connection is up (the ZMTP handshake under way).
CHANNEL_MONITOR_EVENTS = MONITOR_EVENTS | zmq.EVENT_CONNECTED
MECHANISM_MISMATCH = int(zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH)  # CURVE on one side only
CRYPTOGRAPHIC = int(zmq.PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC)  # a box that does not open
_PROTOCOL_ERRORS = {
    int(getattr(zmq, n)): n.removeprefix("PROTOCOL_ERROR_")
    for n in dir(zmq)
    if n.startswith("PROTOCOL_ERROR_")
}


def protocol_error(code: int) -> str:
    """libzmq's name of a protocol error a monitor reported."""
    return f"ZMTP protocol error {_PROTOCOL_ERRORS.get(code, hex(code))}"


def endpoint(host: str, port: int | str) -> str:
    return f"tcp://[{host}]:{port}" if ":" in host else f"tcp://{host}:{port}"


def configure(sock: zmq.Socket, host: str) -> None:
    sock.linger = 0
    sock.sndhwm = QUEUE_PIECES  # a full queue makes a send wait, then time out: never unbounded
    sock.rcvhwm = QUEUE_PIECES
    sock.maxmsgsize = MAX_FRAME_BYTES
    sock.heartbeat_ivl = HEARTBEAT_IVL_MS
    sock.heartbeat_timeout = HEARTBEAT_TIMEOUT_MS
    sock.ipv6 = ":" in host


def monitor_socket(sock: zmq.Socket, events: int) -> zmq.Socket:
    """A PAIR socket that reads ``sock``'s monitor events, its queue without a high-water mark.

    libzmq sends a monitor event blocking, from the I/O thread: behind a full queue (pyzmq's
    ``get_monitor_socket`` leaves the default, 1,000 events each side) that thread stops
    serving every connection of the socket, and ``disable_monitor`` then waits for it for
    ever (seen as a hub's close hanging when 2,000 clients left after it stopped reading).
    The owner reads the events as they come; each is a few dozen bytes, one per connection
    that opens, closes or fails its handshake.
    """
    address = f"inproc://tensorwire-monitor-{next(_monitors)}"
    sock.monitor(address, events)
    pair = sock.context.socket(zmq.PAIR)
    pair.linger = 0
    pair.rcvhwm = 0  # an inproc pipe is unbounded when either end's mark is 0
    pair.connect(address)
    return pair


def poll_ms(seconds: float | None) -> int | None:
    return None if seconds is None else int(seconds * 1000) + 1


# Plain ints: pyzmq's enum arithmetic costs microseconds per frame.
SEND_MORE = int(zmq.NOBLOCK | zmq.SNDMORE)
SEND_LAST = int(zmq.NOBLOCK)
EVENTS, POLLIN, POLLOUT = int(zmq.EVENTS), int(zmq.POLLIN), int(zmq.POLLOUT)


def queue_piece(
    sock: zmq.Socket,
    piece: list[bytes | memoryview],
    trackers: list[zmq.MessageTracker],
    envelope: bytes | None = None,
) -> bool:
    """Queue one ZeroMQ message ``[envelope, *piece]`` without blocking; False (nothing queued)
    if the peer's queue is full, or for a DEALER, not connected.

    Frames under pyzmq's copy threshold are copied; bigger ones are shared with libzmq
    (zero-copy), and for those that may be the caller's memory (anything but ``bytes``) the
    trackers go to ``trackers``: the caller waits on them before the arrays may change.
    libzmq checks the high-water mark only at a message's first frame, so only that one can
    find the queue full.
    """
    parts = piece if envelope is None else [envelope, *piece]
    last = len(parts) - 1
    for i, part in enumerate(parts):
        flags = SEND_MORE if i < last else SEND_LAST
        try:
            if len(part) < COPY_BYTES:
                sock.send(part, flags)
                continue
            start_zero_copy_collector()  # at the process's first zero-copy send, locked
            mine = isinstance(part, bytes)  # immutable: nobody can change it while queued
            tracker = sock.send(part, flags, copy=False, track=not mine)
        except zmq.Again:
            if i:
                raise
            return False
        if tracker is not None and not tracker.done:
            trackers.append(tracker)
    return True


def readable(sock: zmq.Socket) -> bool:
    """Whether ``sock`` holds a message, without raising as a failed read does. libzmq takes
    the socket's pending commands first, so when it says no, the socket's FD is armed: it
    signals the next change (ZMQ_FD is edge-triggered)."""
    return bool(sock.get(EVENTS) & POLLIN)  # type: ignore[operator]  # typed int | bytes


def recv_frames(sock: zmq.Socket) -> list[zmq.Frame]:
    """The frames of the ZeroMQ message ``sock`` holds (call after :func:`readable`)."""
    frame = sock.recv(zmq.NOBLOCK, copy=False)
    frames = [frame]
    while frame.more:  # set by pyzmq from ZMQ_RCVMORE, without a getsockopt call of ours
        frame = sock.recv(zmq.NOBLOCK, copy=False)
        frames.append(frame)
    return frames


def wait_released(trackers: list[zmq.MessageTracker], deadline: float | None, to: str) -> None:
    """Block until libzmq has written (or dropped) every zero-copy part, or the deadline."""
    for tracker in trackers:
        left = remaining(deadline)
        try:
            tracker.wait(-1 if left is None else left)
        except zmq.NotDone:
            raise TransportTimeout(
                f"message to {to} not sent within the timeout; ZeroMQ still reads its arrays, "
                "so leave them unchanged or close the endpoint"
            ) from None
