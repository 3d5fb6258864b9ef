"""The control connection of ``shm://``: a Unix ``SOCK_SEQPACKET`` socket that carries one
whole message per packet, descriptors with it (``SCM_RIGHTS``), and tells whose process is at
the other end (``SO_PEERCRED``)."""

from __future__ import annotations

import array
import contextlib
import os
import select
import socket
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tensorwire.errors import (
    AuthenticationError,
    MalformedHeader,
    MessageTooLarge,
    PeerGone,
    TransportTimeout,
)
from tensorwire.transports.base import remaining
from tensorwire.transports.sockets import shutdown, wait_ready
from tensorwire.wire import encode_message

_UCRED = struct.Struct("3i")  # pid, uid, gid
_FD_BYTES = array.array("i").itemsize
# Room for one descriptor per packet; the kernel closes any more a peer attaches.
_ANCILLARY = socket.CMSG_SPACE(_FD_BYTES)


def peer_cred(sock: socket.socket) -> tuple[int, int]:
    """``(pid, uid)`` of the process at the other end of ``sock``."""
    pid, uid, _ = _UCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))
    return pid, uid


def check_peer_user(sock: socket.socket, trust_other_users: bool) -> None:
    """Refuse (``AuthenticationError``) a peer of another user, root excepted, unless told to
    trust them."""
    pid, uid = peer_cred(sock)
    if not trust_other_users and uid not in (os.geteuid(), 0):
        raise AuthenticationError(
            f"process {pid} of user {uid} is not of this user ({os.geteuid()}); shm:// peers "
            "can write into the memory they send, so pass trust_other_users=True to allow them"
        )


def who(sock: socket.socket, address: Any = None) -> str:
    """The process at the other end of ``sock``, for logs: "pid N" (one key per process, so
    that a flood of connections from one is logged as one); a Unix socket's ``address`` (the
    :class:`Listener` passes it) names nobody."""
    try:
        return f"pid {peer_cred(sock)[0]}"
    except OSError:
        return "a process gone already"


def control_packet(kind: str, meta: dict[str, Any]) -> bytes:
    return encode_message(None, meta, kind=kind).to_bytes()


def count_of(meta: dict[str, Any], key: str) -> int:
    value = meta.get(key)
    if type(value) is not int or value < 0:
        raise MalformedHeader(f"shm:// control packet: {key!r} must be a non-negative integer")
    return value


def close_fds(fds: list[int]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)
    fds.clear()


def try_send(sock: socket.socket, parts: list[Any], fds: list[int] | None) -> bool:
    """One attempt at sending a packet (``parts`` joined, ``fds`` attached) without waiting;
    False when the socket has no room. A packet goes whole or not at all."""
    ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
    try:
        sock.sendmsg(parts, ancillary, socket.MSG_DONTWAIT | socket.MSG_NOSIGNAL)
    except BlockingIOError:
        return False
    except OSError as exc:
        raise PeerGone(f"shm: connection lost: {exc}") from None
    return True


def send_packet(
    sock: socket.socket, parts: list[Any], deadline: float | None, fds: list[int] | None = None
) -> None:
    """Send one packet, waiting for room until ``deadline``.

    Never blocks the socket itself, so threads can share it without a lock.
    """
    while not try_send(sock, parts, fds):
        wait_ready(sock, select.POLLOUT, deadline, "shm: send")


def recv_packet(
    sock: socket.socket, buf: memoryview, deadline: float | None = None
) -> tuple[int, list[int]]:
    """Receive one packet into ``buf``: its length and the descriptors that came with it.

    The caller owns (and must close) the descriptors. ``PeerGone`` at the end of the
    connection; ``MessageTooLarge`` (descriptors closed) for a packet longer than ``buf``.
    """
    if deadline is not None:
        wait_ready(sock, select.POLLIN, deadline, "shm: receive")
    try:
        n, ancillary, flags, _ = sock.recvmsg_into([buf], _ANCILLARY)
    except OSError as exc:
        raise PeerGone(f"shm: connection lost: {exc}") from None
    fds: list[int] = []
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.extend(array.array("i", data[: len(data) - len(data) % _FD_BYTES]))
    if flags & socket.MSG_TRUNC:
        close_fds(fds)
        raise MessageTooLarge(f"a control packet over {len(buf)} bytes was dropped")
    if not n and not fds:
        raise PeerGone("shm: the peer closed the connection")
    return n, fds


def send_each(
    conns: list[Connection],
    packet: Callable[[Connection], tuple[list[Any], list[int] | None]],
    deadline: float | None,
) -> dict[Connection, Exception]:
    """Send each conn its ``packet(conn)`` (parts, fds); return the error of each that failed.

    All at once: a conn whose socket is full waits for room (until ``deadline``) without
    holding up the others.
    """
    failed: dict[Connection, Exception] = {}
    pending = conns
    while pending:
        full = []
        for conn in pending:
            try:
                if not try_send(conn.sock, *packet(conn)):
                    full.append(conn)
            except PeerGone as exc:
                failed[conn] = exc
        pending = full
        if not pending:
            break
        left = remaining(deadline)
        if left == 0.0:
            failed.update((c, TransportTimeout("shm: send timed out")) for c in pending)
            break
        poller = select.poll()
        try:
            for conn in pending:
                poller.register(conn.sock, select.POLLOUT)
        except (ValueError, OSError):  # closed under us: the next try says so
            continue
        poller.poll(None if left is None else left * 1000)  # poll rounds up to whole ms
    return failed


@dataclass(eq=False)
class Connection:
    """One control connection; ``peer`` is a client id, or "hub"."""

    sock: socket.socket
    peer: str
    alive: bool = True

    def send(self, parts: list[Any], deadline: float | None, fds: list[int] | None = None) -> None:
        send_packet(self.sock, parts, deadline, fds)

    def shutdown(self) -> None:
        """Mark it dead and wake its reader; the reader's owner closes the socket."""
        self.alive = False
        shutdown(self.sock)
