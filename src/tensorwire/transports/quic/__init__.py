"""``quic://host:port``: QUIC (RFC 9000, with ``aioquic``), one stream per message.

QUIC brings TLS 1.3, its own loss recovery and congestion control, and streams that do not
block each other: a message lost in part holds up only its own stream's bytes. Each message
travels on a fresh unidirectional stream (so no stream ever nears the 2^62 offset limit, and a
send that times out resets its stream and leaves the connection usable); the receiver delivers
whole messages in the order their streams were opened, which is the order they were sent.

The session (``docs/session.md``) maps onto streams directly: the client's first stream carries
its ``hello``, the hub answers ``welcome`` (or ``refuse``) on its first stream, and so on.
What each end presents and checks (a throwaway certificate without credentials, mutual TLS
with a CA on the hub) is in ``tls.py``.

All of a hub's connections share one UDP socket and one I/O thread (``engine.py``); so do
all of a process's channels to one hub (``endpoint.py``). That thread runs ``aioquic``'s
sans-IO connection: it reads every datagram that is waiting, feeds them in, then sends what
the connections have to send (reading again every few datagrams sent), and wakes for the
connections' timers (loss detection, acknowledgements, pacing) with sub-millisecond
precision.
``connection.py`` keeps one connection's streams in order; ``compat.py`` holds the few
internals of aioquic 1.7 this package reaches into. ``docs/transports/quic.md`` has the
options and the numbers.
"""

from tensorwire.transports.quic.channel import QuicChannel
from tensorwire.transports.quic.hub import QuicHub

__all__ = ["QuicChannel", "QuicHub"]
