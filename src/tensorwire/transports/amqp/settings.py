"""What an ``amqp://`` URL names (pika's connection parameters, the hub's prefix, the chunk size,
TLS), and the timing of the session on RabbitMQ."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import pika

from tensorwire.errors import TransportError
from tensorwire.transports.base import ChannelOptions, HubOptions
from tensorwire.transports.broker.room import parse_connection_max
from tensorwire.transports.security import TLS
from tensorwire.transports.session import HELLO_LIMITS
from tensorwire.transports.url import query_options, redacted
from tensorwire.wire import CHUNK_HEADER_SIZE

DEFAULT_TLS_PORT = 5671  # amqps://, or tls= without a port in the URL
BROKER_MAX_MESSAGE = 128 << 20  # bytes: RabbitMQ's default max_message_size
DEFAULT_CHUNK = 4 << 20  # bytes per AMQP message: 1..8 MiB tie on loopback, 32+ MiB are slower
MIN_CHUNK = 1 << 10  # bytes
CONTROL_CHUNK = HELLO_LIMITS.max_message_bytes  # bytes: session messages always go as one chunk
HUB = "hub"  # the tw-client header of the hub's messages
# Seconds a chunked message may go without a new chunk. Confirmed publishes lose no chunk, but
# at 20 % loss TCP backoff makes one 2.3 MB message take up to 207 s, so a 4 MiB chunk can take
# far more than 60 s. Longer than a silent connection lives (see HEARTBEAT): this only bounds
# the memory of a sender that vanished mid-message.
REASSEMBLY_TIMEOUT = 600.0
PREFETCH = 16  # chunks a consumer may hold unacknowledged
QUEUE_EXPIRES_MS = 600_000  # a queue nobody consumed for this long is deleted by the broker
BYE_TIMEOUT = 2.0  # seconds spent saying goodbye (and cleaning up) before closing anyway
RECONNECT_TIMEOUT = 60.0  # seconds a send without a timeout waits for a lost broker
OUTAGE_LIMIT = 600.0  # seconds without the broker before a channel gives up, a hub's members go
LEAVE_GRACE = 10.0  # seconds a member's queue may go unconsumed (it is reconnecting) on the hub
LIVENESS_PROBES = 64  # members' queues the hub looks at per liveness check (each a round trip)
HUB_GRACE = 30.0  # seconds the uplink may go unconsumed (the hub is reconnecting), for a client
# seconds between a client's looks at the uplink: each is a round trip to the broker, so 2,000
# clients looking every 2 s kept it (and themselves) busy with 1,000 a second (issue #27)
HUB_CHECK = 10.0
HELLO_RETRY = 2.0  # seconds to wait for a welcome before saying hello again
HELLO_RETRY_MAX = 16.0  # seconds: the wait doubles after each hello an existing hub left unanswered
TICK = 0.5  # seconds between the consumer thread's bookkeeping rounds, unless it says otherwise
MAX_TICK = HUB_CHECK  # seconds: the longest a consumer thread sleeps without a reason to wake
HEARTBEAT = 180  # seconds: tolerates a heartbeat ~95 s late (see the package's docstring)
CONNECT_TIMEOUT = 30.0  # seconds for a TCP connect: SYN retries at 1, 3, 7, 15 s fit
HANDSHAKE_TIMEOUT = 60.0  # seconds for connect + AMQP handshake (pika's 15 s fails at 20 % loss)
_PIKA_DEFAULTS = {
    "heartbeat": HEARTBEAT,
    "socket_timeout": CONNECT_TIMEOUT,
    "stack_timeout": HANDSHAKE_TIMEOUT,
}
MAX_NAME = 255  # bytes: AMQP short strings (queue and exchange names)
_OUR_QUERY = ("prefix", "chunk", "connection_max", "persistent")
# pika's URL options, but ssl_options: TLS is tensorwire's tls= (or amqps://, ?tls=1&ca=...)
_PIKA_QUERY = tuple(
    sorted(
        name.removeprefix("_set_url_")
        for name in dir(pika.URLParameters)
        if name.startswith("_set_url_") and name != "_set_url_ssl_options"
    )
)


@dataclass(frozen=True, kw_only=True)
class AmqpHubOptions(HubOptions):
    """What ``serve("amqp://...")`` takes; ``timeouts.connect`` bounds reaching the broker."""

    chunk: int | None = None
    """Most bytes per AMQP message (default: ``?chunk=``, else :data:`DEFAULT_CHUNK`)."""
    liveness: float = 1.0
    """Seconds between checks that each member's queue still has a consumer."""


@dataclass(frozen=True, kw_only=True)
class AmqpChannelOptions(ChannelOptions):
    """What ``connect("amqp://...")`` takes."""

    chunk: int | None = None
    """Most bytes per AMQP message (default: ``?chunk=``, else :data:`DEFAULT_CHUNK`)."""


