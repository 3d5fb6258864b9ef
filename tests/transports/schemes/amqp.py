"""amqp:// under the conformance suite, against the RabbitMQ on 127.0.0.1:5672 (guest/guest);
broker restarts and the security suite on a private node, one per test session.

The private node starts plain; the first test that needs TLS restarts it once with a TLS
listener beside the plain one, and a test that needs other certificates rotates them in
without a restart (``RabbitMQBroker.use_tls``). ``amqps.py`` runs the same suites over TLS,
through the ``tls_*`` functions here.
"""

from __future__ import annotations

import os
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest

from tensorwire.errors import MissingDependency

SCHEME = "amqp"
BROKER = "amqp://guest:guest@127.0.0.1:5672/%2F"
T = 10.0  # seconds a raw client waits for the broker
_PRIVATE = "_tensorwire_private_rabbitmq"  # the session's private node, kept on pytest's config
_OWN_CERTS = "_tensorwire_rabbitmq_certs"  # certificates made for amqps' conformance runs
_TRACED = "_tensorwire_rabbitmq_traced"  # whether the node's firehose is on
_SPY_PREFIX = "twspy."  # a spy queue per hub prefix: what clients published, as the broker saw it


def _prefix() -> str:
    return f"twtest-{uuid.uuid4().hex[:12]}"


def hub_url(request) -> str:
    """A URL with a prefix of its own, so hubs of concurrent tests never share queues."""
    pytest.importorskip("pika", reason="pika is not installed (extra 'amqp')")
    from tensorwire.transports.brokers.rabbitmq import rabbitmq_answers

    if not rabbitmq_answers(BROKER):
        pytest.skip(f"no RabbitMQ answers at {BROKER} (apt-get install rabbitmq-server)")
    return f"{BROKER}?prefix={_prefix()}"


def later_hub_url(request) -> str:
    """A prefix a channel can dial before a hub serves it (it says hello until one does)."""
    return hub_url(request)


def _connection(url: str, tls: Any = None) -> Any:
    """A raw pika connection to the broker of ``url`` (TLS for amqps:// or with ``tls``;
    without ``tls`` against the CAs the test trusts as the system's)."""
    import pika

    from tensorwire.transports.amqp import AmqpAddress

    params = AmqpAddress(url, tls).params
    params.heartbeat = 0  # short-lived: nothing to keep alive
    return pika.BlockingConnection(params)


def _publish(hub_url: str, messages: list[tuple[str, str, str, bytes]]) -> None:
    """Publish raw ``(exchange, routing key, tw-client header, body)`` messages, confirmed."""
    import pika

    conn = _connection(hub_url)
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        for exchange, key, sender, body in messages:
            props = pika.BasicProperties(headers={"tw-client": sender})
            ch.basic_publish(exchange, key, body, props)
    finally:
        conn.close()


def inject_garbage(hub_url: str) -> None:
    """Publish bytes that are no tensorwire chunk to the hub's uplink queue as client "intruder"."""
    from tensorwire.transports.amqp import AmqpAddress

    up = f"{AmqpAddress(hub_url).prefix}.up"
    _publish(hub_url, [("", up, "intruder", b"\xde\xad\xbe\xef" * 64)])


