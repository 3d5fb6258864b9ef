"""The transport registry: one :class:`TransportEntry` per transport, the only list of them.

Everything that needs to know the transports reads it: :func:`~tensorwire.serve` and
:func:`~tensorwire.connect` (by URL scheme), :func:`~tensorwire.transports.local.local_hub_url`,
the broker probes, ``bench fl`` (its protocols, brokers and URLs), ``bench transfer`` (its
trials and the libraries they are compared with) and the CLI. Adding a transport is its module,
one :func:`register_transport` call (here for the built-in ones) and a conformance module in
``tests/transports/schemes/`` (``docs/adding-a-transport.md``).

Entries name code by dotted path, imported on first use: a missing optional dependency only
matters to the transport that needs it, and then says which extra to install.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping, MutableMapping
from dataclasses import dataclass, field
from typing import Any, Literal

from tensorwire.errors import MissingDependency, UnknownScheme
from tensorwire.plugins import TRANSPORTS, load_group

LOOPBACK = "127.0.0.1"


def load_dotted(path: str, extra: str | None = None, what: str = "") -> Any:
    """The object at dotted ``path`` (``package.module.Name``). An ImportError becomes
    :class:`MissingDependency` naming ``what`` needs it and the extra that installs it."""
    module_name, _, attr = path.rpartition(".")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        hint = f"pip install 'tensorwire[{extra}]'" if extra else "reinstall tensorwire"
        raise MissingDependency(f"{what or module_name} needs {exc.name or exc}: {hint}") from exc
    return getattr(module, attr)


@dataclass(frozen=True)
class BrokerKind:
    """A message broker some transports publish through: how to find, start and probe it.

    Every field but ``name``, ``probe_target`` and ``port`` is the dotted path of a function or
    class in the broker's module (``tensorwire.transports.brokers.<name>``).
    """

    name: str
    """Its name, as :attr:`TransportEntry.broker` and run manifests give it: ``mosquitto``."""
    server: str
    """Class of a private broker: ``Server(port, *, bind=, command_prefix=)`` used as a
    context manager (0: a free port), with ``url(prefix)`` and ``pid``."""
    ensure: str
    """Context manager ``ensure(url)`` yielding ``url`` if a broker answers there, else the
    URL of a private broker that runs until the block ends."""
    answers: str
    """The probe: whether a broker answers at a target (see :attr:`probe_target`) within
    ``timeout=`` seconds."""
    find: str
    """``find()``: the broker's program, or :class:`MissingDependency` saying how to install it."""
    probe_target: Literal["url", "host:port"] = "url"
    """What the probe takes: a URL (``answers(url, timeout=)``) or a host and a port
    (``answers(host, port, timeout=)``); :meth:`answers_at` takes ``host:port`` then."""
    port: int = 0
    """Its well-known port: ``bench fl`` runs one on it in the testbed's server namespace."""

    def load(self, what: Literal["server", "ensure", "answers", "find"]) -> Any:
        return load_dotted(getattr(self, what), what=f"the {self.name} broker")

    def answers_at(self, target: str, timeout: float = 1.0) -> bool:
        """Whether the broker at ``target`` (a URL, or ``host:port``) answers."""
        probe = self.load("answers")
        if self.probe_target == "host:port":
            host, _, port = target.rpartition(":")
            return bool(probe(host, int(port), timeout=timeout))
        return bool(probe(target, timeout=timeout))