class AmqpAddress:
    """An ``amqp://`` or ``amqps://`` URL split into pika's connection parameters and
    tensorwire's options.

    ``prefix`` names the hub's queues and exchange (``None``: the hub picks one); ``chunk`` is
    the most bytes per AMQP message (``None``: :data:`DEFAULT_CHUNK`); ``connection_max`` the
    most connections the broker takes (``None``: not known; a private broker's URL says).
    :attr:`params` has tensorwire's ``heartbeat``, ``socket_timeout`` and ``stack_timeout``
    unless the URL sets them.
    ``persistent`` (``?persistent=0``: False) says whether data messages are kept on the
    broker's disk until consumed (AMQP delivery mode 2, the default) or in its memory only
    (mode 1: a broker restart loses what its queues held, at about half its CPU; see
    ``docs/transports/amqp.md``); a hub hands its choice to its clients in :attr:`url`.
    ``tls`` (or an ``amqps://`` URL, with the system's CAs) makes the connection TLS: pika's
    ``SSLOptions`` with ``tls.client_context()``, checking the broker's certificate for
    ``tls.server_name`` or the URL's host, on port :data:`DEFAULT_TLS_PORT` unless the URL names
    one. An option that is neither tensorwire's nor pika's raises ``TransportError``.
    """

    def __init__(self, url: str, tls: TLS | None = None) -> None:
        parts = urlsplit(url)
        shown = redacted(url)
        if parts.scheme not in ("amqp", "amqps"):
            raise TransportError(f"{shown!r} is not an amqp:// or amqps:// URL")
        query_options(shown, (*_OUR_QUERY, *_PIKA_QUERY))
        if tls is None and parts.scheme == "amqps":
            tls = TLS()
        self.tls = tls
        query = parse_qsl(parts.query, keep_blank_values=True)
        ours = {k: v for k, v in query if k in _OUR_QUERY}
        self.base = urlunsplit(
            parts._replace(query=urlencode([q for q in query if q[0] not in ours]))
        )
        try:  # TLS is set below, from tls: pika's own would take the system's CAs only
            self.params = pika.URLParameters(
                urlunsplit(urlsplit(self.base)._replace(scheme="amqp"))
            )
        except ValueError as exc:
            raise TransportError(f"{shown!r}: {exc}") from None
        given = {k for k, _ in query}
        for name, value in _PIKA_DEFAULTS.items():
            if name not in given:
                setattr(self.params, name, value)
        if tls is not None:
            if parts.port is None:
                self.params.port = DEFAULT_TLS_PORT
            try:
                context = tls.client_context()
            except (OSError, ValueError) as exc:  # a missing or unreadable certificate file
                raise TransportError(f"the TLS settings for {shown!r}: {exc}") from None
            self.params.ssl_options = pika.SSLOptions(context, tls.server_name or self.params.host)
        self.prefix = ours.get("prefix") or None
        if self.prefix is not None and (
            self.prefix.startswith("amq.") or len(self.prefix.encode()) > MAX_NAME - 64
        ):
            raise TransportError(
                f"prefix {self.prefix!r}: must not start with 'amq.' (reserved by AMQP) and must "
                f"be at most {MAX_NAME - 64} bytes"
            )
        self.chunk = parse_chunk_size(ours["chunk"]) if "chunk" in ours else None
        self.connection_max = parse_connection_max(shown, ours.get("connection_max"))
        self.persistent = parse_persistent(shown, ours.get("persistent", "1"))

    def url_with(self, prefix: str, chunk: int | None) -> str:
        """The URL again, with ``prefix`` (and ``chunk`` if set) for clients to connect to."""
        parts = urlsplit(self.base)
        query = [*parse_qsl(parts.query, keep_blank_values=True), ("prefix", prefix)]
        if chunk is not None:
            query.append(("chunk", str(chunk)))
        if self.connection_max is not None:
            query.append(("connection_max", str(self.connection_max)))
        if not self.persistent:
            query.append(("persistent", "0"))
        return urlunsplit(parts._replace(query=urlencode(query)))

    @property
    def where(self) -> str:
        over = " over TLS" if self.tls is not None else ""
        return f"{self.params.host}:{self.params.port} (vhost {self.params.virtual_host!r}){over}"


def parse_persistent(shown: str, text: str) -> bool:
    """``persistent=``: 1 (the broker keeps data messages on disk) or 0 (in memory only)."""
    if text not in ("0", "1"):
        raise TransportError(f"{shown!r}: persistent={text!r}: give 1 (on disk) or 0 (in memory)")
    return text == "1"


def parse_chunk_size(text: str | int) -> int:
    """``chunk=``: the most bytes per AMQP message, checked."""
    try:
        chunk = int(text)
    except ValueError:
        raise TransportError(f"chunk={text!r}: give the most bytes per AMQP message") from None
    most = BROKER_MAX_MESSAGE - CHUNK_HEADER_SIZE  # a body is the chunk and its header
    if not MIN_CHUNK <= chunk <= most:
        raise TransportError(
            f"chunk={chunk}: must be {MIN_CHUNK}..{most} bytes (and the body, 40 bytes more, "
            "under the broker's max_message_size)"
        )
    return chunk
