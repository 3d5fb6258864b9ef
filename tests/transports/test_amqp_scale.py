"""amqp:// at scale: one broker connection per device, a private broker sized for the devices,
and a broker that is full refusing the devices past its limit by name (BrokerFull) while it
keeps running, its hub having warned before."""

from __future__ import annotations

import resource
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

pytest.importorskip("pika", reason="pika is not installed (extra 'amqp')")

import tensorwire
from tensorwire.errors import BrokerFull, MissingDependency
from tensorwire.transports.amqp import AmqpAddress
from tensorwire.transports.brokers.rabbitmq import RabbitMQBroker, rabbitmq_answers
from tensorwire.transports.brokers.sizing import (
    MOSQUITTO,
    RABBITMQ,
    SPARE_CONNECTIONS,
    size_for,
)

T = 120.0  # seconds: a join on a loaded 2-core machine


def test_a_broker_gets_descriptors_for_its_devices_within_this_process_hard_limit():
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    small = size_for(None, None, RABBITMQ)
    assert small.fds == min(1024, hard) and small.connections >= 1
    thousand = size_for(1000, None, RABBITMQ)
    if hard >= thousand.fds:
        assert thousand.connections >= 1000 + 1 + SPARE_CONNECTIONS  # the hub and spares too
    assert thousand.fds <= hard
    fixed = size_for(500, 1024, RABBITMQ)  # a given limit wins over the devices
    assert fixed.fds == 1024 and fixed.connections < 500
    assert size_for(1000, None, MOSQUITTO).fds < size_for(1000, None, RABBITMQ).fds
    with pytest.raises(ValueError, match="no room"):
        size_for(None, 300, RABBITMQ)


def test_a_private_broker_url_names_its_connection_limit():
    node = RabbitMQBroker(fds=1024)
    assert AmqpAddress(node.url("p")).connection_max == node.limits.connections
    assert "connection_max" not in node.plain_url()  # a plain URL stays pika's


@pytest.fixture(scope="module")
def full_broker():
    """A private RabbitMQ with 1,024 descriptors (never the machine's own)."""
    node = RabbitMQBroker(fds=1024, startup_timeout=180)
    try:
        node.start()
    except MissingDependency as exc:
        pytest.skip(str(exc))
    yield node
    node.stop()


def test_devices_past_a_full_broker_get_BrokerFull_the_hub_warned_and_the_broker_runs_on(
    full_broker,
):
    limit = full_broker.limits.connections
    assert limit < 1024 // 2  # what 1,024 descriptors leave room for
    fit = limit - 1  # the hub holds one connection; each device exactly one
    extra = 3
    with tensorwire.serve(full_broker.url("full"), codec=None) as hub:
        assert hub.connection_max == limit

        def join(i: int):
            try:
                return tensorwire.connect(hub.url, client_id=f"d{i}", codec=None, timeout=T)
            except BrokerFull as exc:
                return exc

        with ThreadPoolExecutor(16) as pool:
            joined = list(pool.map(join, range(fit)))
        try:
            refused = [e for e in joined if isinstance(e, Exception)]
            assert not refused, refused[:3]  # one connection each: all of them fit
            hub.wait_for(fit, timeout=T)
            near = [e for e in hub.events if e.kind == "broker-near-limit"]
            assert near and f"lets in {limit} connections" in near[0].reason
            for i in range(extra):  # the devices past the limit: a clear, typed refusal
                t = time.monotonic()
                with pytest.raises(BrokerFull, match=rf"connection limit \({limit} connections\)"):
                    tensorwire.connect(hub.url, client_id=f"x{i}", codec=None, timeout=T)
                assert time.monotonic() - t < T / 2  # refused, not timed out
            assert full_broker._proc is not None and full_broker._proc.poll() is None
            sent = hub.broadcast(meta={"still": "serving"}, timeout=T)
            assert len(sent) == fit and not sent.failed
            for ch in joined[:3]:
                assert ch.recv(timeout=T).meta == {"still": "serving"}
            joined.pop().close()  # one leaves: another fits again
            with tensorwire.connect(hub.url, client_id="late", codec=None, timeout=T) as late:
                hub.wait_for(fit, timeout=T)
                assert "late" in hub.clients
                late.send(meta={"hello": 1}, timeout=T)
                who, msg = hub.recv(timeout=T)
                assert who == "late" and msg.meta == {"hello": 1}
        finally:
            with ThreadPoolExecutor(16) as pool:
                list(pool.map(lambda ch: ch.close(), joined))
    assert rabbitmq_answers(full_broker.plain_url(), timeout=30)
