"""``amqp://user:pass@host:port/vhost?prefix=NAME&chunk=BYTES``: tensorwire over RabbitMQ (pika)
(``amqps://``, or ``tls=``: over TLS to the broker, port 5671 by default).

``docs/transports/amqp.md`` specifies the mapping. Names, all under the hub's ``prefix`` (from
the URL, else random; :attr:`AmqpHub.url` carries it), so hubs sharing a broker never meet:

- ``PREFIX.up``: the uplink, a durable queue the hub consumes exclusively and every client
  publishes its hello, data and bye to (through the default exchange);
- ``PREFIX.c.CLIENT.TAG``: a durable queue per client session (``TAG``: 8 random hex digits),
  declared and consumed by the client before its hello, so nothing the hub sends after the
  hello is lost; the hub sends its welcome, refuse, bye and unicast data to it by name;
- ``PREFIX.all``: a durable fanout exchange; the hub binds a client's queue to it when it
  accepts the hello, so a broadcast to all members is one publish.

Every AMQP message is one chunk (``tensorwire.wire.iter_chunks``) carrying at most ``chunk``
bytes of its message, persistent, ``mandatory`` and confirmed, with its sender's client id (the
hub's: ``hub``) in the ``tw-client`` header; a send returns once the broker has every chunk on
disk, and a chunk no queue takes raises ``PeerGone``. The session (``docs/session.md``) runs on
:class:`HubSession` and :class:`ClientSession`; the hello names the client's queue (``queue``),
the client's bye its session (``session``), so a stale or forged bye cannot end a session.

Hostile input: the hub reads a sender that has not completed its hello only as one chunk of at
most 64 KiB (a hello); a client takes only chunks headed ``tw-client: hub``, and session
messages only through its own queue, never through the fanout exchange anyone can publish to.
Everything else is dropped, logged at most once per 10 s per kind, and never reaches ``recv``.
A repeated message id (a chunk published again after a lost confirm, a delivery the broker
repeats after a reconnect) is delivered once.

Security: TLS protects each link to the broker, the broker's users admit the links, and the
session's hello proves the device's secret to the hub (a refusal names the session it refuses).
Any other user of the broker can still publish to these queues, so a session with a key seals
every body after the welcome with a MAC trailer (``security.seal``; one entry per member on a
broadcast, which stays one publish) that the receiver checks before it reassembles anything;
the broker's redelivery (``redelivered``, which no other user can set) of a body already taken
is a duplicate, any other repeat a replay. A client that asks again after a reconnect seals
its hello; if the hub no longer has its session (the hello's nonce is spent), it asks in a new
session, with a new hello.

Broker faults: each side reconnects by itself with backoff, re-declares what it uses and
publishes again every chunk whose confirm did not come; the durable queues keep what they
held. The hub keeps its members through an outage (events ``medium-lost`` / ``medium-back``);
a member counts as gone once its queue has had no consumer for :data:`LEAVE_GRACE` seconds
of the hub's connected time, and the hub as gone for a client once its uplink has had none for
:data:`HUB_GRACE` seconds. A client says hello again (same session) after each reconnect,
so a hub that lost track of it takes it back.

Other query parameters go to pika (``heartbeat``, ``socket_timeout``, ``stack_timeout``,
``blocked_connection_timeout``, ...; not ``ssl_options``: TLS is ``tls=``), and an unknown one
raises. Three have tensorwire defaults where the URL gives none,
sized for lossy links, on which TCP's retransmission backoff (its timer doubles per loss, up
to 120 s) silences a connection for a minute or more:

- ``heartbeat`` :data:`HEARTBEAT` s. Both sides send one every heartbeat / 2 s; pika drops a
  connection that received nothing in a window of heartbeat + 5 s (so after 185..370 s of
  silence), the broker one that sent it nothing for 2..3 x heartbeat (360..540 s). A
  heartbeat may thus arrive ~95 s late. RabbitMQ's 60 s allows ~35 s, and at 20 % loss one
  arrived ~58 s late (a 118 s silence with heartbeat 120 s).
- ``socket_timeout`` :data:`CONNECT_TIMEOUT` s for the TCP connect (SYN retries).
- ``stack_timeout`` :data:`HANDSHAKE_TIMEOUT` s for connect and AMQP handshake together.

An attempt to connect never runs past the caller's deadline; failed ones are retried until it.
The broker has timeouts of its own: RabbitMQ closes a connection it could not send to for
30 s (``tcp_listen_options.send_timeout``), which on a lossy link drops a client that is
receiving a big message, and allows 10 s for a handshake (``handshake_timeout``). The private
broker (:class:`tensorwire.transports.brokers.RabbitMQBroker`) raises both; raise them on a
broker of your own too.

Threads: pika connections are not thread-safe, so each endpoint has two. A consumer
connection belongs to one thread that consumes, answers session messages and does the
bookkeeping; a publisher connection is shared under a lock, so a big send never stalls
receiving and user threads publish without handing buffers to another thread.
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
