"""``shm://name``: messages between processes of one host through shared memory, one copy.

``docs/transports/shm.md`` specifies the layout. Control: a Unix ``SOCK_SEQPACKET`` socket at
the abstract address ``\\0tensorwire-<name>`` (nothing on the file system to leak; the name
vanishes with the hub's socket, even after a ``kill -9``). Each packet is one tensorwire
message: the session's ``hello`` / ``welcome`` / ``refuse`` / ``bye`` (``docs/session.md``);
``data``, a message of at most :data:`INLINE_BYTES` carried in the packet itself; ``shm``
(meta ``seg``, ``offset``, ``nbytes``), a bigger message that lies in shared segment ``seg``;
``release`` (receiver to sender: segment ``seg`` is free again) and ``drop`` (sender to
receiver: segment ``seg`` is retired, forget it). Packets keep their boundaries, so a bad one
costs only itself, and a send that times out leaves nothing half-sent.

Data: a segment is a memfd the sender creates, allocates whole, seals against shrinking and
growing, maps, and passes to each receiver once, with ``SCM_RIGHTS`` on the packet that first
names it. A memfd has no name, so no process can leak one (it is freed when the last mapping
goes); the seal means no peer can truncate it under a reader's mapping (a SIGBUS), and a
receiver refuses a sparse one, whose pages reading would allocate on the receiver's account.
The sender writes the encoded message straight into the segment, hashing each piece on the
way: the one copy. The receiver decodes raw tensors as views of the segment: no copy. A
broadcast writes one segment that every client maps.

Ownership: a received message's raw tensors are views of shared memory the sender does not
touch until the receiver releases it, and the receiver releases it when the last of those
arrays is garbage-collected. The data never changes under you, whatever you keep, for as
long as you keep it. The cost: while one receiver holds ``max_segments`` messages from a
sender, that sender waits (up to its send timeout) before it sends that receiver another big
one (a broadcast goes to the others at once). To keep a message for long, copy it
(``arr.copy()``) or receive into your own arrays with ``recv(out=...)`` (a second copy; the
segment is released at once).

Only processes of the same user (or root) may connect, unless ``trust_other_users=True``:
a peer keeps write access to the segments it sends, which over ``tcp://`` it would not have.
Linux only (memfd, abstract sockets), and abstract sockets are per network namespace.

Security: nothing leaves the host, so there is nothing to encrypt and ``tls=`` is accepted
and not used. The peer's uid (``SO_PEERCRED``) is checked on both sides; with ``auth=`` keys
(hub) and ``key=`` (client) the hello proves the client's enrolled secret and the welcome the
hub's (``docs/security.md``). A hub asked for client certificates (``tls`` naming a CA) with
no keys refuses to start: it could not check them, and would admit anyone.
"""

from __future__ import annotations

import array
import contextlib
import fcntl
import logging
import math
import mmap
import os
import queue
import re
import select
import socket
import stat
import struct
import threading
import time
import uuid
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from tensorwire.codecs import AutoCodec, get_codec
from tensorwire.errors import (
    AuthenticationError,
    MalformedHeader,
    MessageTooLarge,
    PeerGone,
    SessionRefused,
    TransportError,
    TransportTimeout,
    WireError,
)
from tensorwire.transports.base import (
    Channel,
    Hub,
    Inbox,
    deadline_after,
    default_client_id,
    dial,
    remaining,
)
from tensorwire.transports.security import TLS
from tensorwire.transports.session import (
    HELLO_LIMITS,
    ClientSession,
    Closed,
    Data,
    HubSession,
    Welcomed,
    bye,
)
from tensorwire.transports.url import query_options
from tensorwire.wire import EncodedMessage, Limits, Message, decode_message, encode_message
from tensorwire.wire.pool import size_class

log = logging.getLogger("tensorwire.transports.shm")

INLINE_BYTES = 64 << 10
"""Messages up to this many bytes (encoded) travel in their control packet, copied."""
ALIGN = 64
"""A message is placed so that its first tensor starts on this boundary (bytes)."""
MAX_MAPPED = 256
"""Segments one peer may have mapped in this process at once."""
SHM_BANDWIDTH = 4e9
"""Bytes/s a same-host copy moves: where ``codec="auto"`` starts its link estimate."""
HANDSHAKE_TIMEOUT = 10.0  # seconds a new connection has to say hello
MAX_HANDSHAKES = 64  # connections at once that have not said hello; more are closed at once
BYE_TIMEOUT = 1.0  # seconds spent saying goodbye (or dropping a segment) before giving up
RELEASE_TIMEOUT = 10.0  # seconds a release notice may wait for room in the socket

_NAME = re.compile(r"[A-Za-z0-9._-]{1,90}")
_UCRED = struct.Struct("3i")  # pid, uid, gid
_FD_BYTES = array.array("i").itemsize
# Room for one descriptor per packet; the kernel closes any more a peer attaches.
_ANCILLARY = socket.CMSG_SPACE(_FD_BYTES)


