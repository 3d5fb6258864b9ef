"""shm:// under the conformance suite."""

from __future__ import annotations

import uuid

SCHEME = "shm"


def hub_url(request) -> str:
    """URL to serve a fresh hub on: a name no other test uses."""
    return f"shm://tw-test-{uuid.uuid4().hex[:12]}"


def inject_garbage(hub_url: str) -> None:
    """Join as client "intruder" over the control socket, send a packet that is no message,
    then announce a message in a (properly sealed) segment full of junk."""
    import array
    import fcntl
    import os
    import socket

    from tensorwire.transports.shm import _address
    from tensorwire.wire import encode_message

    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    sock.settimeout(10)
    sock.connect(_address(hub_url.removeprefix("shm://")))
    hello = encode_message(None, {"client_id": "intruder", "decoders": []}, kind="hello")
    sock.send(hello.to_bytes())
    sock.recv(1 << 16)  # welcome
    sock.send(b"\xde\xad\xbe\xef" * 64)
    fd = os.memfd_create("junk", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    os.write(fd, b"\xde\xad\xbe\xef" * 1024)
    fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW)
    note = encode_message(None, {"seg": 1, "offset": 0, "nbytes": 4096}, kind="shm")
    sock.sendmsg(
        [note.to_bytes()], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd]))]
    )
    os.close(fd)
    sock.close()