def forged_bodies() -> list[bytes]:
    """Bodies a stranger publishes: junk, chunks declaring 16 GiB or with bad offsets, counts
    and duplicate indices, a chunk holding no message, a prefix declaring a 16 GiB body, and
    forged session messages (bye, welcome, refuse, a hello of another version)."""
    from tensorwire.wire import encode_message, iter_chunks
    from tensorwire.wire.chunks import CHUNK_HEADER, CHUNK_MAGIC
    from tensorwire.wire.format import MAGIC, PREFIX, VERSION

    def chunk(mid: int, index: int, count: int, offset: int, total: int, payload: bytes) -> bytes:
        return CHUNK_HEADER.pack(CHUNK_MAGIC, 1, 0, 0, mid, index, count, offset, total) + payload

    def whole(data: bytes) -> bytes:
        return b"".join(next(iter_chunks([data], int(uuid.uuid4().int >> 64), 1 << 20)))

    huge, piece = 16 << 30, 1 << 16
    duplicate = chunk(3, 0, 2, 0, 100, bytes(60))
    return [
        b"\xde\xad\xbe\xef" * 64,
        chunk(1, 0, huge // piece, 0, huge, bytes(piece)),  # 16 GiB declared, 64 KiB sent
        chunk(2, 7, huge // piece, 12345, huge, bytes(piece)),  # offset is not index x size
        chunk(4, 5, 3, 0, 100, b""),  # index past count
        duplicate,
        duplicate,
        whole(b"\x00" * 300),  # a chunk holding no message
        whole(PREFIX.pack(MAGIC, VERSION, 0, 0, 64, 0, huge)),  # a 16 GiB body declared
        whole(encode_message(None, {"reason": "forged"}, kind="bye").to_bytes()),
        whole(encode_message(None, {"session": "0" * 32, "version": 2}, kind="welcome").to_bytes()),
        whole(encode_message(None, {"reason": "forged", "code": "auth"}, kind="refuse").to_bytes()),
        whole(encode_message(None, {"client_id": "x", "version": 99}, kind="hello").to_bytes()),
    ]


def inject_forged(hub_url: str, client_ids: list[str]) -> None:
    """As another broker user: every forged body to the hub's uplink, as a stranger and as each
    of ``client_ids`` (with their ``tw-client`` header), and to every client's queue through the
    fanout exchange bound to it, as the hub (a client's own queue has a random name)."""
    from tensorwire.transports.amqp import AmqpAddress

    prefix = AmqpAddress(hub_url).prefix
    messages = []
    for body in forged_bodies():
        for sender in ("stranger", *client_ids):
            messages.append(("", f"{prefix}.up", sender, body))
        messages.append((f"{prefix}.all", "", "hub", body))
        messages.append((f"{prefix}.all", "", "stranger", body))
    _publish(hub_url, messages)


# --- the session's private node ------------------------------------------------------------


def _node(request: pytest.FixtureRequest, tls: Any = None) -> Any:
    """The session's private RabbitMQ node, started on first use and stopped when the session
    ends; with ``tls``, serving TLS with those files (a TLS listener added by one restart, or
    new files rotated in), its plain listener kept."""
    pytest.importorskip("pika", reason="pika is not installed (extra 'amqp')")
    from tensorwire.transports.brokers.rabbitmq import RabbitMQBroker

    node = getattr(request.config, _PRIVATE, None)
    if node is not None and node.dir is None:
        # a restart that could not bring it back (a slow start on a loaded machine) tore it
        # down: start another rather than fail every later test with the dead one
        print(f"the session's RabbitMQ node is gone; starting another (was {node.node})")
        tls = tls or node.tls
        node = None
    if node is None:
        options = {} if tls is None else {"tls": tls, "plain_port": 0}
        try:
            node = RabbitMQBroker(**options).start()
        except MissingDependency as exc:
            pytest.skip(str(exc))
        request.config.add_cleanup(node.stop)
        setattr(request.config, _PRIVATE, node)
    elif tls is not None and node.tls != tls:
        node.use_tls(tls)
    return node


class PrivateBroker:
    """The session's private RabbitMQ node: :meth:`hub_url` with a fresh prefix (on its TLS
    listener if ``tls``), :meth:`restart`."""

    def __init__(self, node: Any, tls: bool = False) -> None:
        self.node = node
        self.tls = tls

    def hub_url(self) -> str:
        return self.node.url(_prefix()) if self.tls else self.node.plain_url(_prefix())

    def restart(self, down_s: float) -> None:
        self.node.restart(down_s)


def private_broker(request: pytest.FixtureRequest) -> PrivateBroker:
    """The session's private RabbitMQ node, through its plain listener."""
    return PrivateBroker(_node(request))


def _tls_settings(certs: Path) -> Any:
    from tensorwire.transports.security import TLS

    return TLS(cert=certs / "hub.pem", key=certs / "hub.key", ca=certs / "ca.pem")


def _trusted_tls_node(request: pytest.FixtureRequest) -> Any:
    """The session's node with a TLS listener whose CA this test trusts as the system's
    (``SSL_CERT_FILE``): clients connect with no ``tls=``, as to a broker with a public
    certificate, and so do the peers it starts. Whatever certificates the node serves are
    kept (the security suite's, say); a node serving none gets some made for it."""
    node = getattr(request.config, _PRIVATE, None)
    if node is not None and node.tls is not None:
        node = _node(request)  # the one it serves (another if a failed restart tore it down)
    else:
        certs = getattr(request.config, _OWN_CERTS, None)
        if certs is None:
            pytest.importorskip("cryptography", reason="cryptography is not installed")
            from tensorwire.transports.certs import make_certs

            directory = request.getfixturevalue("tmp_path_factory").mktemp("amqps-certs")
            certs = make_certs(directory, hosts=["127.0.0.1", "localhost"], clients=[])
            setattr(request.config, _OWN_CERTS, certs)
        node = _node(request, _tls_settings(Path(certs.directory)))
    before = os.environ.get("SSL_CERT_FILE")
    os.environ["SSL_CERT_FILE"] = str(node.tls.ca)

    def restore() -> None:
        if before is None:
            os.environ.pop("SSL_CERT_FILE", None)
        else:
            os.environ["SSL_CERT_FILE"] = before

    request.addfinalizer(restore)
    return node


def tls_hub_url(request: pytest.FixtureRequest) -> str:
    """A fresh prefix on the session node's TLS listener, as ``amqps://``."""
    return _trusted_tls_node(request).url(_prefix())


def tls_private_broker(request: pytest.FixtureRequest) -> PrivateBroker:
    """The session's private node, through its TLS listener (trusted as the system's CA)."""
    return PrivateBroker(_trusted_tls_node(request), tls=True)


# --- the security suite --------------------------------------------------------------------


CTL_SLOW_TIMEOUT = 180.0  # seconds a rabbitmqctl call may take on a starved machine


def _trace(node: Any) -> None:
    """Turn the node's firehose on: a copy of every message published on the vhost goes to
    ``amq.rabbitmq.trace``, which any user may bind a queue to, as a broker admin (or anyone
    who took the broker over) can see everything that crosses it."""
    # Beside a CPU hog and other tests, rabbitmqctl (an Erlang VM of its own) once said
    # "Trace enabled for vhost /" and did not exit within the minute (the node had done
    # it), and once said nothing within the minute: each try gets 3 minutes, and trace_on is
    # idempotent, so a second try follows a silent timeout.
    for attempt in (1, 2):
        try:
            subprocess.run(
                [str(node._ctl), "-n", node.node, "trace_on", "-p", node.vhost],
                env=node._env,
                capture_output=True,
                timeout=CTL_SLOW_TIMEOUT,
                check=True,
            )
            return
        except subprocess.TimeoutExpired as exc:
            if b"Trace enabled" in (exc.output or b""):
                return
            if attempt == 2:
                raise


def secure_hub_url(request: pytest.FixtureRequest, enrolment: Any, scheme: str = "amqp") -> str:
    """A fresh prefix on the session node's TLS listener, serving ``enrolment``'s hub.pem;
    ``amqp://`` (TLS from the ``tls=`` the suite passes) or ``amqps://``. Another user of the
    broker keeps a copy of everything published from now on (for :func:`replay_last`)."""
    node = _node(request, _tls_settings(Path(enrolment.directory)))
    if not getattr(request.config, _TRACED, False):
        _trace(node)
        setattr(request.config, _TRACED, True)
    prefix = _prefix()
    conn = _connection(node.plain_url())
    try:
        ch = conn.channel()
        spy = _SPY_PREFIX + prefix
        ch.queue_declare(spy, arguments={"x-max-length": 1000, "x-expires": 300_000})
        ch.queue_bind(spy, "amq.rabbitmq.trace", routing_key="publish.#")
    finally:
        conn.close()

    def stop() -> None:
        conn = _connection(node.plain_url())
        try:
            conn.channel().queue_delete(spy)
        finally:
            conn.close()

    request.addfinalizer(stop)
    url = node.url(prefix)
    return url.replace("amqps://", "amqp://", 1) if scheme == "amqp" else url


def proxy_target(hub_url: str) -> tuple[str, int]:
    """Where a recording proxy forwards a client's connection to: the broker's TLS port."""
    parts = urlsplit(hub_url)
    assert parts.hostname is not None and parts.port is not None
    return parts.hostname, parts.port


def proxied_url(hub_url: str, port: int) -> str:
    """The hub's URL with the broker reached through a proxy on 127.0.0.1:``port`` (the name
    the client checks in the broker's certificate: 127.0.0.1 is in it)."""
    parts = urlsplit(hub_url)
    user = parts.netloc.rpartition("@")[0]
    return urlunsplit(parts._replace(netloc=(f"{user}@" if user else "") + f"127.0.0.1:{port}"))


def replay_last(hub_url: str, enrolment: Any) -> None:
    """As another user of the broker, publish the last sealed body a client published to the
    hub's uplink (as the firehose showed it) again: once as it was, once with a byte flipped."""
    import pika

    from tensorwire.transports.amqp import AmqpAddress
    from tensorwire.transports.security import TLS

    prefix = AmqpAddress(hub_url).prefix
    up = f"{prefix}.up"
    conn = _connection(hub_url, TLS(ca=enrolment.ca))
    try:
        ch = conn.channel()
        captured: list[tuple[str, bytes]] = []
        deadline = time.monotonic() + T
        while not captured and time.monotonic() < deadline:
            while True:
                method, props, body = ch.basic_get(_SPY_PREFIX + prefix, auto_ack=True)
                if method is None:
                    break
                headers = props.headers or {}
                original = (headers.get("properties") or {}).get("headers") or {}
                sender = original.get("tw-client")
                sender = sender.decode() if isinstance(sender, bytes) else sender
                keys = [k.decode() if isinstance(k, bytes) else k for k in headers["routing_keys"]]
                if up in keys and sender != "hub" and body.endswith(b"TWMA"):  # sealed
                    captured.append((sender, body))
            time.sleep(0.05)
        assert captured, "no client published a sealed body that another user could see"
        sender, body = captured[-1]
        altered = bytearray(body)
        altered[len(altered) // 2] ^= 0x01
        ch.confirm_delivery()
        props = pika.BasicProperties(headers={"tw-client": sender}, delivery_mode=2)
        for copy in (body, bytes(altered)):
            ch.basic_publish("", up, copy, props)
    finally:
        conn.close()