class BadSegment(WireError):
    """A peer named a shared segment that is missing, unsealed, sparse, too small or still in
    use."""


def _address(name: str) -> str:
    """The abstract Unix socket address of the hub called ``name``."""
    return f"\0tensorwire-{name}"


def _name_of(url: str) -> str:
    """``shm://name`` -> ``name`` (may be empty: the hub then picks one); ``TransportError``
    for any URL option (the security options are taken out before, and mean nothing here)."""
    query_options(url, ())
    scheme, sep, name = url.partition("://")
    if scheme != "shm" or not sep:
        raise TransportError(f"{url!r} is not an shm:// URL; write it as shm://NAME")
    if name and not _NAME.fullmatch(name):
        raise TransportError(
            f"{url!r}: the name after shm:// must be 1 to 90 characters of A-Z a-z 0-9 . _ -"
        )
    return name


def _require_linux() -> None:
    if not hasattr(os, "memfd_create") or not hasattr(fcntl, "F_ADD_SEALS"):
        raise TransportError(
            "shm:// needs Linux (memfd_create with seals); on this system use tcp://127.0.0.1:0"
        )


def _peer_cred(sock: socket.socket) -> tuple[int, int]:
    """``(pid, uid)`` of the process at the other end of ``sock``."""
    pid, uid, _ = _UCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))
    return pid, uid


def _check_peer_user(sock: socket.socket, trust_other_users: bool) -> None:
    """Refuse (``AuthenticationError``) a peer of another user, root excepted, unless told to
    trust them."""
    pid, uid = _peer_cred(sock)
    if not trust_other_users and uid not in (os.geteuid(), 0):
        raise AuthenticationError(
            f"process {pid} of user {uid} is not of this user ({os.geteuid()}); shm:// peers "
            "can write into the memory they send, so pass trust_other_users=True to allow them"
        )


def _who(sock: socket.socket) -> str:
    """The process at the other end of ``sock``, for logs: "pid N" (one key per process, so
    that a flood of connections from one is logged as one)."""
    try:
        return f"pid {_peer_cred(sock)[0]}"
    except OSError:
        return "a process gone already"


def _packet(kind: str, meta: dict[str, Any]) -> bytes:
    return encode_message(None, meta, kind=kind).to_bytes()


def _count(meta: dict[str, Any], key: str) -> int:
    value = meta.get(key)
    if type(value) is not int or value < 0:
        raise MalformedHeader(f"shm:// control packet: {key!r} must be a non-negative integer")
    return value


def _without_frames(exc: WireError) -> WireError:
    """The error without traceback or chained errors, whose frames would keep views of a
    segment alive (and so the segment held) for as long as the error is kept."""
    exc.__traceback__ = exc.__context__ = exc.__cause__ = None
    return exc


def _close_fds(fds: list[int]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)
    fds.clear()


# -- packets --------------------------------------------------------------------------------


def _wait_ready(sock: socket.socket, events: int, deadline: float | None, what: str) -> None:
    """Block until ``sock`` is ready for ``events`` (select.POLL*); TransportTimeout at deadline."""
    poller = select.poll()
    try:
        poller.register(sock, events)
    except (ValueError, OSError):  # closed under us
        raise PeerGone("shm: the connection is closed") from None
    while True:
        left = remaining(deadline)
        if left == 0.0:
            raise TransportTimeout(f"shm: {what} timed out")
        if poller.poll(None if left is None else max(1, math.ceil(left * 1000))):
            return


def _try_send(sock: socket.socket, parts: list[Any], fds: list[int] | None) -> bool:
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


def _send_packet(
    sock: socket.socket, parts: list[Any], deadline: float | None, fds: list[int] | None = None
) -> None:
    """Send one packet, waiting for room until ``deadline``.

    Never blocks the socket itself, so threads can share it without a lock.
    """
    while not _try_send(sock, parts, fds):
        _wait_ready(sock, select.POLLOUT, deadline, "send")


def _recv_packet(
    sock: socket.socket, buf: memoryview, deadline: float | None = None
) -> tuple[int, list[int]]:
    """Receive one packet into ``buf``: its length and the descriptors that came with it.

    The caller owns (and must close) the descriptors. ``PeerGone`` at the end of the
    connection; ``MessageTooLarge`` (descriptors closed) for a packet longer than ``buf``.
    """
    if deadline is not None:
        _wait_ready(sock, select.POLLIN, deadline, "receive")
    try:
        n, ancillary, flags, _ = sock.recvmsg_into([buf], _ANCILLARY)
    except OSError as exc:
        raise PeerGone(f"shm: connection lost: {exc}") from None
    fds: list[int] = []
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.extend(array.array("i", data[: len(data) - len(data) % _FD_BYTES]))
    if flags & socket.MSG_TRUNC:
        _close_fds(fds)
        raise MessageTooLarge(f"a control packet over {len(buf)} bytes was dropped")
    if not n and not fds:
        raise PeerGone("shm: the peer closed the connection")
    return n, fds


