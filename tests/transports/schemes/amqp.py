"""amqp:// under the conformance suite, against the RabbitMQ on 127.0.0.1:5672 (guest/guest)."""

import uuid

import pytest

SCHEME = "amqp"
BROKER = "amqp://guest:guest@127.0.0.1:5672/%2F"


def hub_url(request) -> str:
    """A URL with a prefix of its own, so hubs of concurrent tests never share queues."""
    pytest.importorskip("pika", reason="pika is not installed (extra 'amqp')")
    from tensorwire.transports.brokers.rabbitmq import rabbitmq_answers

    if not rabbitmq_answers(BROKER):
        pytest.skip(f"no RabbitMQ answers at {BROKER} (apt-get install rabbitmq-server)")
    return f"{BROKER}?prefix=twtest-{uuid.uuid4().hex[:12]}"


def inject_garbage(hub_url: str) -> None:
    """Publish bytes that are no tensorwire chunk to the hub's uplink queue as client "intruder"."""
    import pika

    from tensorwire.transports.amqp import AmqpAddress

    address = AmqpAddress(hub_url)
    conn = pika.BlockingConnection(address.params)
    try:
        props = pika.BasicProperties(headers={"tw-client": "intruder"})
        conn.channel().basic_publish("", f"{address.prefix}.up", b"\xde\xad\xbe\xef" * 64, props)
    finally:
        conn.close()
