"""mqtt:// under the conformance suite: the local Mosquitto, or a private one per session; a
private, persistent one per test for broker restarts."""

from __future__ import annotations

import gc
import uuid
from typing import Any

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


def _prefix() -> str:
    return f"twtest-{uuid.uuid4().hex[:10]}"


def hub_url(request: pytest.FixtureRequest) -> str:
    """A fresh topic prefix on the session's broker."""
    pytest.importorskip("paho.mqtt", reason="paho-mqtt is not installed (extra 'mqtt')")
    return f"mqtt://{_broker_address(request)}/{_prefix()}"


class PrivateBroker:
    """A started Mosquitto of one test's own, that keeps its state on disk across restarts."""

    def __init__(self, broker: Any) -> None:
        self.broker = broker  # a MosquittoBroker

    def hub_url(self) -> str:
        """A URL with a fresh topic prefix on this broker."""
        return self.broker.url(_prefix())

    def restart(self, down_s: float) -> None:
        """Stop it (it saves sessions and queued messages), stay down ``down_s`` seconds, start
        it again on the same port and data directory."""
        self.broker.restart(down_s)


def private_broker(request: pytest.FixtureRequest) -> PrivateBroker:
    """A private persistent Mosquitto for this test, stopped when it ends."""
    pytest.importorskip("paho.mqtt", reason="paho-mqtt is not installed (extra 'mqtt')")
    from tensorwire.transports.brokers.mosquitto import MosquittoBroker

    try:
        broker = MosquittoBroker(persistence=True).start()
    except MissingDependency as exc:
        pytest.skip(str(exc))
    request.addfinalizer(broker.stop)
    return PrivateBroker(broker)


class _Stranger:
    """A raw paho client on the hub's broker: publishes whatever it is given, at QoS 1."""

    def __init__(self, hub_url: str) -> None:
        import paho.mqtt.client as paho
        from paho.mqtt.enums import CallbackAPIVersion

        from tensorwire.transports.mqtt import MqttSettings

        self.settings = s = MqttSettings.from_url(hub_url)
        self._client = paho.Client(
            CallbackAPIVersion.VERSION2, client_id=f"tw-stranger-{uuid.uuid4().hex[:8]}"
        )
        self._client.connect(s.host, s.port)
        self._client.loop_start()
        self._sent: list[Any] = []

    def publish(self, topic: str, payload: bytes) -> None:
        self._sent.append(self._client.publish(topic, payload, qos=1))

    def close(self) -> None:
        for info in self._sent:
            info.wait_for_publish(10)
        self._client.disconnect()
        self._client.loop_stop()


def inject_garbage(hub_url: str) -> None:
    """As a raw paho client, publish junk on a stranger's uplink (bytes that are no chunk, then
    a chunk that holds no message) and on a control topic."""
    from tensorwire.wire import iter_chunks

    stranger = _Stranger(hub_url)
    s = stranger.settings
    junk = b"\xde\xad\xbe\xef" * 64
    chunk_of_junk = b"".join(next(iter_chunks([junk], 1, len(junk))))
    sid = uuid.uuid4().hex
    stranger.publish(s.up("intruder", sid), junk)
    stranger.publish(s.up("intruder", sid), chunk_of_junk)
    stranger.publish(s.ctl("intruder", sid), junk)
    stranger.close()