def _send_each(
    conns: list[_Conn],
    packet: Callable[[_Conn], tuple[list[Any], list[int] | None]],
    deadline: float | None,
) -> dict[_Conn, Exception]:
    """Send each conn its ``packet(conn)`` (parts, fds); return the error of each that failed.

    All at once: a conn whose socket is full waits for room (until ``deadline``) without
    holding up the others.
    """
    failed: dict[_Conn, Exception] = {}
    pending = conns
    while pending:
        full = []
        for conn in pending:
            try:
                if not _try_send(conn.sock, *packet(conn)):
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
        poller.poll(None if left is None else max(1, math.ceil(left * 1000)))
    return failed


@dataclass(eq=False)
class _Conn:
    """One control connection; ``peer`` is a client id, or "hub"."""

    sock: socket.socket
    peer: str
    alive: bool = True

    def send(self, parts: list[Any], deadline: float | None, fds: list[int] | None = None) -> None:
        _send_packet(self.sock, parts, deadline, fds)

    def shutdown(self) -> None:
        """Mark it dead and wake its reader; the reader's owner closes the socket."""
        self.alive = False
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)


# -- the sending side -----------------------------------------------------------------------


class _Segment:
    """A sealed memfd this side writes messages into; ``holders`` have not released it."""

    def __init__(self, seg_id: int, size: int) -> None:
        self.id = seg_id
        self.size = size
        self.fd = os.memfd_create(f"tensorwire-{seg_id}", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.ftruncate(self.fd, size)
            os.posix_fallocate(self.fd, 0, size)  # receivers refuse sparse segments
            seals = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL
            fcntl.fcntl(self.fd, fcntl.F_ADD_SEALS, seals)
            self.mm = mmap.mmap(self.fd, size, flags=mmap.MAP_SHARED)
        except BaseException:
            os.close(self.fd)
            raise
        self.holders: set[_Conn] = set()
        self.mapped_by: set[_Conn] = set()  # receivers that have its descriptor
        self.last_used = time.monotonic()

    def write(self, enc: EncodedMessage) -> int:
        """Copy ``enc`` in (computing its digests on the way); return where it starts."""
        offset = -len(enc.head) % ALIGN
        pos = offset
        with memoryview(self.mm) as mv:
            for batch in enc.segments():
                for piece in batch:
                    end = pos + len(piece)
                    mv[pos:end] = piece
                    pos = end
        return offset

    def close(self) -> None:
        with contextlib.suppress(BufferError):  # a view still exported: the GC unmaps it
            self.mm.close()
        os.close(self.fd)


class _Outbox:
    """The segments one endpoint sends through, shared by all its receivers.

    A segment is free once every receiver it was sent to released it. Free segments are
    kept for reuse (their pages stay mapped on both sides: no page faults) up to
    ``cache_bytes``; beyond that the least recently used are retired.
    """

    def __init__(self, max_segments: int, cache_bytes: int) -> None:
        if max_segments < 1:
            raise ValueError(f"max_segments must be at least 1, got {max_segments}")
        self.max_segments = max_segments
        self.cache_bytes = cache_bytes
        self._cond = threading.Condition()
        self._segments: dict[int, _Segment] = {}
        self._next_id = 1
        self._closed = False

    def _held_by(self, conn: _Conn) -> int:
        return sum(conn in s.holders for s in self._segments.values())

    def acquire(
        self, nbytes: int, conns: list[_Conn], deadline: float | None
    ) -> tuple[_Segment | None, list[_Conn], list[_Conn], dict[_Conn, Exception]]:
        """A segment of at least ``nbytes`` and the conns it is now held for; the conns to
        try again (they hold ``max_segments`` of these segments); why the others were left out.

        Waits (until ``deadline``) only while every live conn holds ``max_segments``: a
        receiver that keeps its messages does not hold up the others.
        """
        with self._cond:
            while True:
                if self._closed:
                    return None, [], [], {c: PeerGone("shm: endpoint closed") for c in conns}
                failed: dict[_Conn, Exception] = {
                    c: PeerGone(f"shm: {c.peer!r} is gone") for c in conns if not c.alive
                }
                full = [c for c in conns if c.alive and self._held_by(c) >= self.max_segments]
                takers = [c for c in conns if c not in failed and c not in full]
                left = remaining(deadline)
                if takers or not full or left == 0.0:
                    break
                self._cond.wait(left)
            if left == 0.0:
                for c in full:
                    failed[c] = TransportTimeout(
                        f"shm: {c.peer!r} still holds max_segments={self.max_segments} big "
                        "messages (their arrays are views of shared memory): it must drop them, "
                        "copy what it keeps, or receive with recv(out=...) before it gets more; "
                        "or raise max_segments"
                    )
                full = []
            if not takers:
                return None, [], full, failed
            free = [s for s in self._segments.values() if not s.holders and s.size >= nbytes]
            seg = min(free, key=lambda s: s.size) if free else None
            if seg is None:
                try:
                    seg = _Segment(self._next_id, size_class(nbytes))
                except OSError as exc:
                    raise TransportError(
                        f"shm: cannot make a {nbytes}-byte shared segment: {exc}"
                    ) from None
                self._next_id += 1
                self._segments[seg.id] = seg
            seg.holders = set(takers)
            retired = self._trim()
        self._retire(retired)
        return seg, takers, full, failed

    def notify(
        self, seg: _Segment, conns: list[_Conn], offset: int, nbytes: int, deadline: float | None
    ) -> dict[_Conn, Exception]:
        """Tell each of ``conns`` the message is in ``seg`` (passing the descriptor to those
        that never had it); return why each that was not told failed, and release it."""
        note = _packet("shm", {"seg": seg.id, "offset": offset, "nbytes": nbytes})
        with self._cond:
            fresh = {c for c in conns if c not in seg.mapped_by}
        failed = _send_each(conns, lambda c: ([note], [seg.fd] if c in fresh else None), deadline)
        with self._cond:
            seg.mapped_by.update(c for c in fresh if c.alive and c not in failed)
        for conn in failed:
            with contextlib.suppress(BadSegment):  # forgotten meanwhile: nothing to release
                self.release(conn, seg.id)
        return failed

    def release(self, conn: _Conn, seg_id: int) -> None:
        """``conn`` is done with ``seg_id``; BadSegment if it did not hold it."""
        with self._cond:
            seg = self._segments.get(seg_id)
            if seg is None or conn not in seg.holders:
                raise BadSegment(f"{conn.peer!r} released segment {seg_id}, which it does not hold")
            seg.holders.discard(conn)
            seg.last_used = time.monotonic()
            retired = self._trim()
            self._cond.notify_all()
        self._retire(retired)

    def forget(self, conn: _Conn) -> None:
        """``conn`` is gone: whatever it held is free."""
        with self._cond:
            for seg in self._segments.values():
                seg.holders.discard(conn)
                seg.mapped_by.discard(conn)
            retired = self._trim()
            self._cond.notify_all()
        self._retire(retired)

    def _trim(self) -> list[_Segment]:
        """Take out free segments beyond ``cache_bytes``, least recently used first."""
        free = sorted(
            (s for s in self._segments.values() if not s.holders), key=lambda s: s.last_used
        )
        cached = sum(s.size for s in free)
        out = []
        for seg in free:
            if cached <= self.cache_bytes:
                break
            cached -= seg.size
            del self._segments[seg.id]
            out.append(seg)
        return out

    def _retire(self, segments: list[_Segment]) -> None:
        for seg in segments:
            note = _packet("drop", {"seg": seg.id})
            for conn in seg.mapped_by:
                if conn.alive:
                    with contextlib.suppress(TransportError):
                        conn.send([note], deadline_after(BYE_TIMEOUT))
            seg.close()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            segments = list(self._segments.values())
            self._segments.clear()
            self._cond.notify_all()
        for seg in segments:
            seg.close()


def _send_message(
    outbox: _Outbox, conns: list[_Conn], enc: EncodedMessage, deadline: float | None
) -> dict[_Conn, Exception]:
    """Send ``enc`` to each of ``conns``; return the error of each that failed."""
    if enc.nbytes <= INLINE_BYTES:
        frames = enc.frames()
        return _send_each(conns, lambda _: (frames, None), deadline)
    failed: dict[_Conn, Exception] = {}
    waiting = conns
    while waiting:  # each round takes at least one conn, or fails them all
        seg, takers, waiting, left_out = outbox.acquire(enc.nbytes + ALIGN, waiting, deadline)
        failed.update(left_out)
        if seg is None:
            continue
        try:
            offset = seg.write(enc)  # once per round: a late receiver gets a copy of its own
        except BaseException:
            for conn in takers:
                with contextlib.suppress(BadSegment):  # forgotten meanwhile: nothing to release
                    outbox.release(conn, seg.id)
            raise
        failed.update(outbox.notify(seg, takers, offset, enc.nbytes, deadline))
    return failed


# -- the receiving side ---------------------------------------------------------------------


@dataclass(frozen=True)
class _Claim:
    """A message announced in a segment: where it lies, checked against the mapping."""

    seg: int
    mm: mmap.mmap
    offset: int
    nbytes: int


class _Mappings:
    """The segments one peer passed us, mapped; hands out message views that release
    their segment (through ``releases``) when the last of them is garbage-collected."""

    def __init__(self, conn: _Conn, releases: queue.SimpleQueue[Any]) -> None:
        self._conn = conn
        self._releases = releases
        self._maps: dict[int, mmap.mmap] = {}
        self._held: set[int] = set()

    def claim(self, meta: dict[str, Any], fds: list[int]) -> _Claim:
        """Check an ``shm`` notification, mapping the segment whose descriptor came with it."""
        seg, offset, nbytes = (_count(meta, k) for k in ("seg", "offset", "nbytes"))
        if fds:
            self._map(seg, fds.pop(0))
        mm = self._maps.get(seg)
        if mm is None:
            raise BadSegment(f"segment {seg} was never passed on this connection")
        if offset + nbytes > len(mm):
            raise BadSegment(
                f"a message of {nbytes} bytes at offset {offset} overruns segment {seg} "
                f"of {len(mm)} bytes"
            )
        if seg in self._held:
            raise BadSegment(f"segment {seg} was sent again while its last message is in use")
        self._held.add(seg)
        return _Claim(seg, mm, offset, nbytes)

    def _map(self, seg: int, fd: int) -> None:
        try:
            if seg in self._maps:
                raise BadSegment(f"segment {seg} was passed twice")
            if len(self._maps) >= MAX_MAPPED:
                raise BadSegment(f"the peer has {MAX_MAPPED} segments mapped here already")
            try:
                seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
                st = os.fstat(fd)
            except OSError:
                raise BadSegment(f"segment {seg}: the descriptor passed is not a memfd") from None
            if not seals & fcntl.F_SEAL_SHRINK or not stat.S_ISREG(st.st_mode):
                raise BadSegment(
                    f"segment {seg} is not sealed against shrinking: the peer could truncate it "
                    "under our mapping"
                )
            if st.st_blocks * 512 < st.st_size:
                raise BadSegment(
                    f"segment {seg} declares {st.st_size} bytes but holds "
                    f"{st.st_blocks * 512}: reading its holes would allocate them here"
                )
            try:
                self._maps[seg] = mmap.mmap(fd, st.st_size, flags=mmap.MAP_SHARED)
            except (OSError, ValueError) as exc:
                raise BadSegment(f"segment {seg} cannot be mapped: {exc}") from None
        finally:
            os.close(fd)

    def open(self, claim: _Claim) -> np.ndarray:
        """The claimed message's bytes, as a uint8 array whose death releases the segment."""
        base = np.frombuffer(claim.mm, np.uint8, claim.nbytes, claim.offset)
        weakref.finalize(base, self._released, claim.seg).atexit = False
        return base

    def _released(self, seg: int) -> None:
        # Runs wherever the last view dies, maybe inside our own code: it takes no lock and
        # never blocks. Sent from here when the socket has room, the release goes out before
        # anything this thread sends next (an ack, say), so the sender finds the segment free.
        self._held.discard(seg)
        if not self._conn.alive:
            return
        try:
            self._conn.send([_packet("release", {"seg": seg})], deadline=time.monotonic())
        except TransportTimeout:
            self._releases.put((self._conn, seg))
        except TransportError:
            pass  # the peer is gone, and with it what it would reuse

    def drop(self, seg: int) -> None:
        """Forget a retired segment; views still alive keep its mapping."""
        self._maps.pop(seg, None)

    def close(self) -> None:
        self._maps.clear()


class _Releaser:
    """Sends, from a thread of its own, the ``release`` packets that found no room in the socket
    when their views died."""

    def __init__(self, name: str) -> None:
        self.queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while (item := self.queue.get()) is not None:
            conn, seg = item
            if conn.alive:
                with contextlib.suppress(TransportError):
                    conn.send([_packet("release", {"seg": seg})], deadline_after(RELEASE_TIMEOUT))

    def stop(self) -> None:
        self.queue.put(None)
        self._thread.join(timeout=5)


def _seed_bandwidth(selector: Any) -> None:
    if isinstance(selector, AutoCodec):
        # A copy in memory, not a network: compression rarely pays.
        selector.bandwidth = SHM_BANDWIDTH


# -- hub and channel ------------------------------------------------------------------------


class ShmHub(Hub):
    """Hub at ``shm://name`` (``shm://`` alone picks a free name; see :attr:`url`).

    ``max_segments``: big messages one client may hold (keep alive) before sends to it wait;
    ``cache_bytes``: bytes of free segments kept for reuse; ``trust_other_users``: accept
    processes of other users. ``auth=`` keys admit only enrolled clients; ``tls=`` is not used
    (nothing leaves the host), and one naming a CA needs ``auth=`` too.
    """

    protocol = "shm"

    def __init__(
        self,
        url: str,
        *,
        max_segments: int = 8,
        cache_bytes: int = 1 << 30,
        trust_other_users: bool = False,
        backlog: int = 128,
        **options: Any,
    ) -> None:
        _require_linux()
        name = _name_of(url) or f"tw-{uuid.uuid4().hex[:12]}"
        super().__init__(**options)
        if self.tls is not None:
            checked = options.get("auth") is not None or options.get("authenticate") is not None
            _no_tls(self.tls, checked)
        _seed_bandwidth(self.selector)
        self.url = f"shm://{name}"
        self._trust = trust_other_users
        self._lsock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self._lsock.bind(_address(name))
        except OSError as exc:
            self._lsock.close()
            raise TransportError(
                f"cannot serve {self.url}: {exc} (another hub serves that name? pick another)"
            ) from None
        self._lsock.listen(backlog)
        self._outbox = _Outbox(max_segments, cache_bytes)
        self._releaser = _Releaser(f"tensorwire-shm-release-{name}")
        self._conns: dict[str, _Conn] = {}
        self._lock = threading.Lock()
        self._threads: set[threading.Thread] = set()  # one per connection, until it ends
        self._accepting = threading.Thread(
            target=self._accept_loop, name=f"tensorwire-shm-accept-{name}", daemon=True
        )
        self._accepting.start()

    def _accept_loop(self) -> None:
        while True:
            try:
                sock, _ = self._lsock.accept()
            except OSError:
                return  # listening socket shut down by close()
            with self._lock:
                crowded = len(self._threads) - len(self._conns) >= MAX_HANDSHAKES
            if crowded:  # a flood of silent connections must not cost a thread each
                self._refused(_who(sock), TransportError("too many handshakes"))
                sock.close()
                continue
            t = threading.Thread(
                target=self._serve_connection, args=(sock,), name="tensorwire-shm-conn", daemon=True
            )
            with self._lock:
                self._threads.add(t)
            t.start()

    def _handshake(self, sock: socket.socket) -> HubSession:
        """Read the hello (under HELLO_LIMITS) and answer it; raise why if it is refused."""
        deadline = deadline_after(HANDSHAKE_TIMEOUT)
        buf = bytearray(HELLO_LIMITS.max_message_bytes)
        n, fds = _recv_packet(sock, memoryview(buf), deadline)
        _close_fds(fds)
        session = HubSession(**self._session_options())
        try:
            _check_peer_user(sock, self._trust)
            session.receive(
                decode_message(memoryview(buf)[:n], limits=HELLO_LIMITS, codec_lookup=get_codec)
            )
        except SessionRefused as exc:
            with contextlib.suppress(TransportError):  # it hung up: nothing to tell
                _send_packet(sock, [session.refusal(exc).to_bytes()], deadline_after(BYE_TIMEOUT))
            raise
        _send_packet(sock, [session.welcome().to_bytes()], deadline)
        return session

    def _serve_connection(self, sock: socket.socket) -> None:
        try:
            session = self._handshake(sock)
        except (WireError, TransportError) as exc:
            self._refused(_who(sock), exc)
            sock.close()
            with self._lock:
                self._threads.discard(threading.current_thread())
            return
        hello = session.hello
        assert hello is not None
        cid = hello.client_id
        conn = _Conn(sock, cid)
        mappings = _Mappings(conn, self._releaser.queue)
        with self._lock:
            old = self._conns.get(cid)
            self._conns[cid] = conn
        if old is not None:
            log.info("shm: client %r reconnected; closing its old connection", cid)
            old.shutdown()
        self._joined(cid, hello.decoders, session=conn, max_message_bytes=hello.max_message_bytes)
        reason = self._read_loop(conn, mappings, session)
        with self._lock:
            current = self._conns.get(cid) is conn
            if current:
                del self._conns[cid]
            self._threads.discard(threading.current_thread())
        conn.shutdown()
        self._outbox.forget(conn)
        mappings.close()
        sock.close()
        if current:
            self._left(cid, reason, session=conn)

    def _read_loop(self, conn: _Conn, mappings: _Mappings, session: HubSession) -> str:
        """Handle the client's packets until it leaves; return why it left."""
        buf = memoryview(bytearray(INLINE_BYTES))
        while True:
            fds: list[int] = []
            try:
                n, fds = _recv_packet(conn.sock, buf)
                if reason := self._on_packet(conn, mappings, session, buf[:n], fds):
                    return reason
            except WireError as exc:
                self._rejected(conn.peer, _without_frames(exc))
            except PeerGone as exc:
                return str(exc)
            finally:
                _close_fds(fds)

    def _on_packet(
        self,
        conn: _Conn,
        mappings: _Mappings,
        session: HubSession,
        packet: memoryview,
        fds: list[int],
    ) -> str | None:
        """Act on one packet; return why the session ended, if it did. (A method of its own so
        that no local of the read loop keeps a delivered message's segment held.)"""
        t = time.perf_counter()
        # A copy of the packet: inline tensors are views of it, and the buffer is reused.
        msg = self._decode_whole(bytearray(packet), t)
        if msg.kind == "shm":
            msg = self._decode_whole(mappings.open(mappings.claim(msg.meta, fds)), t)
        elif msg.kind == "release":
            self._outbox.release(conn, _count(msg.meta, "seg"))
            return None
        elif msg.kind == "drop":
            mappings.drop(_count(msg.meta, "seg"))
            return None
        event = session.receive(msg)
        if isinstance(event, Data):
            self._delivered(conn.peer, msg)
        elif isinstance(event, Closed):
            return event.reason
        else:
            log.debug("shm: %r: %s", conn.peer, event)
        return None

    def _send_many(
        self, clients: list[str], enc: EncodedMessage, deadline: float | None
    ) -> dict[str, float | Exception]:
        """Write ``enc`` once (into one segment all of them map) and notify each client."""
        t = time.perf_counter()
        with self._lock:
            conns = {c: self._conns.get(c) for c in clients}
        results: dict[str, float | Exception] = {
            c: PeerGone(f"client {c!r} is not connected") for c, conn in conns.items() if not conn
        }
        live = {conn: c for c, conn in conns.items() if conn is not None}
        failed = _send_message(self._outbox, list(live), enc, deadline)
        wire_s = time.perf_counter() - t
        for conn, c in live.items():
            results[c] = failed.get(conn, wire_s)
        return results

    def _send_encoded(self, client_id: str, enc: EncodedMessage, deadline: float | None) -> None:
        result = self._send_many([client_id], enc, deadline)[client_id]
        if isinstance(result, Exception):
            raise result

    def _close_transport(self) -> None:
        with contextlib.suppress(OSError):
            self._lsock.shutdown(socket.SHUT_RDWR)
        self._lsock.close()
        self._accepting.join(timeout=5)
        with self._lock:
            conns = list(self._conns.values())
            threads = list(self._threads)
        goodbye = bye("the hub is closing").to_bytes()
        for conn in conns:
            with contextlib.suppress(TransportError):
                conn.send([goodbye], deadline_after(BYE_TIMEOUT))
            conn.shutdown()
        for t in threads:
            t.join(timeout=5)
        self._outbox.close()
        self._releaser.stop()


def _no_tls(tls: TLS, checked: bool) -> None:
    """Check a hub's ``tls=``, which shm:// does not use: a certificate check it asks for
    (``tls.ca``) with no other check of clients (``auth=`` keys, an ``authenticate`` hook)
    to stand in for it would leave the door open."""
    if tls.ca is not None and not checked:
        raise TransportError(
            "shm:// runs no TLS (nothing leaves this host), so it cannot check client "
            "certificates: give auth= keys (tensorwire certs writes keys.json) to admit only "
            "enrolled clients"
        )
    log.info("shm: tls= is not used: nothing leaves this host; the uid check and keys admit")


class ShmChannel(Channel):
    """A client's connection to an :class:`ShmHub`; retries connecting for ``timeout`` seconds.

    ``max_segments``, ``cache_bytes`` and ``trust_other_users`` as for :class:`ShmHub`. ``key``
    is its enrolled secret (bytes, hex, or a file of hex), proven in every hello; ``tls`` is
    accepted and not used (nothing leaves the host).
    """

    protocol = "shm"

    def __init__(
        self,
        url: str,
        *,
        client_id: str | None = None,
        codec: Any = "auto",
        checksum: bool = True,
        limits: Limits = Limits(),
        timeout: float = 30.0,
        max_segments: int = 8,
        cache_bytes: int = 1 << 30,
        trust_other_users: bool = False,
        tls: TLS | None = None,
        key: Any = None,
    ) -> None:
        _require_linux()
        name = _name_of(url)
        if not name:
            raise TransportError(f"{url!r} names no hub; write it as shm://NAME")
        super().__init__(codec, checksum, limits)
        _seed_bandwidth(self.selector)
        self.url = url
        self.client_id = client_id or default_client_id()
        self._credentials(tls, key)
        self._address = _address(name)
        self._trust = trust_other_users
        self._max_segments = max_segments
        self._cache_bytes = cache_bytes
        # ("data", packet, msg, t) or ("shm", mappings, claim, t) from the reader thread, or
        # the WireError of a bad packet
        self._inbox = Inbox()
        self._conn: _Conn | None = None
        self._releaser: _Releaser | None = None
        self.reconnect(timeout)

    def _open(self, deadline: float | None) -> tuple[socket.socket, ClientSession, Welcomed]:
        """One attempt: connect, say hello, read the answer by ``deadline`` (at most twice the
        hub's handshake window). ``OSError`` when it may be worth retrying."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            sock.connect(self._address)
            _check_peer_user(sock, self._trust)
            session = self._client_session(f"the hub at {self.url}")
            answer_by = time.monotonic() + 2 * HANDSHAKE_TIMEOUT
            if deadline is not None:
                answer_by = min(deadline, answer_by)
            _send_packet(sock, [session.hello().to_bytes()], answer_by)
            buf = bytearray(INLINE_BYTES)
            n, fds = _recv_packet(sock, memoryview(buf), answer_by)
            _close_fds(fds)
            welcome = session.receive(self._decode_whole(memoryview(buf)[:n], time.perf_counter()))
        except BaseException:
            sock.close()
            raise
        assert isinstance(welcome, Welcomed)
        return sock, session, welcome

    def reconnect(self, timeout: float = 30.0) -> None:
        """(Re)dial the hub and say hello with the same client id."""
        self._drop()
        sock, session, welcome = dial(self._open, what=self.url, timeout=timeout)
        self.hub_decoders = welcome.decoders
        self.hub_max_bytes = welcome.max_message_bytes
        if self._releaser is None:
            self._releaser = _Releaser(f"tensorwire-shm-release-{self.client_id}")
        conn = _Conn(sock, "hub")
        self._mappings = _Mappings(conn, self._releaser.queue)
        self._outbox = _Outbox(self._max_segments, self._cache_bytes)
        self._inbox = Inbox()
        self._conn = conn
        self._reader = threading.Thread(
            target=self._read_loop,
            args=(conn, session, self._mappings, self._outbox, self._inbox),
            name=f"tensorwire-shm-read-{self.client_id}",
            daemon=True,
        )
        self._reader.start()

    def _read_loop(
        self,
        conn: _Conn,
        session: ClientSession,
        mappings: _Mappings,
        outbox: _Outbox,
        inbox: Inbox,
    ) -> None:
        """Queue the hub's messages for recv; handle releases, drops and bye at once."""
        buf = memoryview(bytearray(INLINE_BYTES))
        while True:
            fds: list[int] = []
            try:
                n, fds = _recv_packet(conn.sock, buf)
                t = time.perf_counter()
                packet = bytearray(buf[:n])  # inline tensors are views of it; buf is reused
                msg = self._decode_whole(packet, t)
                if msg.kind == "data":
                    inbox.put(("data", packet, msg, t))
                elif msg.kind == "shm":
                    inbox.put(("shm", mappings, mappings.claim(msg.meta, fds), t))
                elif msg.kind == "release":
                    outbox.release(conn, _count(msg.meta, "seg"))
                elif msg.kind == "drop":
                    mappings.drop(_count(msg.meta, "seg"))
                elif isinstance(session.receive(msg), Closed):
                    self._lost(conn, outbox, inbox, session.closed_error())
                    return
            except WireError as exc:
                inbox.put(_without_frames(exc))
            except PeerGone as exc:
                self._lost(conn, outbox, inbox, exc)
                return
            finally:
                _close_fds(fds)

    @staticmethod
    def _lost(conn: _Conn, outbox: _Outbox, inbox: Inbox, exc: PeerGone) -> None:
        conn.alive = False
        outbox.forget(conn)
        inbox.fail(exc)

    def _recv_message(self, deadline: float | None, out: Any) -> Message:
        if self._conn is None:
            raise PeerGone("channel is closed; call reconnect()")
        item = self._inbox.get(deadline)
        if isinstance(item, WireError):
            raise item
        try:
            if item[0] == "data":
                _, packet, msg, t = item
                return msg if out is None else self._decode_whole(packet, t, out)
            _, mappings, claim, t = item
            return self._decode_whole(mappings.open(claim), t, out)
        except WireError as exc:
            raise _without_frames(exc) from None

    def _send_encoded(self, enc: EncodedMessage, deadline: float | None) -> None:
        conn = self._conn
        if conn is None or not conn.alive:
            raise PeerGone("channel is closed; call reconnect()")
        failed = _send_message(self._outbox, [conn], enc, deadline)
        if conn in failed:
            raise failed[conn]

    def _drop(self) -> None:
        """Cut the connection without a goodbye (also what close() ends with)."""
        conn, self._conn = self._conn, None
        if conn is None:
            return
        self._inbox.fail(PeerGone("channel is closed; call reconnect()"))
        conn.shutdown()
        self._reader.join(timeout=5)
        self._outbox.close()
        self._mappings.close()
        conn.sock.close()

    def close(self) -> None:
        """Say goodbye to the hub, close the connection and stop the release thread."""
        conn = self._conn
        if conn is not None and conn.alive:
            with contextlib.suppress(TransportError):
                conn.send([bye().to_bytes()], deadline_after(BYE_TIMEOUT))
        self._drop()
        if self._releaser is not None:
            self._releaser.stop()
            self._releaser = None