@dataclass(frozen=True)
class TransportEntry:
    """One transport: its URL scheme, classes, extra, broker and how benchmarks run it."""

    scheme: str
    """The URL scheme that selects it, without ``://``: ``zmq+tcp``."""
    hub: str
    """Dotted path of its :class:`~tensorwire.transports.base.Hub` subclass."""
    channel: str
    """Dotted path of its :class:`~tensorwire.transports.base.Channel` subclass."""
    extra: str | None = None
    """The ``pip install 'tensorwire[EXTRA]'`` extra its imports need (None: none)."""
    name: str = ""
    """Its short name in the CLI and benchmarks (``--protocols``, ``--transports``, result
    keys): ``zmq``. Default: the scheme up to a ``+``."""
    broker: str | None = None
    """The :class:`BrokerKind` it publishes through (``mosquitto``, ``rabbitmq``) or None."""
    local_url: str = ""
    """How to serve a hub on this machine: a URL template (``{tag}`` becomes a name unique to
    the run: a topic, queue or segment prefix), or the dotted path of a function of the tag
    returning the URL. With a :attr:`broker`, the URL is handed to its ``ensure``, so a broker
    that answers there is used and a private one started otherwise. Default:
    ``SCHEME://127.0.0.1:0``."""
    same_host_only: bool = False
    in_process: bool = False
    """Its hub and channels share one process (``mem://``): for tests and code under test;
    never in benchmarks, nor among the transports 'all' means."""
    """Its hub and channels must share a host (shared memory): never run across links."""
    baseline: str | None = None
    """The module in ``tensorwire.bench.baselines`` that uses the library it wraps directly
    (``pyzmq``), which ``bench transfer`` compares it with; None: no baseline."""
    label: str = ""
    """Its trial's name in benchmark tables and figures. Default: ``tensorwire-NAME``."""
    baseline_target: float | None = None
    """The least ``bench transfer`` expects of baseline time / its time at 3000x3000
    float64 (0.9 for the transports wrapping a library); None: no target."""
    query: str = ""
    """URL query ``bench fl`` adds to its hub and device URLs (udp: ``mode=reliable``)."""
    variants: Mapping[str, str] = field(default_factory=dict, hash=False)
    """More ``--protocols`` names that run it with another :attr:`query`
    (udp: ``{"udp-best-effort": "mode=best-effort"}``)."""
    paced: bool = False
    """It takes ``rate=BITS_PER_S`` in its URL and paces its sends to it: ``bench fl`` sets it
    a little under the shaped link's rate."""
    over_tcp: bool = True
    """Its data crosses a link in TCP segments (False for udp and quic: datagrams, resent by
    the transport itself; shm: no link), so TCP's retransmission counters say something of it."""
    scale_procs: int | None = None
    """The client processes ``bench scale`` holds its clients in at every count (mqtt, amqp:
    4, as one process's channels share one I/O thread there and more processes only add task
    switches); None: enough that none holds over 100 (a thread each)."""
    tls_form_of: str | None = None
    """The transport whose TLS-only URL scheme this is (``mqtts`` of ``mqtt``): the lists of
    every transport that benchmarks and the CLI run leave it out; they secure the other one
    (``--tls``, ``--security tls``)."""

    def __post_init__(self) -> None:
        if not self.scheme or "://" in self.scheme:
            raise ValueError(f"scheme {self.scheme!r}: give it without '://', e.g. 'tcp'")
        name = self.name or self.scheme.split("+", 1)[0]
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "label", self.label or f"tensorwire-{name}")
        object.__setattr__(self, "local_url", self.local_url or f"{self.scheme}://{LOOPBACK}:0")
        object.__setattr__(self, "variants", dict(self.variants))

    def load(self, role: Literal["hub", "channel"]) -> Any:
        """The hub or channel class, imported now (:class:`MissingDependency` names the
        extra to install if an import fails)."""
        return load_dotted(getattr(self, role), self.extra, what=f"{self.scheme}://")

    def options_type(self, role: Literal["hub", "channel"]) -> Any:
        """The typed options its hub or channel takes (what ``serve`` / ``connect`` keywords
        become): a ``HubOptions`` or ``ChannelOptions`` subclass."""
        return self.load(role).options_type

    @property
    def protocols(self) -> tuple[str, ...]:
        """Every name ``bench fl --protocols`` runs it under: :attr:`name`, then variants."""
        return (self.name, *self.variants)

    def protocol_query(self, protocol: str) -> str:
        """The URL query ``bench fl`` uses for it under the name ``protocol``."""
        return self.variants.get(protocol, self.query)

    def broker_kind(self) -> BrokerKind | None:
        return None if self.broker is None else get_broker(self.broker)

    def url_here(self, tag: str) -> str:
        """A URL for a hub on this machine (before its broker, if any, is ensured)."""
        if "://" in self.local_url:
            return self.local_url.format(tag=tag)
        return str(load_dotted(self.local_url, self.extra, f"{self.scheme}://")(tag))


_BROKERS: dict[str, BrokerKind] = {}
_TRANSPORTS: dict[str, TransportEntry] = {}  # by scheme, in registration order


def register_broker(kind: BrokerKind) -> BrokerKind:
    """Add (or replace) a broker kind."""
    _BROKERS[kind.name] = kind
    return kind


def brokers() -> list[BrokerKind]:
    return list(_BROKERS.values())


def get_broker(kind: str) -> BrokerKind:
    """A broker kind by its name (``mosquitto``), or the broker of a transport by its scheme
    or name (``mqtt``); ValueError if there is none."""
    if kind in _BROKERS:
        return _BROKERS[kind]
    entry = find_transport(kind)
    if entry is not None and entry.broker is not None:
        return _BROKERS[entry.broker]
    schemes = ", ".join(e.scheme for e in _TRANSPORTS.values() if e.broker)
    raise ValueError(f"kind must be {schemes} or a broker ({', '.join(_BROKERS)}), not {kind!r}")


