"""mqtt:// under the conformance suite: the local Mosquitto, or a private one per session."""

from __future__ import annotations

import uuid

import pytest

from tensorwire.errors import MissingDependency

SCHEME = "mqtt"
_broker: list[str] = []  # "host:port" of the broker this session uses, once found


def _broker_address(request: pytest.FixtureRequest) -> str:
    from tensorwire.transports.brokers.mosquitto import MosquittoBroker, mosquitto_answers

    if not _broker:
        if mosquitto_answers("127.0.0.1", 1883):
            _broker.append("127.0.0.1:1883")
        else:
            try:
                broker = MosquittoBroker().start()
            except MissingDependency as exc:
                pytest.skip(str(exc))
            request.config.add_cleanup(broker.stop)
            _broker.append(f"{broker.host}:{broker.port}")
    return _broker[0]


def hub_url(request: pytest.FixtureRequest) -> str:
    """A fresh topic prefix on the session's broker."""
    pytest.importorskip("paho.mqtt", reason="paho-mqtt is not installed (extra 'mqtt')")
    return f"mqtt://{_broker_address(request)}/twtest-{uuid.uuid4().hex[:10]}"


def inject_garbage(hub_url: str) -> None:
    """As a raw paho client, publish junk on the hub's uplink (bytes that are no chunk, then a
    chunk that holds no message) and on the clients' control topic."""
    import paho.mqtt.client as paho
    from paho.mqtt.enums import CallbackAPIVersion

    from tensorwire.transports.mqtt import MqttSettings
    from tensorwire.wire import iter_chunks

    s = MqttSettings.from_url(hub_url)
    client = paho.Client(CallbackAPIVersion.VERSION2, client_id=f"tw-junk-{uuid.uuid4().hex[:8]}")
    client.connect(s.host, s.port)
    client.loop_start()
    junk = b"\xde\xad\xbe\xef" * 64
    chunk_of_junk = b"".join(next(iter_chunks([junk], 1, len(junk))))
    infos = [
        client.publish(s.up("intruder"), junk, qos=1),
        client.publish(s.up("intruder"), chunk_of_junk, qos=1),
        client.publish(s.ctl(), junk, qos=1),
    ]
    for info in infos:
        info.wait_for_publish(10)
    client.disconnect()
    client.loop_stop()
