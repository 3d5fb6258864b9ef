"""``flight://host:port``: Arrow Flight over gRPC, a session of two ``DoExchange`` calls.

``docs/transports/flight.md`` specifies the layout; in short, a client opens two calls on one
gRPC connection, each written by one side only:

- downlink, a descriptor of type CMD whose command is the client's ``hello``: the hub
  answers ``welcome`` (or ``refuse``) once the uplink is attached, then writes every message
  for the client;
- uplink, path ``tensorwire/up/<session>`` (the hello's ``session``): the client writes its
  messages, then ``bye``.

Why two calls: pyarrow's client finishes a call from its reader when the stream ends,
sending a half-close that can race a write in progress in another thread, which gRPC aborts
the process for (``GRPC_CALL_ERROR_TOO_MANY_OPERATIONS``). With each call written by one
side only, nothing races. The uplink is an exchange rather than a ``DoPut`` because only an
exchange's reader can cancel its call, which a send's deadline and
:meth:`FlightChannel._drop` need. The hello rides in the descriptor, which Flight reads
before it calls the hub, so no hub thread ever waits for a stranger to speak. The session
ends when either call does, as a TCP connection would; a ``bye`` goes down whenever the hub
ends it.

Control messages (``welcome``/``refuse``/``bye``, whole wire messages) travel in the
``app_metadata`` of a FlightData without a batch, so each side acts on them at once. A data
message travels as record batches of one binary column (:data:`SCHEMA`), one value each, in
order: each tensor's buffer is its own batch(es), wrapped by ``pa.py_buffer`` (no copy;
Flight hands it to gRPC as is), with small neighbours (header, digests, small tensors)
joined. No batch holds more than ``batch_bytes`` (4 MiB), far under gRPC's 2 GiB per
message, so any message size goes. The receiver feeds each value (a view of the received
Arrow buffer) to a :class:`~tensorwire.wire.MessageStream`, which copies the tensor bytes
once, straight into the output arrays (``recv(out=...)``).

With ``tls=tensorwire.TLS(...)`` (or the URL options ``?tls=1``, ``?ca=`` ...) both calls run
over gRPC's TLS (``grpc+tls``), mutual when the hub's settings name a CA; the hub then takes
the client certificate's name from gRPC (the call's ``peer_identities()``) and checks it
against the hello's client id. ``key=`` / ``auth=`` add the session's secret proof
(``docs/security.md``).

The channel is pyarrow's Flight client. The hub is not pyarrow's Flight server (gRPC's
synchronous server, a thread per call for as long as the call lasts: two per session, which
ran away to tens of thousands under load at 2,000 devices) but gRPC's asyncio server serving
Flight's ``DoExchange``: every call is a coroutine on one event loop, and the hub reads and
writes FlightData itself (``frames.py``), the same bytes on the wire.

The pieces: ``options.py`` (constants, where a hub listens), ``batches.py`` (messages as record
batches and back), ``frames.py`` (FlightData and record-batch headers, as the hub parses and
builds them), ``tls.py`` (gRPC's TLS), ``server.py`` (the hub's gRPC server and its loop
thread), ``peer.py`` (a hub's state per session), ``pairing.py`` (a session's two calls
meeting, bounded), ``hub.py``, ``watchdog.py`` (a send's deadline) and ``channel.py``.
"""

from tensorwire.transports.flight.channel import FlightChannel
from tensorwire.transports.flight.hub import FlightHub
from tensorwire.transports.flight.options import (
    BATCH_BYTES,
    FLIGHT_ERRORS,
    SCHEMA,
    FlightChannelOptions,
    FlightHubOptions,
)

__all__ = [
    "BATCH_BYTES",
    "FLIGHT_ERRORS",
    "SCHEMA",
    "FlightChannel",
    "FlightChannelOptions",
    "FlightHub",
    "FlightHubOptions",
]
