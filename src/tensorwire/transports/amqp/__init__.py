"""``amqp://user:pass@host:port/vhost?prefix=NAME&chunk=BYTES``: tensorwire over RabbitMQ (pika)
(``amqps://``, or ``tls=``: over TLS to the broker, port 5671 by default).
``docs/transports/amqp.md`` specifies it.

Under the hub's ``prefix`` (from the URL, else random: :attr:`AmqpHub.url` carries it):
``PREFIX.up``, the uplink the hub consumes exclusively and every client publishes to;
``PREFIX.c.CLIENT.TAG``, a durable queue per client session, consumed by the client before its
hello, which the hub answers and unicasts to; ``PREFIX.all``, the fanout exchange members'
queues are bound to, so a broadcast is one publish. Every AMQP message is one chunk of at most
``chunk`` bytes, persistent, mandatory and confirmed, headed ``tw-client`` with its sender. With
a key, every body after the welcome is sealed end to end; the broker's ``redelivered`` marks a
duplicate, any other repeat is a replay. Each side reconnects by itself, re-declares what it uses
and publishes again what was not confirmed; a member is gone once its queue has had no consumer
for :data:`LEAVE_GRACE` seconds of connected time, the hub once the uplink had none for
:data:`HUB_GRACE`. Other query parameters go to pika (``heartbeat``, ``socket_timeout``,
``stack_timeout`` ..., with defaults sized for lossy links); an unknown one raises.

Each endpoint holds one broker connection (a device costs the broker one), owned by one thread
since pika's are not thread-safe: the hub's has a thread of its own, the devices of a process
share one I/O thread. Files: ``settings`` (URL, options, timing), ``connection`` (reaching
RabbitMQ; ``BrokerFull`` at its connection limit), ``control`` (session messages), ``consumer``
(the hub's connection and its thread, which runs the others' publishes too), ``ioloop`` (the
devices' one I/O thread), ``link`` (a device's connection on it), ``publisher`` (confirmed
chunks, from any thread), ``hub``, ``channel``; sealing, reassembly, the medium and graces are
``transports.broker``'s.
"""

from tensorwire.transports.amqp.channel import AmqpChannel, AmqpsChannel
from tensorwire.transports.amqp.hub import AmqpHub, AmqpsHub
from tensorwire.transports.amqp.settings import (
    CONNECT_TIMEOUT,
    DEFAULT_CHUNK,
    DEFAULT_TLS_PORT,
    HANDSHAKE_TIMEOUT,
    HEARTBEAT,
    AmqpAddress,
)

__all__ = [
    "CONNECT_TIMEOUT",
    "DEFAULT_CHUNK",
    "DEFAULT_TLS_PORT",
    "HANDSHAKE_TIMEOUT",
    "HEARTBEAT",
    "AmqpAddress",
    "AmqpChannel",
    "AmqpHub",
    "AmqpsChannel",
    "AmqpsHub",
]
