"""amqp:// under the conformance suite, against the RabbitMQ on 127.0.0.1:5672 (guest/guest);
broker restarts on a private node, one per test session."""

from __future__ import annotations

import uuid

import pytest

from tensorwire.errors import MissingDependency

SCHEME = "amqp"
BROKER = "amqp://guest:guest@127.0.0.1:5672/%2F"
_PRIVATE = "_tensorwire_private_rabbitmq"  # the session's private node, kept on pytest's config


def hub_url(request) -> str:
    """A URL with a prefix of its own, so hubs of concurrent tests never share queues."""
    pytest.importorskip("pika", reason="pika is not installed (extra 'amqp')")
    from tensorwire.transports.brokers.rabbitmq import rabbitmq_answers

    if not rabbitmq_answers(BROKER):
        pytest.skip(f"no RabbitMQ answers at {BROKER} (apt-get install rabbitmq-server)")
    return f"{BROKER}?prefix=twtest-{uuid.uuid4().hex[:12]}"


def _publish(hub_url: str, messages: list[tuple[str, str, str, bytes]]) -> None:
    """Publish raw ``(exchange, routing key, tw-client header, body)`` messages, confirmed."""
    import pika

    from tensorwire.transports.amqp import AmqpAddress

    conn = pika.BlockingConnection(AmqpAddress(hub_url).params)
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


class PrivateBroker:
    """The session's private RabbitMQ node: :meth:`hub_url` with a fresh prefix, :meth:`restart`."""

    def __init__(self, node) -> None:
        self.node = node

    def hub_url(self) -> str:
        return self.node.url(prefix=f"twtest-{uuid.uuid4().hex[:12]}")

    def restart(self, down_s: float) -> None:
        self.node.restart(down_s)


def private_broker(request: pytest.FixtureRequest) -> PrivateBroker:
    """A private RabbitMQ node, started on first use and stopped when the session ends."""
    pytest.importorskip("pika", reason="pika is not installed (extra 'amqp')")
    from tensorwire.transports.brokers.rabbitmq import RabbitMQBroker

    broker = getattr(request.config, _PRIVATE, None)
    if broker is None:
        try:
            node = RabbitMQBroker().start()
        except MissingDependency as exc:
            pytest.skip(str(exc))
        request.config.add_cleanup(node.stop)
        broker = PrivateBroker(node)
        setattr(request.config, _PRIVATE, broker)
    return broker
