"""The socket reader under the tcp transport and the collectives: a socket another thread
closed ends a read as PeerGone, not as a stray ValueError in a reader thread."""

from __future__ import annotations

import socket

import pytest

from tensorwire.errors import PeerGone
from tensorwire.transports.sockets.reader import StreamReader
from tensorwire.wire import Limits, MessageStream


def test_a_read_on_a_socket_closed_by_another_thread_is_peer_gone():
    ours, theirs = socket.socketpair()
    wake_r, wake_w = socket.socketpair()
    wake_r.setblocking(False)
    try:
        reader = StreamReader(ours, MessageStream(limits=Limits()))
        ours.close()  # as a closing thread does while the reader is about to wait
        with pytest.raises(PeerGone, match="closed"):
            reader.read_message(None, wake=wake_r)
    finally:
        for s in (theirs, wake_r, wake_w):
            s.close()
