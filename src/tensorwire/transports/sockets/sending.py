"""Sending an encoded message over a stream socket (plain, or a :class:`TlsStream`)."""

from __future__ import annotations

import contextlib
import socket

from tensorwire.transports.sockets.sendmsg import sendmsg_all
from tensorwire.transports.sockets.tls_stream import TlsStream
from tensorwire.wire import EncodedMessage
from tensorwire.wire.encoder import SEGMENT_BYTES


def send_encoded(sock: socket.socket, enc: EncodedMessage, deadline: float | None = None) -> None:
    """Send a whole encoded message (hashing each piece just before it goes)."""
    if isinstance(sock, TlsStream):  # sealed: its records gather small buffers themselves
        for batch in [enc.frames()] if enc.nbytes <= SEGMENT_BYTES else enc.segments():
            sock.send_all(batch, deadline)
        return
    if enc.nbytes <= SEGMENT_BYTES:  # one batch: no segmenting to do
        sendmsg_all(sock, enc.frames(), deadline, enc.nbytes)
        return
    for batch in enc.segments():
        sendmsg_all(sock, batch, deadline)


def send_before_close(sock: socket.socket, enc: EncodedMessage, deadline: float | None) -> None:
    """Send a control message on a connection about to close, if it can go by ``deadline``."""
    with contextlib.suppress(OSError):  # lost, or too slow: the connection closes anyway
        send_encoded(sock, enc, deadline)
