"""mqtt:// under the conformance suite: the local Mosquitto, or a private one per session; a
private, persistent one per test for broker restarts; for the security suite, a private one
with a TLS listener and two users per test session (``tensorwire``, whom hub and clients log
in as, and ``mallory``, another user of the same broker who watches and replays).

``mqtts.py`` runs the same suites over TLS, through the ``tls_*`` functions here."""

from __future__ import annotations

import gc
import os
import secrets
import threading
import time
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest

from tensorwire.errors import MissingDependency

SCHEME = "mqtt"
T = 10.0  # seconds a raw client waits for the broker
USER = "tensorwire"  # the broker user hub and clients log in as on a broker with users
OTHER = "mallory"  # another user of that broker
_broker: list[str] = []  # "host:port" of the broker this session uses, once found
_tls_brokers: dict[str, Any] = {}  # certificates' directory -> a started broker on them
_passwords = {USER: secrets.token_hex(16), OTHER: secrets.token_hex(16)}
_own_certs: list[Any] = []  # the Enrolment mqtts' conformance runs use, once made
_spies: dict[str, _Raw] = {}  # topic prefix -> another user, watching the uplinks under it


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


def later_hub_url(request: pytest.FixtureRequest) -> str:
    """A fresh prefix a channel can dial before a hub serves it (it says hello until one does)."""
    return hub_url(request)


# --- brokers with a TLS listener ---------------------------------------------------------------


def _tls_settings(certs: Path) -> Any:
    from tensorwire.transports.security import TLS

    return TLS(cert=certs / "hub.pem", key=certs / "hub.key", ca=certs / "ca.pem")


def _tls_broker(request: pytest.FixtureRequest, certs: Path) -> Any:
    """The session's broker with a TLS listener on ``certs``' hub.pem, and the two users."""
    pytest.importorskip("paho.mqtt", reason="paho-mqtt is not installed (extra 'mqtt')")
    from tensorwire.transports.brokers.mosquitto import MosquittoBroker

    if str(certs) not in _tls_brokers:
        try:
            broker = MosquittoBroker(tls=_tls_settings(certs), users=_passwords).start()
        except MissingDependency as exc:
            pytest.skip(str(exc))
        request.config.add_cleanup(broker.stop)
        _tls_brokers[str(certs)] = broker
    return _tls_brokers[str(certs)]


def _trusting_certs(request: pytest.FixtureRequest) -> Path:
    """Certificates for the TLS runs of the conformance suite, whose CA this test trusts as
    the system's (``SSL_CERT_FILE``): its clients connect with no ``tls=``, as to a broker
    with a public certificate, and so do the peers it starts."""
    pytest.importorskip("cryptography", reason="cryptography is not installed")
    from tensorwire.transports.certs import make_certs

    if not _own_certs:
        directory = request.getfixturevalue("tmp_path_factory").mktemp("mqtts-certs")
        _own_certs.append(make_certs(directory, hosts=["127.0.0.1", "localhost"], clients=[]))
    e = _own_certs[0]
    before = os.environ.get("SSL_CERT_FILE")
    os.environ["SSL_CERT_FILE"] = str(e.ca)

    def restore() -> None:
        if before is None:
            os.environ.pop("SSL_CERT_FILE", None)
        else:
            os.environ["SSL_CERT_FILE"] = before

    request.addfinalizer(restore)
    return Path(e.directory)


def tls_hub_url(request: pytest.FixtureRequest) -> str:
    """A fresh prefix on the session's TLS broker, as ``mqtts://`` with the user in it."""
    return _tls_broker(request, _trusting_certs(request)).url(_prefix(), user=USER)


class PrivateBroker:
    """A started Mosquitto of one test's own, that keeps its state on disk across restarts."""

    def __init__(self, broker: Any) -> None:
        self.broker = broker  # a MosquittoBroker

    def hub_url(self) -> str:
        """A URL with a fresh topic prefix on this broker."""
        return self.broker.url(_prefix(), user=USER if self.broker.users else None)

    def restart(self, down_s: float) -> None:
        """Stop it (it saves sessions and queued messages), stay down ``down_s`` seconds, start
        it again on the same port and data directory."""
        self.broker.restart(down_s)


def private_broker(request: pytest.FixtureRequest, tls: bool = False) -> PrivateBroker:
    """A private persistent Mosquitto for this test, stopped when it ends (``tls``: with a TLS
    listener and the users, as ``mqtts``' runs have it)."""
    pytest.importorskip("paho.mqtt", reason="paho-mqtt is not installed (extra 'mqtt')")
    from tensorwire.transports.brokers.mosquitto import MosquittoBroker

    options: dict[str, Any] = {}
    if tls:
        options = {"tls": _tls_settings(_trusting_certs(request)), "users": _passwords}
    try:
        broker = MosquittoBroker(persistence=True, **options).start()
    except MissingDependency as exc:
        pytest.skip(str(exc))
    request.addfinalizer(broker.stop)
    return PrivateBroker(broker)


# --- a raw client of the broker ----------------------------------------------------------------