def register_transport(
    scheme: str | TransportEntry,
    hub: str | None = None,
    channel: str | None = None,
    extra: str | None = None,
    **fields: Any,
) -> TransportEntry:
    """Make ``scheme://`` URLs use the hub and channel classes at these dotted paths.

    Takes a :class:`TransportEntry`, or its fields (``register_transport("toy+tcp", hub,
    channel, name="toy", baseline="socket")``). A scheme registered again is replaced; a name
    another transport already has is refused (give ``name=``)."""
    if isinstance(scheme, TransportEntry):
        if hub or channel or extra or fields:
            raise TypeError("give a TransportEntry or its fields, not both")
        entry = scheme
    else:
        if hub is None or channel is None:
            raise TypeError("register_transport needs the hub and channel dotted paths")
        entry = TransportEntry(scheme, hub, channel, extra, **fields)
    if entry.broker is not None and entry.broker not in _BROKERS:
        raise ValueError(
            f"{entry.scheme}: unknown broker {entry.broker!r}; known: {list(_BROKERS)}"
        )
    for other in _TRANSPORTS.values():
        if other.scheme == entry.scheme:
            continue
        taken = {other.scheme, *other.protocols} & {entry.scheme, *entry.protocols}
        if taken:
            raise ValueError(
                f"{entry.scheme}: {', '.join(sorted(taken))} already names {other.scheme}://; "
                "give the entry a name= of its own"
            )
    _TRANSPORTS[entry.scheme] = entry
    return entry


def unregister_transport(scheme: str) -> TransportEntry:
    """Remove the transport of ``scheme`` (UnknownScheme if none); return its entry."""
    try:
        return _TRANSPORTS.pop(scheme)
    except KeyError:
        raise UnknownScheme(f"no transport registered for {scheme}://") from None


def _register_plugin(entry: object) -> None:
    if not isinstance(entry, TransportEntry):
        raise TypeError(f"a {TRANSPORTS} entry point names a TransportEntry, not {entry!r}")
    register_transport(entry)


def _with_plugins() -> dict[str, TransportEntry]:
    """The registry, with the transports of installed plugins (entry points
    ``tensorwire.transports``) in it."""
    load_group(TRANSPORTS, _register_plugin)
    return _TRANSPORTS


def transports() -> list[TransportEntry]:
    """Every registered transport, in registration order (plugins' after the built-in ones)."""
    return list(_with_plugins().values())


def by_scheme(scheme: str) -> TransportEntry | None:
    """The transport of URL scheme ``scheme`` (exactly), or None."""
    entry = _TRANSPORTS.get(scheme)
    return entry if entry is not None else _with_plugins().get(scheme)


def find_transport(key: str) -> TransportEntry | None:
    """The transport whose scheme or name is ``key`` (``zmq+tcp`` or ``zmq``), or None."""
    every = _with_plugins()
    entry = every.get(key)
    if entry is None:
        entry = next((e for e in every.values() if e.name == key), None)
    return entry


def get_transport(key: str) -> TransportEntry:
    """:func:`find_transport`, raising :class:`UnknownScheme` listing the names if none."""
    entry = find_transport(key)
    if entry is None:
        names = ", ".join(e.name for e in _TRANSPORTS.values())
        raise UnknownScheme(f"no transport named {key!r}; registered: {names}")
    return entry


def listed_transports() -> list[TransportEntry]:
    """The transports 'all' means in benchmarks and the CLI: every registered one but the
    TLS-only forms of others (:attr:`TransportEntry.tls_form_of`) and those of one process
    (:attr:`TransportEntry.in_process`)."""
    return [e for e in _with_plugins().values() if e.tls_form_of is None and not e.in_process]


def bench_protocols() -> dict[str, TransportEntry]:
    """Every name ``bench fl --protocols`` takes (variants too) -> its transport."""
    return {p: e for e in listed_transports() for p in e.protocols}


def unknown_scheme(url: str) -> UnknownScheme:
    known = ", ".join(f"{s}://" for s in _with_plugins())
    return UnknownScheme(f"no transport for {url!r}; known schemes: {known}")


class KnownTransports(MutableMapping[str, dict[str, str | None]]):
    """The registry as the scheme -> ``{"hub", "channel", "extra"}`` dict of tensorwire 0.1;
    assigning registers, deleting unregisters."""

    def __getitem__(self, scheme: str) -> dict[str, str | None]:
        entry = _TRANSPORTS[scheme]
        return {"hub": entry.hub, "channel": entry.channel, "extra": entry.extra}

    def __setitem__(self, scheme: str, value: Mapping[str, str | None]) -> None:
        register_transport(scheme, value["hub"], value["channel"], value.get("extra"))

    def __delitem__(self, scheme: str) -> None:
        del _TRANSPORTS[scheme]

    def __iter__(self) -> Iterator[str]:
        return iter(list(_with_plugins()))

    def __len__(self) -> int:
        return len(_with_plugins())

    def __repr__(self) -> str:
        return f"KnownTransports({dict(self)!r})"


