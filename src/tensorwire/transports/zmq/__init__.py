"""``zmq+tcp://host:port``: a ZeroMQ ROUTER on the hub, a DEALER per client session.

``docs/transports/zmq.md`` specifies what goes over the wire; in short:

Session. The client's first tensorwire message is its ``hello``, the hub answers ``welcome``
(or ``refuse``), ``bye`` ends the session (:mod:`~tensorwire.transports.session`). The
DEALER's ZeroMQ routing id is the hello's ``session``: 32 random hex digits, new for every
connection. The hub addresses a client only by the routing id its hello came on, refuses a
hello whose ``session`` is not that routing id, and leaves ``ROUTER_HANDOVER`` off, so a peer
that connects with a routing id already in use is never routed to: nobody can take over a
client's messages without guessing its session id, and not even then while it is connected.

Framing. A tensorwire message travels as a run of ZeroMQ messages ("pieces") of at most
``PIECE_BYTES`` of payload each, its bytes (head, tensor data, digests) in order after a
one-byte marker: ``S`` starts a tensorwire message, ``C`` continues it. Buffers from 64 KiB up
are frames of their own, sent zero-copy; runs of smaller ones are joined into one frame (pyzmq
would copy them anyway), the marker into the first, so a small message is one frame.

Not one multipart per message: libzmq passes a multipart on only once its last part is queued,
so the sender's hashing, the wire and the receiver's copy would run one after the other; in
pieces they overlap (64 MiB: ~60 ms in pieces, ~130 ms as one multipart, ~100 ms for pyzmq's
own send/recv of the bare array, in one prototype run). The receiver copies each piece into
the tensor it belongs to, never joining frames (the one copy pyzmq's users make too), and
libzmq's 1 MiB receive buffers are reused where a whole-message buffer would be page-faulted
in anew each time. The marker lets a receiver drop a bad message and resume at the next ``S``:
garbage, or a send cut short by its deadline, spoils one message, never the connection.

Flow control. Every socket queues at most ``QUEUE_PIECES`` pieces per peer each way (high-water
marks), so a peer that stops reading costs at most that much memory. A send queues the pieces
it can without blocking; when a client's queue is full it retries until its deadline, then
raises :class:`TransportTimeout` (a ``slow`` client), never reporting a message it could not
queue as sent. Broadcast is a ROUTER send of the same zero-copy frames to each client, round
robin so a full queue holds up only its own client; not PUB: libzmq writes every connection
from its I/O thread either way (measured alike for 8 clients x 16 MiB), and a ROUTER keeps
each client's messages in one ordered stream and needs no subscription handshake.

Threads. ZeroMQ sockets are not thread-safe. The hub's ROUTER is guarded by a lock: a send
runs in the calling thread (no hand-off to another thread). Reading is a turn: a thread in
``hub.recv`` reads the ROUTER itself and returns the first message it completes, so a message
is not handed from a reader thread to the caller; while nobody is in ``recv`` (and for
``CALLER_LINGER_S`` after, so that back-to-back calls find the ROUTER free) the hub's reader
thread reads, so joins, leaves and ``gather`` are served. Whoever reads takes the lock only to
read, and waits outside it in one ``poll`` on the ROUTER's ``ZMQ_FD``, the monitor's and a
wake-up socketpair. ``ZMQ_FD`` is edge-triggered: it is waited on only after ``ZMQ_EVENTS``
found the socket empty (no ``zmq.Again`` raised per message), and a send that may have taken
its edge while a reader waits wakes it. The hub learns of lost connections from a socket
monitor (``DISCONNECTED`` names the file descriptor; ``ZMQ_SRCFD`` of the hello ties it to a
session). libzmq queues a connection's last messages on the ROUTER before it reports the
connection closed, so a client leaves only once a read that began after its ``DISCONNECTED``
found the ROUTER empty: what it sent just before closing is delivered first. A channel's
DEALER is used by whichever thread calls ``send``/``recv``, one at a time: a thread that needs
it while a ``recv`` waits in ``poll`` wakes that ``recv`` through a socketpair, so a channel
used from one thread pays no hand-off either. A process's channels share one ZeroMQ context
of tensorwire's own (``context.py``: one libzmq I/O thread and a reaper for all), and a
channel's close waits until libzmq has destroyed its socket (``docs/transports/zmq.md``
section 12: libzmq 4.3.5 can abort when a connection fails while a closed socket's session
is ending mid-message). pyzmq's zero-copy
collector is started once per process, under a lock, before its first zero-copy send:
started by pyzmq in many threads' first sends at once, it can hang every tracked send of
the process (``collector.py``).

Small messages. A message under pyzmq's copy threshold (64 KiB) is one frame, joined once and
copied into libzmq's message: a zero-copy frame would cost a tracker and a trip through
pyzmq's garbage-collector thread when libzmq releases it. Round trips then make about the
system calls pyzmq's own ``send``/``recv`` make (libzmq's ``getpid`` and ``poll`` on its
mailbox), plus the one ``poll`` above; ``docs/transports/zmq.md`` section 11 gives figures.

Security. With ``tls=`` (or ``curve=``) the connection is encrypted with ZeroMQ's CURVE: the
hub's key pair comes from ``curve=`` (default ``hub.curve`` beside ``tls.cert``), a client
knows the hub's public key (default ``hub.curve.pub`` beside ``tls.ca``) and uses a fresh key
pair of its own per connection. ZeroMQ has no X.509, so identity is the hello's proof of the
device's enrolled secret (``auth=`` keys on the hub, ``key=`` on the client); a hub told to
check client certificates (``ca=``) without keys is refused at ``serve``, since it could not.
The socket monitors report failed handshakes: mismatched encryption is an
:class:`AuthenticationError` on the client, at once, and a ``refused`` event on the hub. A
message that does not open after the handshake (altered on the way) makes libzmq stop reading
the connection without closing it: the channel treats it as lost; the hub cannot tell which
connection it was, and its heartbeats close it.
"""

from tensorwire.transports.zmq.channel import ZmqChannel
from tensorwire.transports.zmq.hub import ZmqHub
from tensorwire.transports.zmq.options import ZmqChannelOptions, ZmqHubOptions

__all__ = ["ZmqChannel", "ZmqChannelOptions", "ZmqHub", "ZmqHubOptions"]
