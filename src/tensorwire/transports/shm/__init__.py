"""``shm://name``: messages between processes of one host through shared memory, one copy.

``docs/transports/shm.md`` specifies the layout. Control: a Unix ``SOCK_SEQPACKET`` socket at
the abstract address ``\\0tensorwire-<name>`` (nothing on the file system to leak; the name
vanishes with the hub's socket, even after a ``kill -9``). Each packet is one tensorwire
message: the session's ``hello`` / ``welcome`` / ``refuse`` / ``bye`` (``docs/session.md``);
``data``, a message of at most :data:`INLINE_BYTES` carried in the packet itself; ``shm``
(meta ``seg``, ``offset``, ``nbytes``), a bigger message that lies in shared segment ``seg``;
``release`` (receiver to sender: segment ``seg`` is free again) and ``drop`` (sender to
receiver: segment ``seg`` is retired, forget it). Packets keep their boundaries, so a bad one
costs only itself, and a send that times out leaves nothing half-sent.

Data: a segment is a memfd the sender creates, allocates whole, seals against shrinking and
growing, maps, and passes to each receiver once, with ``SCM_RIGHTS`` on the packet that first
names it. A memfd has no name, so no process can leak one (it is freed when the last mapping
goes); the seal means no peer can truncate it under a reader's mapping (a SIGBUS), and a
receiver refuses a sparse one, whose pages reading would allocate on the receiver's account.
The sender writes the encoded message straight into the segment, hashing each piece on the
way: the one copy. The receiver decodes raw tensors as views of the segment: no copy. A
broadcast writes one segment that every client maps.

Ownership: a received message's raw tensors are views of shared memory the sender does not
touch until the receiver releases it, and the receiver releases it when the last of those
arrays is garbage-collected. The data never changes under you, whatever you keep, for as
long as you keep it. The cost: while one receiver holds ``max_segments`` messages from a
sender, that sender waits (up to its send timeout) before it sends that receiver another big
one (a broadcast goes to the others at once). To keep a message for long, copy it
(``arr.copy()``) or receive into your own arrays with ``recv(out=...)`` (a second copy; the
segment is released at once).

Only processes of the same user (or root) may connect, unless ``trust_other_users=True``:
a peer keeps write access to the segments it sends, which over ``tcp://`` it would not have.
Linux only (memfd, abstract sockets), and abstract sockets are per network namespace.

Security: nothing leaves the host, so there is nothing to encrypt and ``tls=`` is accepted
and not used. The peer's uid (``SO_PEERCRED``) is checked on both sides; with ``auth=`` keys
(hub) and ``key=`` (client) the hello proves the client's enrolled secret and the welcome the
hub's (``docs/security.md``). A hub asked for client certificates (``tls`` naming a CA) with
no keys refuses to start: it could not check them, and would admit anyone.

The pieces: ``options.py`` (constants, the URL), ``connection.py`` (the control socket and its
packets), ``segments.py`` and ``outbox.py`` (the sending side's memory), ``mappings.py`` and
``releaser.py`` (the receiving side's), ``hub.py`` and ``channel.py``.
"""

from tensorwire.transports.shm.channel import ShmChannel
from tensorwire.transports.shm.hub import ShmHub
from tensorwire.transports.shm.options import INLINE_BYTES, ShmChannelOptions, ShmHubOptions
from tensorwire.transports.shm.segments import BadSegment

__all__ = [
    "INLINE_BYTES",
    "BadSegment",
    "ShmChannel",
    "ShmChannelOptions",
    "ShmHub",
    "ShmHubOptions",
]