def _forged_chunks() -> list[bytes]:
    """Chunks no sender would make: huge declared totals, bad offsets, counts that disagree,
    duplicate indices with other bytes, a message that is no tensorwire message."""
    from tensorwire.wire.chunks import CHUNK_HEADER, CHUNK_MAGIC, CHUNK_VERSION

    def chunk(mid: int, index: int, count: int, offset: int, total: int, payload: bytes) -> bytes:
        head = CHUNK_HEADER.pack(CHUNK_MAGIC, CHUNK_VERSION, 0, 0, mid, index, count, offset, total)
        return head + payload

    kib = b"\x00" * 1024
    out = [b"\xde\xad\xbe\xef" * 64, b"TWCK" + b"\xff" * 60]
    for total in (16 << 30, 1 << 40, (1 << 64) - 1):  # 16 GiB, 1 TiB, the largest u64
        out.append(chunk(1, 0, min(total // 1024, (1 << 32) - 1), 0, total, kib))
    out.append(chunk(2, 0, 4, 0, 4096, kib))  # a message that will never complete ...
    out.append(chunk(2, 1, 4, 999, 4096, kib))  # ... an offset that is not index x size
    out.append(chunk(2, 2, 5, 2048, 4096, kib))  # ... a count that disagrees
    out.append(chunk(2, 1, 4, 1024, 4096, kib))
    out.append(chunk(2, 1, 4, 1024, 4096, b"\x01" * 1024))  # ... index 1 again, other bytes
    out.append(chunk(3, 0, 1, 0, 1024, kib))  # complete, but no tensorwire message
    out.append(chunk(4, 1, 2, 1024, 1030, b"\x02" * 6))  # a last chunk before any other
    return out


def _live_sessions(prefix: str, client_ids: list[str]) -> tuple[list[str], dict[str, str]]:
    """The hub ids and the clients' session ids on ``prefix``, as a stranger learns them by
    watching the broker (taken here from the live hub and channels of this process)."""
    from tensorwire.transports.mqtt import MqttChannel, MqttHub

    hubs, sessions = [], {}
    for obj in gc.get_objects():
        if isinstance(obj, MqttHub) and obj.settings.prefix == prefix:
            hubs.append(obj.hub_id)
        elif (
            isinstance(obj, MqttChannel)
            and obj.settings.prefix == prefix
            and obj.client_id in client_ids
        ):
            sessions[obj.client_id] = obj._session.session
    return hubs, sessions


def inject_forged(hub_url: str, client_ids: list[str]) -> None:
    """As a stranger who has watched the broker (so knows the hub's and the clients' session
    ids), publish forged chunks on every topic the hub and ``client_ids`` read: the uplinks of
    their sessions, of other sessions and of other clients; their welcome and data topics; the
    broadcast topic and the hub's. Then valid messages in the wrong place: data on topics with
    no session, a bye and a welcome for other sessions, a bye from another hub, and a will of
    the hub's (it makes the clients ask whether the hub is still there, nothing more)."""
    import numpy as np

    from tensorwire.transports.mqtt import _one_chunk, _will
    from tensorwire.transports.session import ClientSession, HubSession, bye
    from tensorwire.wire import encode_message

    stranger = _Stranger(hub_url)
    s = stranger.settings
    hubs, sessions = _live_sessions(s.prefix, client_ids)
    other = uuid.uuid4().hex
    topics = [s.down(), s.up("stranger", other), *(s.hub(h) for h in [*hubs, other])]
    for cid in client_ids:
        sid = sessions.get(cid, other)
        topics += [s.up(cid, sid), s.up(cid, other), s.ctl(cid, sid), s.down(cid, sid)]
    for topic in topics:
        for payload in _forged_chunks():
            stranger.publish(topic, payload)
    data = _one_chunk(encode_message({"x": np.zeros(4, np.float32)}, {"forged": True}))
    stranger.publish(s.up("stranger", other), data)  # data from a client that never said hello
    stranger.publish(s.hub(other), _one_chunk(bye("forged")))  # a bye from some other hub
    stranger.publish(s.down(), _one_chunk(bye("forged")))  # a bye where only data goes
    hub_session = HubSession(decoders=[], max_message_bytes=1 << 20)
    for cid in client_ids:
        sid = sessions.get(cid, other)
        stranger.publish(s.up(cid, other), _one_chunk(bye("forged")))  # another session's bye
        stranger.publish(s.ctl(cid, sid), _one_chunk(hub_session.welcome()))  # no session's
        welcome = {"version": 2, "decoders": [], "max_message_bytes": 1 << 20, "hub": other}
        stranger.publish(  # this session's, from another hub
            s.ctl(cid, sid),
            _one_chunk(encode_message(None, {**welcome, "session": sid}, kind="welcome")),
        )
        hello = ClientSession(cid, decoders=[], max_message_bytes=1 << 20).hello()
        stranger.publish(s.ctl(cid, sid), _one_chunk(hello))  # a hello where hubs answer
    for h in hubs:
        stranger.publish(s.hub(h), _one_chunk(_will("forged")))
    stranger.close()
