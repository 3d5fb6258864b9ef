"""shm:// under the conformance suite.

Security takes the default hooks (mutual TLS settings, which shm:// accepts and does not use,
and the device keys, which it checks); there is no ``proxied_url``: nothing crosses a
network, so the capture test skips."""

from __future__ import annotations

import uuid

SCHEME = "shm"


def hub_url(request) -> str:
    """URL to serve a fresh hub on: a name no other test uses."""
    return f"shm://tw-test-{uuid.uuid4().hex[:12]}"


def _connect(hub_url: str):
    import socket

    from tensorwire.transports.shm.options import address

    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    sock.settimeout(10)
    sock.connect(address(hub_url.removeprefix("shm://")))
    return sock


def _join(hub_url: str, client_id: str):
    """A control connection that said a valid hello and got its welcome."""
    from tensorwire.transports.session import ClientSession

    sock = _connect(hub_url)
    sock.send(ClientSession(client_id, decoders=[], max_message_bytes=1 << 20).hello().to_bytes())
    sock.recv(1 << 16)  # welcome
    return sock


def _send(sock, packet: bytes, fds: list[int] = ()) -> None:
    """One packet with ``fds`` attached; they are closed here (the hub has its own copies)."""
    import array
    import os
    import socket

    ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
    try:
        sock.sendmsg([packet], ancillary)
    except OSError:
        pass  # the hub refused this connection already
    finally:
        for fd in fds:
            os.close(fd)


def _memfd(data: bytes = b"", size: int = 0, seals: bool = True) -> int:
    """A memfd holding ``data``, stretched (sparse) to ``size`` bytes, sealed as the hub asks."""
    import fcntl
    import os

    fd = os.memfd_create("forged", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    os.write(fd, data)
    if size > len(data):
        os.ftruncate(fd, size)
    if seals:
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW)
    return fd


def inject_garbage(hub_url: str) -> None:
    """Join as client "intruder" over the control socket, send a packet that is no message,
    then announce a message in a (properly sealed) segment full of junk."""
    from tensorwire.wire import encode_message

    sock = _join(hub_url, "intruder")
    _send(sock, b"\xde\xad\xbe\xef" * 64)
    note = encode_message(None, {"seg": 1, "offset": 0, "nbytes": 4096}, kind="shm")
    _send(sock, note.to_bytes(), [_memfd(b"\xde\xad\xbe\xef" * 1024)])
    sock.close()


def inject_forged(hub_url: str, client_ids: list[str]) -> None:
    """As strangers on the hub's socket: first packets that are junk, declare an 8 MiB header
    or a 1 TiB body, overflow the packet buffer, or carry a descriptor; then, joined under a
    fresh id, junk packets and forged segment notes: unknown, unsealed and sparse (1 GiB
    declared, nothing behind it) segments, a pipe passed as one, offsets and sizes past the
    end, 1 TiB declared, a header declaring a 1 GiB tensor cut short, a release of a segment
    it never had and two descriptors on one packet; and a hundred connections that say nothing.
    A client only ever talks to its hub, so the hub is where a stranger can reach. (Without
    credentials a hub lets anyone join under a fresh id; taking over ``client_ids`` is the
    security layer's to refuse.)"""
    import os

    import numpy as np

    from tensorwire.wire import encode_message
    from tensorwire.wire.format import MAGIC, PREFIX, VERSION

    def note(kind: str, **meta) -> bytes:
        return encode_message(None, meta, kind=kind).to_bytes()

    socks = []
    huge_body = PREFIX.pack(MAGIC, VERSION, 0, 0, (8 << 20) - 1, 0, 1 << 40)
    for first, fds in (
        (b"\xde\xad\xbe\xef" * 64, []),
        (huge_body, []),
        (b"\0" * (1 << 17), []),  # over the 64 KiB a hello may be
        (note("hello", client_id="x", version=2), [_memfd(b"\0" * 4096)]),
    ):
        sock = _connect(hub_url)
        _send(sock, first, fds)
        socks.append(sock)
    sock = _join(hub_url, f"stranger-{uuid.uuid4().hex[:8]}")
    cut_short = encode_message({"x": np.zeros(1 << 28, np.float32)}, {}).head  # 1 GiB declared
    r, w = os.pipe()
    os.close(w)
    for packet, fds in (
        (b"\xde\xad\xbe\xef" * 64, []),
        (huge_body, []),
        (note("shm", seg="one", offset=0, nbytes=8), []),
        (note("shm", seg=7, offset=0, nbytes=8), []),
        (note("shm", seg=1, offset=0, nbytes=8), [_memfd(b"\0" * 4096, seals=False)]),
        (note("shm", seg=2, offset=0, nbytes=1 << 30), [_memfd(size=1 << 30)]),
        (note("shm", seg=3, offset=0, nbytes=8), [r]),
        (note("shm", seg=4, offset=1 << 40, nbytes=1 << 40), [_memfd(b"\0" * 4096)]),
        (note("shm", seg=5, offset=0, nbytes=len(cut_short)), [_memfd(bytes(cut_short))]),
        (note("shm", seg=6, offset=0, nbytes=8), [_memfd(b"\0" * 4096), _memfd(b"\0" * 4096)]),
        (note("release", seg=1), []),
        (note("drop", seg=99), []),
    ):
        _send(sock, packet, fds)
    socks.append(sock)
    socks += [_connect(hub_url) for _ in range(100)]
    for sock in socks:
        sock.close()


def later_hub_url(request) -> str:
    """A name a channel can dial before a hub serves it."""
    return hub_url(request)
