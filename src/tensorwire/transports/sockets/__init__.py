"""The socket I/O kit the stream transports share (one idea per file).

- ``binding``: the error for a hub that cannot listen, with what to do.
- ``waker``: a socketpair that wakes a thread waiting in ``poll``.
- ``waiting``: ``poll`` with a deadline.
- ``tuning``: a connected stream socket's settings, and its quiet end.
- ``listener``: the accept thread, a thread per connection once it speaks, the flood guards.
- ``waiting_room``: connections that have not spoken yet, bounded, the oldest pushed out.
- ``dialling``: one connection to a hub, tuned and secured when asked.
- ``sendmsg``: scatter-gather sends on a blocking socket with a per-call deadline.
- ``tls_stream``: TLS 1.3, then AES-128-OCB3 records (``docs/transports/tcp.md``).
- ``sending``: an encoded message over a stream socket.
- ``reader``: messages from a stream socket, in place when large, woken by a waker.
"""

from tensorwire.transports.sockets.binding import cannot_serve, tcp_bind_problem
from tensorwire.transports.sockets.dialling import connect_stream
from tensorwire.transports.sockets.listener import (
    MAX_HANDSHAKES,
    MAX_SILENT,
    MAX_SILENT_PER_SOURCE,
    Listener,
)
from tensorwire.transports.sockets.reader import ReadInterrupted, StreamReader
from tensorwire.transports.sockets.sending import send_before_close, send_encoded
from tensorwire.transports.sockets.sendmsg import sendmsg_all
from tensorwire.transports.sockets.tls_stream import TlsStream, tls_error, wrap_tls
from tensorwire.transports.sockets.tuning import shutdown, tune
from tensorwire.transports.sockets.waiting import poller, wait_ready
from tensorwire.transports.sockets.waiting_room import WaitingRoom
from tensorwire.transports.sockets.waker import WAKE_BYTES, drain, wake, waker

__all__ = [
    "MAX_HANDSHAKES",
    "MAX_SILENT",
    "MAX_SILENT_PER_SOURCE",
    "WAKE_BYTES",
    "Listener",
    "ReadInterrupted",
    "StreamReader",
    "TlsStream",
    "WaitingRoom",
    "cannot_serve",
    "connect_stream",
    "drain",
    "poller",
    "send_before_close",
    "send_encoded",
    "sendmsg_all",
    "shutdown",
    "tcp_bind_problem",
    "tls_error",
    "tune",
    "wait_ready",
    "wake",
    "waker",
    "wrap_tls",
]
