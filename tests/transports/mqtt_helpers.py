"""What the mqtt:// tests share: a fresh topic prefix per test, a private Mosquitto, polling
for a condition, and a bare paho client that speaks to the broker as anyone could."""

from __future__ import annotations

import threading
import uuid

import pytest
from waiting import until

from tensorwire.errors import MissingDependency
from tensorwire.transports.brokers.mosquitto import MosquittoBroker
from tensorwire.transports.mqtt import MqttSettings
from tensorwire.transports.security import TLS
from tensorwire.wire import decode_message, parse_chunk

T = 20.0


@pytest.fixture(name="prefix")
def fixture_prefix() -> str:
    return f"twtest-{uuid.uuid4().hex[:10]}"


def _private(**options) -> MosquittoBroker:
    try:
        return MosquittoBroker(**options).start()
    except MissingDependency as exc:
        pytest.skip(str(exc))


class _Raw:
    """A bare paho client (TLS checked against ``ca`` for an mqtts:// URL, logged in as
    ``user``): publishes at QoS 1, collects the messages on topics it subscribes to."""

    def __init__(
        self, url: str, user: str | None = None, password: str | None = None, ca=None
    ) -> None:
        import paho.mqtt.client as paho
        from paho.mqtt.enums import CallbackAPIVersion

        self.settings = s = MqttSettings.from_url(url)
        self.got: list[tuple[str, bytes]] = []
        self._subscribed = threading.Event()
        self._client = paho.Client(
            CallbackAPIVersion.VERSION2, client_id=f"tw-raw-{uuid.uuid4().hex[:8]}"
        )
        if s.tls:
            self._client.tls_set_context(TLS(ca=ca).client_context())
        if user is not None:
            self._client.username_pw_set(user, password)
        self._client.on_message = lambda _c, _u, m: self.got.append((m.topic, m.payload))
        self._client.on_subscribe = lambda *_: self._subscribed.set()
        self._client.connect(s.host, s.port)
        self._client.loop_start()

    def subscribe(self, topic: str) -> None:
        self._subscribed.clear()
        self._client.subscribe(topic, qos=1)
        assert self._subscribed.wait(T)

    def publish(self, topic: str, payload: bytes) -> None:
        self._client.publish(topic, payload, qos=1).wait_for_publish(T)

    def messages(self, n: int) -> list:
        """The first ``n`` messages that came (each in one chunk), decoded; waits up to T
        seconds for them."""
        assert until(lambda: len(self.got) >= n), f"{len(self.got)} of {n} messages came"
        return [decode_message(parse_chunk(payload)[1]) for _, payload in self.got[:n]]

    def close(self) -> None:
        self._client.disconnect()
        self._client.loop_stop()
