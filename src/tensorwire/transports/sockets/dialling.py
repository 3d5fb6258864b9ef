"""Dialling a hub: one TCP connection, tuned, and secured when asked."""

from __future__ import annotations

import socket
import ssl
from typing import cast

from tensorwire.transports.base import remaining
from tensorwire.transports.sockets.tls_stream import wrap_tls
from tensorwire.transports.sockets.tuning import tune


def connect_stream(
    address: tuple[str, int],
    deadline: float | None,
    context: ssl.SSLContext | None = None,
    server_name: str | None = None,
) -> socket.socket:
    """A connection to ``address`` by ``deadline``; with ``context``, after the TLS handshake
    and key agreement (checking the certificate names ``server_name``, default the host), as a
    :class:`TlsStream`, which the kit's functions take in place of a socket."""
    sock = socket.create_connection(address, timeout=remaining(deadline))
    try:
        tune(sock)
    except OSError:
        sock.close()
        raise
    if context is None:
        return sock
    name = server_name or address[0]
    tls = wrap_tls(sock, context, server_side=False, server_hostname=name, deadline=deadline)
    return cast(socket.socket, tls)