class _Raw:
    """A raw paho client on the broker of ``url``: TLS if the URL says so or ``ca`` is given
    (then checked against it), logged in as ``user`` (default: the URL's); publishes at QoS 1
    and keeps what comes on the topics it subscribes to (the first 1000 payloads)."""

    def __init__(self, url: str, user: str | None = None, ca: Any = None) -> None:
        import paho.mqtt.client as paho
        from paho.mqtt.enums import CallbackAPIVersion

        from tensorwire.transports.mqtt import MqttSettings
        from tensorwire.transports.security import TLS

        self.settings = s = MqttSettings.from_url(url, tls=ca is not None)
        self.got: list[tuple[str, bytes]] = []
        self._subscribed = threading.Event()
        self._client = paho.Client(
            CallbackAPIVersion.VERSION2, client_id=f"tw-raw-{uuid.uuid4().hex[:8]}"
        )
        if s.tls:
            self._client.tls_set_context(TLS(ca=ca).client_context())
        if user is not None:
            self._client.username_pw_set(user, _passwords[user])
        elif s.username is not None:
            self._client.username_pw_set(s.username, s.password)
        self._client.on_message = self._keep
        self._client.on_subscribe = lambda *_: self._subscribed.set()
        self._client.connect(s.host, s.port)
        self._client.loop_start()
        self._sent: list[Any] = []

    def _keep(self, _c: Any, _u: Any, m: Any) -> None:
        if len(self.got) < 1000:
            self.got.append((m.topic, m.payload))

    def subscribe(self, topic: str) -> None:
        self._subscribed.clear()
        self._client.subscribe(topic, qos=1)
        assert self._subscribed.wait(T), "the broker did not confirm the subscription"

    def publish(self, topic: str, payload: bytes) -> None:
        self._sent.append(self._client.publish(topic, payload, qos=1))

    def close(self) -> None:
        for info in self._sent:
            info.wait_for_publish(T)
        self._client.disconnect()
        self._client.loop_stop()


def inject_garbage(hub_url: str) -> None:
    """As a raw paho client, publish junk on a stranger's uplink (bytes that are no chunk, then
    a chunk that holds no message) and on a control topic."""
    from tensorwire.wire import iter_chunks

    stranger = _Raw(hub_url)
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
    for obj in gc.get_objects():  # type(), not isinstance: that reads a stray object's
        # __class__, which some announce as deprecated (torch.distributed.reduce_op)
        if type(obj) is MqttHub and obj.settings.prefix == prefix:
            hubs.append(obj.hub_id)
        elif (
            type(obj) is MqttChannel
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

    from tensorwire.transports.broker import one_chunk as _one_chunk
    from tensorwire.transports.mqtt.will import will as _will
    from tensorwire.transports.session import ClientSession, HubSession, bye
    from tensorwire.wire import encode_message

    stranger = _Raw(hub_url)
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


# --- the security suite ------------------------------------------------------------------------


def secure_hub_url(request: pytest.FixtureRequest, enrolment: Any, scheme: str = "mqtt") -> str:
    """A fresh prefix on the session's TLS broker for ``enrolment``'s hub.pem, logged in as
    the hub's user; ``mqtt://`` (TLS from the ``tls=`` the suite passes) or ``mqtts://``.
    Another user of the broker watches its uplinks from now on (for :func:`replay_last`)."""
    broker = _tls_broker(request, Path(enrolment.directory))
    url = broker.url(_prefix(), user=USER)
    if scheme == "mqtt":
        url = url.replace("mqtts://", "mqtt://", 1)
    spy = _Raw(url, user=OTHER, ca=enrolment.ca)
    spy.subscribe(spy.settings.up("+", "+"))
    _spies[spy.settings.prefix] = spy

    def stop() -> None:
        _spies.pop(spy.settings.prefix, None)
        spy.close()

    request.addfinalizer(stop)
    return url


def proxy_target(hub_url: str) -> tuple[str, int]:
    """Where a recording proxy forwards a client's connection to: the broker's TLS port."""
    from tensorwire.transports.mqtt import MqttSettings

    s = MqttSettings.from_url(hub_url, tls=True)
    return s.host, s.port


def proxied_url(hub_url: str, port: int) -> str:
    """The hub's URL with the broker reached through a proxy on 127.0.0.1:``port`` (the name
    the client checks in the broker's certificate: 127.0.0.1 is in it)."""
    parts = urlsplit(hub_url)
    user = parts.netloc.rpartition("@")[0]
    return urlunsplit(parts._replace(netloc=(f"{user}@" if user else "") + f"127.0.0.1:{port}"))


def replay_last(hub_url: str, enrolment: Any) -> None:
    """As another user of the broker, publish the last sealed payload a client published under
    the hub's prefix again: once as it was, once with one byte flipped."""
    from tensorwire.transports.mqtt import MqttSettings

    prefix = MqttSettings.from_url(hub_url).prefix
    spy = _spies[prefix]
    sealed: list[tuple[str, bytes]] = []
    deadline = time.monotonic() + T
    while not sealed and time.monotonic() < deadline:
        sealed = [(t, p) for t, p in spy.got if p.endswith(b"TWMA")]  # the MAC trailer's end
        time.sleep(0.02)
    assert sealed, "no client published a sealed payload that another user could see"
    topic, payload = sealed[-1]
    altered = bytearray(payload)
    altered[len(altered) // 2] ^= 0x01
    spy.publish(topic, payload)
    spy.publish(topic, bytes(altered))
    for info in spy._sent:
        info.wait_for_publish(T)
