"""What an ``mqtt://`` URL names (broker, credentials, topic prefix, QoS, chunk size, TLS), the
topics under the prefix, and the timing of the session on them."""

from __future__ import annotations

from dataclasses import dataclass, field
from urllib.parse import unquote, urlsplit

from tensorwire.errors import TransportError
from tensorwire.transports.base import ChannelOptions, HubOptions, Timeouts
from tensorwire.transports.broker.room import parse_connection_max
from tensorwire.transports.session import HELLO_LIMITS
from tensorwire.transports.url import host_port, query_options, redacted
from tensorwire.wire import CHUNK_HEADER_SIZE, PREFIX_SIZE

DEFAULT_PORT = 1883
DEFAULT_TLS_PORT = 8883  # mqtts://, or tls= without a port in the URL
DEFAULT_PREFIX = "tensorwire"
# Publish payload size, bytes. Through Mosquitto on loopback, 256 KiB to 4 MiB chunks move a
# 72 MB tensor alike; 16 MiB ones take ~1.5x as long and one 72 MB packet ~4x, because paho
# copies the unsent rest of a packet on every partial socket write.
DEFAULT_CHUNK_BYTES = 1 << 20
# Seconds a chunked message may go without a new chunk before it counts as lost. At QoS 0 a
# chunk can be lost for good, so give up soon. At QoS 1/2 none is lost while the sender is
# connected (and when its connection dies its will says so), but on a lossy link TCP's
# retransmission backoff can stall one connection for tens of seconds: waiting 30 s then
# dropped whole updates at 20 % loss. So wait long; this only bounds a vanished sender's memory.
REASSEMBLY_TIMEOUT_S = {0: 30.0, 1: 600.0, 2: 600.0}
HANDSHAKE_TIMEOUT_S = 10.0  # a chunked message on a topic with no open session, likewise
BYE_TIMEOUT = 1.0  # seconds spent saying goodbye before disconnecting anyway
HELLO_RETRY_S = (0.2, 2.0)  # first and longest wait for a welcome before saying hello again
TICK_S = 0.5  # how often partial messages are expired and graces checked
CONTROL_BYTES = PREFIX_SIZE + HELLO_LIMITS.max_header_bytes + HELLO_LIMITS.max_message_bytes


@dataclass(frozen=True, kw_only=True)
class MqttOptions:
    """How an endpoint publishes, hub and channel alike (each overrides the URL's query)."""

    qos: int | None = None
    """MQTT QoS of every publish and subscription: 0, 1 or 2 (default: ``?qos=``, else 1)."""
    chunk_bytes: int | None = None
    """Most bytes per published payload, chunk header included (default: ``?chunk=``, else
    :data:`DEFAULT_CHUNK_BYTES`)."""


@dataclass(frozen=True, kw_only=True)
class MqttHubOptions(HubOptions, MqttOptions):
    """What ``serve("mqtt://...")`` takes; ``timeouts.connect`` bounds reaching the broker."""

    timeouts: Timeouts = field(default_factory=lambda: Timeouts(connect=10.0))


@dataclass(frozen=True, kw_only=True)
class MqttChannelOptions(ChannelOptions, MqttOptions):
    """What ``connect("mqtt://...")`` takes."""


@dataclass(frozen=True)
class MqttSettings:
    """What an ``mqtt://`` URL names: broker address, credentials, topic prefix, QoS, chunk
    size, whether the connection to the broker runs TLS (``mqtts://``), and the most
    connections the broker lets in, if the URL says (``connection_max=``, as a private
    broker's URLs do)."""

    host: str
    port: int
    username: str | None
    password: str | None
    prefix: str
    qos: int
    chunk_bytes: int  # most bytes per published payload, chunk header included
    tls: bool = False
    connection_max: int | None = None

    @classmethod
    def from_url(
        cls, url: str, qos: int | None = None, chunk_bytes: int | None = None, tls: bool = False
    ) -> MqttSettings:
        """Read ``url``; ``qos`` / ``chunk_bytes``, when given, override its query; ``tls``
        (TLS settings were given) makes an ``mqtt://`` URL's connection TLS too."""
        parts = urlsplit(url)
        url = redacted(url)  # for messages: the password stays out of them
        if parts.scheme not in ("mqtt", "mqtts"):
            raise TransportError(f"{url!r} is not an mqtt:// or mqtts:// URL")
        tls = tls or parts.scheme == "mqtts"
        host, port = host_port(url, default_port=DEFAULT_TLS_PORT if tls else DEFAULT_PORT)
        query = query_options(url, ("qos", "chunk", "connection_max"))
        try:
            qos = int(query.get("qos", 1)) if qos is None else qos
            chunk_bytes = (
                int(query.get("chunk", DEFAULT_CHUNK_BYTES)) if chunk_bytes is None else chunk_bytes
            )
        except ValueError:
            raise TransportError(f"{url!r}: qos and chunk must be integers") from None
        if qos not in (0, 1, 2):
            raise TransportError(f"{url!r}: qos must be 0, 1 or 2, not {qos}")
        if chunk_bytes <= CHUNK_HEADER_SIZE:
            raise TransportError(f"{url!r}: chunk must exceed {CHUNK_HEADER_SIZE} bytes")
        prefix = unquote(parts.path).strip("/") or DEFAULT_PREFIX
        if any(c in prefix for c in "+#\0"):
            raise TransportError(f"{url!r}: the topic prefix may not contain '+', '#' or NUL")
        return cls(
            host=host,
            port=port,
            username=unquote(parts.username) if parts.username is not None else None,
            password=unquote(parts.password) if parts.password is not None else None,
            prefix=prefix,
            qos=qos,
            chunk_bytes=chunk_bytes,
            tls=tls,
            connection_max=parse_connection_max(url, query.get("connection_max")),
        )

    def up(self, client_id: str, session: str) -> str:
        """Client to hub: hello, data, bye and the client's will."""
        return f"{self.prefix}/up/{client_id}/{session}"

    def ctl(self, client_id: str, session: str) -> str:
        """Hub to one session: welcome or refuse."""
        return f"{self.prefix}/ctl/{client_id}/{session}"

    def down(self, client_id: str | None = None, session: str | None = None) -> str:
        """Hub to one session's client; without arguments, the broadcast topic."""
        if client_id is None or session is None:
            return f"{self.prefix}/down"
        return f"{self.prefix}/down/{client_id}/{session}"

    def hub(self, hub_id: str = "+") -> str:
        """The hub's bye and will; ``+`` (the default) is every hub's, for subscribing."""
        return f"{self.prefix}/hub/{hub_id}"


def check_client_id(client_id: str) -> str:
    """``client_id`` if it can be a topic level, else :class:`TransportError`."""
    if not client_id or any(c in client_id for c in "/+#\0"):
        raise TransportError(
            f"client id {client_id!r} cannot be an MQTT topic level: no '/', '+', '#' or NUL"
        )
    return client_id
