"""``tcp://host:port``: one TCP connection per client, messages back to back on it.

With ``tls=tensorwire.TLS(...)`` the connection opens with a TLS 1.3 handshake (``ssl``), mutual
when the hub's settings name a CA (the certificate's name is then checked against the hello's
client id), and then carries AES-128-OCB3 records under keys agreed inside TLS
(``docs/transports/tcp.md``).

The session (``docs/session.md``) maps onto the connection directly: the client's first
message is its ``hello``, the hub answers ``welcome`` (or ``refuse`` and closes); then both
send ``data`` messages, and ``bye`` before closing. The socket I/O is the shared kit's
(:mod:`~tensorwire.transports.sockets`); ``hub.py`` says how the hub's threads take turns
reading a connection.
"""

from tensorwire.transports.tcp.channel import TcpChannel
from tensorwire.transports.tcp.hub import TcpHub
from tensorwire.transports.tcp.options import TcpHubOptions

__all__ = ["TcpChannel", "TcpHub", "TcpHubOptions"]