KNOWN_TRANSPORTS = KnownTransports()


# --- the built-in brokers and transports --------------------------------------------------

_B = "tensorwire.transports.brokers"
register_broker(
    BrokerKind(
        "mosquitto",
        server=f"{_B}.mosquitto.MosquittoBroker",
        ensure=f"{_B}.mosquitto.ensure_mosquitto",
        answers=f"{_B}.mosquitto.mosquitto_answers",
        find=f"{_B}.mosquitto.find_mosquitto",
        probe_target="host:port",
        port=1883,
    )
)
register_broker(
    BrokerKind(
        "rabbitmq",
        server=f"{_B}.rabbitmq.RabbitMQBroker",
        ensure=f"{_B}.rabbitmq.ensure_rabbitmq",
        answers=f"{_B}.rabbitmq.rabbitmq_answers",
        find=f"{_B}.rabbitmq.find_rabbitmq",
        probe_target="url",
        port=5672,
    )
)

_T = "tensorwire.transports"
register_transport("tcp", f"{_T}.tcp.TcpHub", f"{_T}.tcp.TcpChannel", baseline="socket")
register_transport(
    "zmq+tcp",
    f"{_T}.zmq.ZmqHub",
    f"{_T}.zmq.ZmqChannel",
    "zmq",
    name="zmq",
    baseline="pyzmq",
    baseline_target=0.9,
)
register_transport(
    "udp",
    f"{_T}.udp.UdpHub",
    f"{_T}.udp.UdpChannel",
    local_url="udp://127.0.0.1:0?mtu=65000",  # loopback carries 64 KiB datagrams
    query="mode=reliable",
    variants={"udp-best-effort": "mode=best-effort"},
    paced=True,
    over_tcp=False,
)
register_transport(
    "shm",
    f"{_T}.shm.ShmHub",
    f"{_T}.shm.ShmChannel",
    local_url="shm://{tag}",
    same_host_only=True,
    baseline="shm_memcpy",
    over_tcp=False,
)
register_transport(
    "amqp",
    f"{_T}.amqp.AmqpHub",
    f"{_T}.amqp.AmqpChannel",
    "amqp",
    broker="rabbitmq",
    local_url="amqp://guest:guest@127.0.0.1:5672/%2F?prefix={tag}",
    baseline="pika",
    baseline_target=0.9,
    scale_procs=4,
)
register_transport(
    "amqps",
    f"{_T}.amqp.AmqpsHub",
    f"{_T}.amqp.AmqpsChannel",
    "amqp",
    broker="rabbitmq",
    local_url="amqps://guest:guest@127.0.0.1:5671/%2F?prefix={tag}",
    tls_form_of="amqp",
    scale_procs=4,
)
register_transport(
    "mqtt",
    f"{_T}.mqtt.MqttHub",
    f"{_T}.mqtt.MqttChannel",
    "mqtt",
    broker="mosquitto",
    local_url="mqtt://127.0.0.1:1883/{tag}",
    baseline="paho",
    baseline_target=0.9,
    scale_procs=4,
)
register_transport(
    "mqtts",
    f"{_T}.mqtt.MqttsHub",
    f"{_T}.mqtt.MqttsChannel",
    "mqtt",
    broker="mosquitto",
    local_url="mqtts://127.0.0.1:8883/{tag}",
    tls_form_of="mqtt",
    scale_procs=4,
)
register_transport(
    "flight",
    f"{_T}.flight.FlightHub",
    f"{_T}.flight.FlightChannel",
    "flight",
    baseline="arrow_flight",
    baseline_target=0.9,
)
register_transport(
    "mem",
    f"{_T}.mem.MemHub",
    f"{_T}.mem.MemChannel",
    local_url="mem://{tag}",
    same_host_only=True,
    in_process=True,
)
register_transport(
    "quic",
    f"{_T}.quic.QuicHub",
    f"{_T}.quic.QuicChannel",
    "quic",
    local_url="quic://127.0.0.1:0?mtu=16000",  # loopback: the largest datagrams quic takes
    over_tcp=False,
)
register_transport(
    "ucx",
    f"{_T}.ucx.hub.UcxHub",
    f"{_T}.ucx.channel.UcxChannel",
    "ucx",
    baseline="ucxx_raw",
    baseline_target=0.9,
)
