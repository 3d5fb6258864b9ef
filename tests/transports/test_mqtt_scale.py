"""mqtt:// at a broker's limit: a private Mosquitto's URLs name its connection limit, a hub
on it warns before its devices fill it, a device past the limit gets BrokerFull naming it
(at once, not at its timeout), and the broker keeps running and serving the others."""

from __future__ import annotations

import threading
import time

import pytest

pytest.importorskip("paho.mqtt", reason="paho-mqtt is not installed (extra 'mqtt')")

from broker_limits import near_limit_warning, running
from mqtt_helpers import _private, fixture_prefix  # noqa: F401  (a fixture: prefix)
from waiting import until

import tensorwire
from tensorwire.errors import BrokerFull, TransportError
from tensorwire.transports.brokers.mosquitto import MosquittoBroker, mosquitto_answers
from tensorwire.transports.mqtt import MqttSettings
from tensorwire.transports.mqtt.connection import BrokerConnection

T = 60.0  # seconds: a join on a loaded 2-core machine
FDS = 84  # descriptors for a broker of 4 connections (Mosquitto's own 64, 16 spare)


def test_a_private_broker_url_names_its_connection_limit():
    small = MosquittoBroker(fds=FDS)
    assert small.limits.connections == 4
    assert MqttSettings.from_url(small.url("p")).connection_max == 4
    told = MosquittoBroker(settings={"max_connections": "7"})  # its settings have the last word
    assert MqttSettings.from_url(told.url("p", user=None)).connection_max == 7
    assert MqttSettings.from_url("mqtt://h:1/p").connection_max is None  # not known: no warning
    for bad in ("0", "x", "-3"):
        with pytest.raises(TransportError, match="connection_max"):
            MqttSettings.from_url(f"mqtt://h:1/p?connection_max={bad}")


@pytest.fixture(scope="module")
def small_broker():
    """A private Mosquitto with 84 descriptors (never the machine's own)."""
    yield from running(MosquittoBroker(fds=FDS))


def test_devices_past_a_full_broker_get_BrokerFull_the_hub_warned_and_the_broker_runs_on(
    small_broker,
):
    limit = small_broker.limits.connections
    joined: list[tensorwire.Channel] = []
    with tensorwire.serve(small_broker.url("full"), codec=None) as hub:
        assert hub.connection_max == limit
        try:
            # one device after another until the broker turns one away: Mosquitto counts its
            # listener's clients, the hub among them, to within one of its max_connections
            refused = None
            for i in range(limit + 2):
                t = time.monotonic()
                try:
                    joined.append(
                        tensorwire.connect(hub.url, client_id=f"d{i}", codec=None, timeout=T)
                    )
                except BrokerFull as exc:
                    refused = exc
                    break
            assert refused is not None, f"{len(joined)} devices joined a broker of {limit}"
            assert limit - 1 <= len(joined) <= limit
            assert f"lets in {limit} connections" in str(refused)
            assert time.monotonic() - t < T / 2  # refused, not timed out
            hub.wait_for(len(joined), timeout=T)
            assert f"lets in {limit} connections" in near_limit_warning(hub, T)
            with pytest.raises(BrokerFull):  # and the next one too
                tensorwire.connect(hub.url, client_id="again", codec=None, timeout=T)
            assert small_broker._proc is not None and small_broker._proc.poll() is None
            sent = hub.broadcast(meta={"still": "serving"}, timeout=T)
            assert sorted(sent) == sorted(ch.client_id for ch in joined) and not sent.failed
            for ch in joined:
                assert ch.recv(timeout=T).meta == {"still": "serving"}
            joined.pop().close()  # one leaves: another fits again
            with tensorwire.connect(hub.url, client_id="late", codec=None, timeout=T) as late:
                late.send(meta={"hello": 1}, timeout=T)
                who, msg = hub.recv(timeout=T)
                assert who == "late" and msg.meta == {"hello": 1}
        finally:
            for ch in joined:
                ch.close()
    assert mosquitto_answers(small_broker.host, small_broker.port)


def test_a_subscriber_that_stalls_loses_none_of_more_messages_than_the_broker_queues(prefix):
    """Mosquitto sends a client 20 QoS 1 messages at a time and queues 1,000 more, then drops:
    a connection asks for Receive Maximum, so a hub that many devices say hello to at once
    (its network thread held up meanwhile) loses none."""
    broker = _private()
    s = MqttSettings.from_url(broker.url(prefix))
    stalled, got = threading.Event(), []

    def on_message(_topic: str, payload: bytes, _dup: bool) -> None:
        stalled.wait(T)  # holds paho's network thread: no PUBACK goes out meanwhile
        got.append(payload)

    def connection(topics: list[str], on_message, private: bool = False) -> BrokerConnection:
        c = BrokerConnection(
            s,
            tls=None,
            will=lambda: (f"{prefix}/will", b""),
            subscriptions=topics,
            on_message=on_message,
            on_lost=lambda _d: None,
            on_back=lambda _d, _k: None,
            private=private,
        )
        c.connect(time.monotonic() + T, T)
        return c

    n = 1500  # past Mosquitto's 20 in flight + 1,000 queued
    hub = connection([f"{prefix}/up/#"], on_message, private=True)  # as a hub's: its own loop
    device = connection([f"{prefix}/down"], lambda *_: None)
    try:
        device.publish_chunks(f"{prefix}/up/d", (b"%d" % i for i in range(n)), time.monotonic() + T)
        stalled.set()
        assert until(lambda: len(got) >= n), f"{len(got)} of {n} messages came"
        assert got == [b"%d" % i for i in range(n)]
    finally:
        device.close()
        hub.close()
        broker.stop()
