"""``udp://host:port?mode=reliable|best-effort&mtu=1472&rate=5mbit&buffer=64mb``.

Data travels as datagrams, one chunk of the encoded message each (``iter_chunks``: a
40-byte header with message id, index, count, offset and total length, then at most
``mtu - 40`` message bytes), paced by a token bucket when ``rate`` (bits/s) is given.

The session (hello with the client's ``udp_port`` -> welcome with the hub's ``mode`` |
refuse, bye) and the ``sent`` / ``ack`` / ``nack`` / ``drop`` control messages go over one
TCP control connection per client, to the same port number as the hub's UDP socket. TCP was
chosen over control datagrams with retries because it gives for free what the control
messages need: delivery and order (a NACK or ack is never lost, so no retry timers), a peer
that vanishes is noticed when its connection drops, and its kernel measures the RTT the
best-effort timers are derived from. ``docs/transports/udp.md`` specifies all of it.

Modes (the hub's applies to the whole session; see ``flow.py``, ``sending.py`` and
``receiving.py``):

- ``reliable`` (default): selective NACK and resend until the receiver has every chunk;
  the message arrives bit-exact.
- ``best-effort``: nothing is resent; the receiver decodes what arrived
  (``tensorwire.wire.partial.decode_partial``) into the previous message's arrays, so a
  lost range keeps the last round's values, and ``msg.loss`` gives the lost fraction per
  tensor. A message whose header or half whose bytes were lost is lost.

``mtu`` defaults to 1472 (an Ethernet path); on loopback ``mtu=65000`` is much faster.
``buffer`` is the kernel socket buffer asked for (bytes; beyond ``net.core.rmem_max`` with
CAP_NET_ADMIN only).

With ``tls=`` (and ``auth=`` keys on the hub, ``key=`` on the client) only enrolled clients
join, the control connection runs TLS 1.3 and every datagram is sealed with AES-256-GCM under a key
agreed on it (``secure.py``; ``docs/transports/udp.md`` section 13).
"""

from tensorwire.transports.udp.channel import UdpChannel
from tensorwire.transports.udp.hub import UdpHub

__all__ = ["UdpChannel", "UdpHub"]
