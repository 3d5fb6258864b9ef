"""mqtt:// beyond the conformance suite: URLs, chunking, QoS, fan-out, wills, broker limits,
the session on topics, and brokers that go away and come back."""

from __future__ import annotations

import shutil
import signal
import struct
import subprocess
import sys
import threading
import time
import uuid

import numpy as np
import pytest

pytest.importorskip("paho.mqtt", reason="paho-mqtt is not installed (extra 'mqtt')")

import tensorwire
from tensorwire.errors import (
    AuthenticationError,
    MissingDependency,
    PeerGone,
    TransportError,
    TransportTimeout,
)
from tensorwire.transports.broker import one_chunk as _one_chunk
from tensorwire.transports.brokers.mosquitto import MosquittoBroker, ensure_mosquitto
from tensorwire.transports.mqtt import (
    DEFAULT_CHUNK_BYTES,
    DEFAULT_TLS_PORT,
    WILL_GRACE_S,
    MqttSettings,
)
from tensorwire.transports.security import TLS
from tensorwire.transports.session import ClientSession
from tensorwire.wire import decode_message, parse_chunk

T = 20.0


@pytest.fixture(scope="module")
def broker():
    """``mqtt://host:port`` of the local Mosquitto, or of a private one."""
    try:
        with ensure_mosquitto("mqtt://127.0.0.1:1883") as url:
            yield url.rstrip("/")
    except MissingDependency as exc:
        pytest.skip(str(exc))


@pytest.fixture
def prefix() -> str:
    return f"twtest-{uuid.uuid4().hex[:10]}"


def _private(**options) -> MosquittoBroker:
    try:
        return MosquittoBroker(**options).start()
    except MissingDependency as exc:
        pytest.skip(str(exc))


def _until(condition, timeout: float = T) -> bool:
    """Poll ``condition`` every 20 ms until it holds (True) or ``timeout`` seconds pass."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


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
        assert _until(lambda: len(self.got) >= n), f"{len(self.got)} of {n} messages came"
        return [decode_message(parse_chunk(payload)[1]) for _, payload in self.got[:n]]

    def close(self) -> None:
        self._client.disconnect()
        self._client.loop_stop()


def test_url_settings():
    s = MqttSettings.from_url(
        "mqtt://al%40ice:s%3Acret@broker.example:1999/fl/exp1?qos=2&chunk=4096"
    )
    assert (s.host, s.port, s.username, s.password) == ("broker.example", 1999, "al@ice", "s:cret")
    assert (s.prefix, s.qos, s.chunk_bytes) == ("fl/exp1", 2, 4096)
    assert (
        s.up("dev1", "s1") == "fl/exp1/up/dev1/s1" and s.ctl("dev1", "s1") == "fl/exp1/ctl/dev1/s1"
    )
    assert s.down() == "fl/exp1/down" and s.down("dev1", "s1") == "fl/exp1/down/dev1/s1"
    assert s.hub("h1") == "fl/exp1/hub/h1" and s.hub() == "fl/exp1/hub/+"
    d = MqttSettings.from_url("mqtt://localhost", qos=0)
    assert (d.port, d.prefix, d.qos, d.chunk_bytes, d.username) == (
        1883,
        "tensorwire",
        0,
        DEFAULT_CHUNK_BYTES,
        None,
    )
    for bad in ("qos=3", "chunk=10", "qos=x", "retain=1"):
        with pytest.raises(TransportError):
            MqttSettings.from_url(f"mqtt://h:1/p?{bad}")
    with pytest.raises(TransportError, match="prefix"):
        MqttSettings.from_url("mqtt://h:1/exp/+")


def test_client_id_must_be_a_topic_level(broker, prefix):
    with pytest.raises(TransportError, match="topic level"):
        tensorwire.connect(f"{broker}/{prefix}", client_id="a/b", timeout=1)


@pytest.mark.parametrize("qos", [0, 1, 2])
def test_many_chunks_both_directions_at_every_qos(broker, prefix, qos):
    url = f"{broker}/{prefix}?qos={qos}&chunk=4096"
    arr = np.random.default_rng(qos).standard_normal(20_000)  # 160 kB: ~40 chunks
    with (
        tensorwire.serve(url, codec=None) as hub,
        tensorwire.connect(url, client_id="c", codec=None, timeout=T) as ch,
    ):
        hub.wait_for(1, timeout=T)
        hub.send("c", {"a": arr}, timeout=T)
        assert ch.recv(timeout=T)["a"].tobytes() == arr.tobytes()
        ch.send({"b": arr[::-1]}, timeout=T)
        cid, msg = hub.recv(timeout=T)
        assert cid == "c" and msg["b"].tobytes() == arr[::-1].tobytes()


def test_broadcast_is_one_publish_on_the_broadcast_topic(broker, prefix):
    import paho.mqtt.client as paho
    from paho.mqtt.enums import CallbackAPIVersion

    url = f"{broker}/{prefix}?chunk=8192"
    s = MqttSettings.from_url(url)
    seen: list[tuple[str, int, int]] = []  # (topic, message id, chunk count) per chunk
    subscribed = threading.Event()
    spy = paho.Client(CallbackAPIVersion.VERSION2, client_id=f"tw-spy-{uuid.uuid4().hex[:8]}")

    def spy_on(_c: object, _u: object, m: paho.MQTTMessage) -> None:
        head = parse_chunk(m.payload)[0]
        seen.append((m.topic, head.message_id, head.count))

    spy.on_message = spy_on
    spy.on_subscribe = lambda *_: subscribed.set()
    spy.connect(s.host, s.port)
    spy.loop_start()
    spy.subscribe(f"{s.prefix}/down/#", qos=1)
    assert subscribed.wait(T)
    try:
        with tensorwire.serve(url, codec=None) as hub:
            chans = [tensorwire.connect(url, client_id=f"d{i}", timeout=T) for i in range(3)]
            hub.wait_for(3, timeout=T)
            records = hub.broadcast({"w": np.zeros(4096)}, timeout=T)  # 32 KiB: 5 chunks
            assert sorted(records) == ["d0", "d1", "d2"]
            for ch in chans:
                assert ch.recv(timeout=T)["w"].shape == (4096,)
                ch.close()
    finally:
        spy.disconnect()
        spy.loop_stop()
    assert len(seen) > 1 and len(set(seen)) == 1  # every chunk of one message ...
    topic, _, count = seen[0]
    assert topic == s.down() and len(seen) == count  # ... published once, for all


def test_a_hub_callback_may_send(broker, prefix):
    url = f"{broker}/{prefix}"
    hubs: list[tensorwire.Hub] = []
    with tensorwire.serve(
        url, on_join=lambda c: hubs[0].send(c, {"hi": np.ones(2)}, timeout=T)
    ) as hub:
        hubs.append(hub)
        with tensorwire.connect(url, client_id="c", timeout=T) as ch:
            assert np.array_equal(ch.recv(timeout=T)["hi"], np.ones(2))


def test_a_killed_client_is_announced_by_its_will(broker, prefix):
    url = f"{broker}/{prefix}"
    left: list[tuple[str, str]] = []
    gone = threading.Event()

    def on_leave(cid: str, reason: str) -> None:
        left.append((cid, reason))
        gone.set()

    with tensorwire.serve(url, on_leave=on_leave) as hub:
        code = (
            f"import tensorwire, time; tensorwire.connect({url!r}, client_id='doomed'); "
            "time.sleep(60)"
        )
        proc = subprocess.Popen([sys.executable, "-c", code])
        try:
            hub.wait_for(1, timeout=T)
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(T)
        assert gone.wait(WILL_GRACE_S + T)  # it had the grace to come back, and did not
        assert left == [("doomed", "connection lost")] and hub.clients == []


def test_hub_closing_ends_the_clients_session(broker, prefix):
    url = f"{broker}/{prefix}"
    hub = tensorwire.serve(url)
    ch = tensorwire.connect(url, client_id="c", timeout=T)
    hub.wait_for(1, timeout=T)
    hub.close()
    with pytest.raises(PeerGone):
        ch.recv(timeout=T)
    with pytest.raises(PeerGone):
        ch.send({"v": np.zeros(1)})


def test_a_client_with_no_hub_times_out_saying_so(broker, prefix):
    with pytest.raises(TransportTimeout, match="no hub welcomed"):
        tensorwire.connect(f"{broker}/{prefix}", client_id="alone", timeout=0.5)


def test_no_broker_times_out_naming_the_fix():
    with pytest.raises(TransportTimeout, match="mosquitto"):
        tensorwire.connect("mqtt://127.0.0.1:1/x", timeout=0.3)


def test_chunks_fit_the_maximum_packet_the_broker_announces(prefix):
    try:
        broker = MosquittoBroker(settings={"max_packet_size": "65536"}).start()
    except MissingDependency as exc:
        pytest.skip(str(exc))
    url = broker.url(prefix)
    try:
        with (
            tensorwire.serve(url, codec=None) as hub,
            tensorwire.connect(url, client_id="c", codec=None, timeout=T) as ch,
        ):
            assert hub._connection.max_packet == 65536 and ch._connection.max_packet == 65536
            assert hub._connection.chunk_payload(hub.settings.down(), 1 << 20) < 65536
            hub.wait_for(1, timeout=T)
            arr = np.arange(1 << 17, dtype=np.float64)  # 1 MiB: over the limit as one packet
            hub.send("c", {"a": arr}, timeout=T)
            assert np.array_equal(ch.recv(timeout=T)["a"], arr)
            ch.send({"a": arr}, timeout=T)
            assert np.array_equal(hub.recv(timeout=T)[1]["a"], arr)
    finally:
        broker.stop()


def test_username_and_password_from_the_url(tmp_path, prefix):
    passwd = shutil.which("mosquitto_passwd")
    if passwd is None:
        pytest.skip("mosquitto_passwd is not installed (package mosquitto)")
    users = tmp_path / "passwd"
    subprocess.run([passwd, "-b", "-c", str(users), "alice", "s3cret"], check=True)
    settings = {"allow_anonymous": "false", "password_file": str(users)}
    try:
        broker = MosquittoBroker(settings=settings).start()
    except MissingDependency as exc:
        pytest.skip(str(exc))
    try:
        with pytest.raises(TransportError, match="user and password"):
            tensorwire.serve(f"mqtt://alice:wrong@127.0.0.1:{broker.port}/{prefix}")
        url = f"mqtt://alice:s3cret@127.0.0.1:{broker.port}/{prefix}"
        with (
            tensorwire.serve(url) as hub,
            tensorwire.connect(hub.url, client_id="c", timeout=T) as ch,
        ):
            hub.wait_for(1, timeout=T)
            ch.send({"v": np.arange(3)})
            assert hub.recv(timeout=T)[0] == "c"
    finally:
        broker.stop()


def test_a_killed_hub_ends_the_session_once_its_will_goes_unanswered(broker, prefix):
    url = f"{broker}/{prefix}"
    code = (
        f"import tensorwire, time; h = tensorwire.serve({url!r}); print('up', flush=True); "
        "time.sleep(60)"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "up"
        ch = tensorwire.connect(url, client_id="orphan", timeout=T)
    finally:
        proc.kill()
        proc.wait(T)
    t0 = time.monotonic()
    with pytest.raises(PeerGone, match="did not answer"):
        ch.recv(timeout=WILL_GRACE_S + T)
    assert time.monotonic() - t0 < WILL_GRACE_S + 5
    with pytest.raises(PeerGone):
        ch.send({"v": np.zeros(1)})
    ch.close()


def test_a_repeated_hello_is_welcomed_again_and_joins_once(broker, prefix):
    url = f"{broker}/{prefix}"
    with tensorwire.serve(url) as hub:
        raw = _Raw(url)
        s = raw.settings
        session = ClientSession("raw", decoders=[], max_message_bytes=1 << 20)
        raw.subscribe(s.ctl("raw", session.session))
        hello = session.hello()
        for _ in range(3):  # each publish under a fresh message id, as a client repeats it
            raw.publish(s.up("raw", session.session), _one_chunk(hello))
        welcomes = raw.messages(3)
        raw.close()
        assert all(w.kind == "welcome" for w in welcomes)
        assert {(w.meta["session"], w.meta["hub"]) for w in welcomes} == {
            (session.session, hub.hub_id)
        }
        assert _until(lambda: [e.kind for e in hub.events] == ["joined"])  # one join, once
        assert hub.clients == ["raw"] and [e.kind for e in hub.events] == ["joined"]


def test_a_hello_on_another_clients_topics_is_refused(broker, prefix):
    url = f"{broker}/{prefix}"
    with tensorwire.serve(url) as hub:
        raw = _Raw(url)
        s = raw.settings
        session = ClientSession("mallory", decoders=[], max_message_bytes=1 << 20)
        raw.subscribe(s.ctl("alice", session.session))
        raw.publish(s.up("alice", session.session), _one_chunk(session.hello()))
        (refusal,) = raw.messages(1)
        raw.close()
        assert refusal.kind == "refuse" and refusal.meta["code"] == "refused"
        assert "must name both" in refusal.meta["reason"]
        assert hub.clients == []
        assert _until(lambda: [e.kind for e in hub.events] == ["refused"])


def test_a_broker_that_keeps_no_sessions_is_ridden_out(prefix):
    broker = _private()  # no persistence: a restart forgets every session and subscription
    url = broker.url(prefix)
    try:
        with (
            tensorwire.serve(url, codec=None) as hub,
            tensorwire.connect(url, client_id="d0", codec=None, timeout=T) as ch,
        ):
            hub.wait_for(1, timeout=T)
            broker.restart(1.0)
            assert _until(lambda: any(e.kind == "medium-back" for e in hub.events))
            back = next(e for e in hub.events if e.kind == "medium-back")
            assert "lost our session" in back.reason  # messages in flight may be lost: said
            # at once: the send waits until d0 said hello again, so it has subscribed again
            hub.send("d0", {"v": np.arange(3)}, timeout=T)
            assert np.array_equal(ch.recv(timeout=T)["v"], np.arange(3))
            ch.send({"v": np.arange(2)}, timeout=T)
            assert hub.recv(timeout=T)[0] == "d0"
            assert _until(lambda: "d0" not in hub._graces)  # came back in time
            assert hub.clients == ["d0"]
            assert [e.kind for e in hub.events] == ["joined", "medium-lost", "medium-back"]
    finally:
        broker.stop()


def test_a_client_gone_while_a_sessionless_broker_was_down_is_dropped_after_the_grace(prefix):
    broker = _private()
    url = broker.url(prefix)
    try:
        with (
            tensorwire.serve(url, codec=None) as hub,
            tensorwire.connect(url, client_id="stays", timeout=T),
        ):
            gone = tensorwire.connect(url, client_id="vanishes", timeout=T)
            hub.wait_for(2, timeout=T)
            restart = threading.Thread(target=broker.restart, args=(2.0,))
            restart.start()
            assert _until(lambda: not gone._connection.up)
            gone._drop()  # dies while the broker is down: its will is never published
            restart.join(T)
            assert _until(lambda: hub.clients == ["stays"], WILL_GRACE_S + T)

            def left() -> list[tuple[str | None, str]]:
                return [(e.client_id, e.reason) for e in hub.events if e.kind == "left"]

            assert _until(left)  # recorded just after the member is let go
            assert left() == [("vanishes", "did not come back after the broker lost its sessions")]
    finally:
        broker.stop()


def test_a_broadcast_during_an_outage_fails_at_its_deadline_and_is_never_delivered(prefix):
    broker = _private(persistence=True)
    url = broker.url(prefix)
    try:
        with (
            tensorwire.serve(url, codec=None) as hub,
            tensorwire.connect(url, client_id="c", codec=None, timeout=T) as ch,
        ):
            hub.wait_for(1, timeout=T)
            restart = threading.Thread(target=broker.restart, args=(3.0,))
            restart.start()
            assert _until(lambda: not hub._connection.up)
            t0 = time.monotonic()
            lost = hub.broadcast({"v": np.arange(3)}, meta={"r": "lost"}, timeout=1.0)
            assert 0.9 < time.monotonic() - t0 < 3.0
            assert not lost and isinstance(lost.failed["c"], TransportTimeout)
            assert "unreachable" in str(lost.failed["c"])
            sent = hub.broadcast({"v": np.arange(3)}, meta={"r": "after"}, timeout=T)  # waits
            restart.join(T)
            assert sorted(sent) == ["c"]
            assert ch.recv(timeout=T).meta == {"r": "after"}
            with pytest.raises(TransportTimeout):
                ch.recv(timeout=1.0)
            assert hub.clients == ["c"]
    finally:
        broker.stop()


# --- security: TLS to the broker, keys, MACs ---------------------------------------------------


def test_mqtts_urls_and_tls_settings():
    s = MqttSettings.from_url("mqtts://h/p")
    assert (s.tls, s.port) == (True, DEFAULT_TLS_PORT)
    assert MqttSettings.from_url("mqtt://h/p", tls=True).port == DEFAULT_TLS_PORT
    assert MqttSettings.from_url("mqtt://h:1884/p", tls=True).port == 1884
    assert not MqttSettings.from_url("mqtt://h/p").tls
    with pytest.raises(TransportError, match="secret") as info:  # names the security options too
        MqttSettings.from_url("mqtt://alice:hunter2@h/p?colour=blue")
    assert "hunter2" not in str(info.value) and "alice:***@h" in str(info.value)
    with pytest.raises(TransportError, match="mqtts://"):
        MqttSettings.from_url("amqp://h/p")


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    pytest.importorskip("cryptography", reason="cryptography is not installed")
    from tensorwire.transports.certs import make_certs

    return make_certs(
        tmp_path_factory.mktemp("mqtt-certs"),
        hosts=["127.0.0.1", "localhost"],
        clients=["dev1", "dev2"],
    )


USERS = {"tw": "tw-" + uuid.uuid4().hex, "mallory": "m-" + uuid.uuid4().hex}


def _broker_tls(certs) -> TLS:
    return TLS(cert=certs.hub_cert, key=certs.hub_key, ca=certs.ca)


@pytest.fixture(scope="module")
def tls_broker(certs):
    """A private broker with a TLS listener and two users: ``tw`` (hub and clients) and
    ``mallory`` (another user of the broker)."""
    broker = _private(tls=_broker_tls(certs), users=USERS)
    yield broker
    broker.stop()


def _hub(url: str, certs, **options) -> tensorwire.Hub:
    return tensorwire.serve(
        url, tls=TLS(ca=certs.ca), auth=tensorwire.Keys.load(certs.keys), codec=None, **options
    )


def _channel(url: str, certs, cid: str = "dev1", **options) -> tensorwire.Channel:
    options = {"tls": TLS(ca=certs.ca), "key": certs.devices[cid]["secret"], **options}
    return tensorwire.connect(url, client_id=cid, codec=None, timeout=T, **options)


def _mallory(broker: MosquittoBroker, certs, prefix: str) -> _Raw:
    """Another user of the broker, on TLS."""
    return _Raw(broker.url(prefix), user="mallory", password=USERS["mallory"], ca=certs.ca)


def _trailer_entries(payload: bytes) -> int:
    """How many MACs a sealed payload's trailer holds (docs/security.md)."""
    _seq, n, magic = struct.unpack("<QH4s", payload[-14:])
    assert magic == b"TWMA"
    return n


def test_a_secured_session_seals_everything_and_a_broadcast_once_for_all(tls_broker, certs, prefix):
    url = tls_broker.url(prefix, user="tw")
    spy = _mallory(tls_broker, certs, prefix)
    spy.subscribe(f"{prefix}/#")
    arr = np.arange(300_000, dtype=np.float64)  # 2.4 MB: three chunks
    with _hub(url, certs) as hub, _channel(url, certs) as d1, _channel(url, certs, "dev2") as d2:
        hub.wait_for(2, timeout=T)
        hub.broadcast({"a": arr}, timeout=T)
        for ch in (d1, d2):
            assert np.array_equal(ch.recv(timeout=T)["a"], arr)
        hub.send("dev1", {"b": arr[:10]}, timeout=T)
        assert np.array_equal(d1.recv(timeout=T)["b"], arr[:10])
        d1.send({"c": arr[:5]}, timeout=T)
        assert np.array_equal(hub.recv(timeout=T)[1]["c"], arr[:5])
        assert hub.errors.total == d1.errors.total == d2.errors.total == 0
    spy.close()
    down = [p for t, p in spy.got if t == f"{prefix}/down"]
    assert len(down) == 3 and all(_trailer_entries(p) == 2 for p in down)
    unicast = [p for t, p in spy.got if t.startswith(f"{prefix}/down/dev1/")]
    assert unicast and all(_trailer_entries(p) == 1 for p in unicast)
    ups = [(t, p) for t, p in spy.got if t.startswith(f"{prefix}/up/dev1/")]
    kinds = []
    for _, p in ups:  # hellos in clear (the first and its repeats), the rest sealed
        if p.endswith(b"TWMA"):
            kinds.append("sealed")
        else:
            kinds.append(decode_message(parse_chunk(p)[1]).kind)
    first_sealed = kinds.index("sealed")
    assert set(kinds[:first_sealed]) == {"hello"} and set(kinds[first_sealed:]) == {"sealed"}


def test_another_broker_user_cannot_end_or_suspend_a_secured_session(tls_broker, certs, prefix):
    from tensorwire.transports.mqtt.will import will as _will
    from tensorwire.transports.session import bye

    url = tls_broker.url(prefix, user="tw")
    with _hub(url, certs) as hub, _channel(url, certs) as ch:
        hub.wait_for(1, timeout=T)
        mallory = _mallory(tls_broker, certs, prefix)
        s, sid = mallory.settings, ch._session.session
        mallory.publish(s.up("dev1", sid), _one_chunk(_will("forged")))  # would start a grace
        mallory.publish(s.up("dev1", sid), _one_chunk(bye("forged")))  # would end the session
        mallory.publish(s.hub(hub.hub_id), _one_chunk(bye("forged")))  # would end it here
        mallory.close()
        assert _until(lambda: hub.errors.total >= 2 and ch.errors.total >= 1)
        assert "dev1" not in hub._graces and hub.clients == ["dev1"]
        hub.send("dev1", {"v": np.arange(3)}, timeout=T)
        assert np.array_equal(ch.recv(timeout=T)["v"], np.arange(3))
        ch.send({"v": np.arange(2)}, timeout=T)
        assert hub.recv(timeout=T)[0] == "dev1"
        assert [e.kind for e in hub.events] == ["joined"]


def test_a_replayed_hello_is_welcomed_but_does_not_vouch_for_its_client(tls_broker, certs, prefix):
    url = tls_broker.url(prefix, user="tw")
    spy = _mallory(tls_broker, certs, prefix)
    spy.subscribe(f"{prefix}/up/+/+")
    with _hub(url, certs) as hub, _channel(url, certs) as ch:
        hub.wait_for(1, timeout=T)
        with hub._lock:  # as if its will had come
            hub._graces.suspect("dev1", "connection lost", time.monotonic() + 60)
        assert _until(lambda: spy.got)  # the spy's copy of the hello may come after the join
        topic, hello = spy.got[0]
        spy.subscribe(spy.settings.ctl("dev1", ch._session.session))
        spy.publish(topic, hello)  # the opening hello, replayed
        assert _until(lambda: any("/ctl/" in t for t, _ in spy.got))  # answered ...
        time.sleep(0.2)
        assert "dev1" in hub._graces  # ... but the grace goes on
        with ch._cond:  # the client itself asks (sealed): that vouches for it
            ch._ask(time.monotonic() + WILL_GRACE_S)
            ch._cond.notify_all()
        assert _until(lambda: "dev1" not in hub._graces)
        assert hub.errors.total == ch.errors.total == 0
    spy.close()


def test_a_forged_welcome_does_not_open_a_secured_session(tls_broker, certs, prefix):
    from tensorwire.wire import encode_message

    url = tls_broker.url(prefix, user="tw")
    mallory = _mallory(tls_broker, certs, prefix)
    mallory.subscribe(f"{prefix}/up/+/+")
    got: dict[str, object] = {}

    def client() -> None:
        got["ch"] = _channel(url, certs)

    t = threading.Thread(target=client)
    t.start()
    assert _until(lambda: mallory.got)
    sid = decode_message(parse_chunk(mallory.got[0][1])[1]).meta["session"]
    forged = {"version": 2, "decoders": [], "max_message_bytes": 1 << 20, "hub": "evil"}
    forged_auth = {"nonce": b"\x00" * 16, "proof": b"\x00" * 32}
    for auth in ({}, {"auth": forged_auth}):
        welcome = encode_message(None, {**forged, **auth, "session": sid}, kind="welcome")
        mallory.publish(mallory.settings.ctl("dev1", sid), _one_chunk(welcome))
    time.sleep(0.5)
    with _hub(url, certs) as hub:
        t.join(T)
        ch = got["ch"]
        assert isinstance(ch, tensorwire.Channel) and ch.errors.total >= 2
        hub.wait_for(1, timeout=T)
        hub.send("dev1", {"v": np.arange(2)}, timeout=T)
        assert np.array_equal(ch.recv(timeout=T)["v"], np.arange(2))
        ch.close()
    mallory.close()


def test_data_sent_before_the_welcome_is_held_until_it_can_be_checked(
    tls_broker, certs, prefix, monkeypatch
):
    from tensorwire.transports.mqtt import MqttHub

    welcome = MqttHub._welcome

    def late_welcome(self, cid, client, sealed):  # the data from on_join overtakes it
        time.sleep(0.3)
        welcome(self, cid, client, sealed)

    monkeypatch.setattr(MqttHub, "_welcome", late_welcome)
    url = tls_broker.url(prefix, user="tw")
    hubs: list[tensorwire.Hub] = []
    with _hub(url, certs, on_join=lambda c: hubs[0].send(c, {"hi": np.ones(2)}, timeout=T)) as hub:
        hubs.append(hub)
        with _channel(url, certs) as ch:
            assert np.array_equal(ch.recv(timeout=T)["hi"], np.ones(2))
            assert ch.errors.total == 0


def test_duplicates_resends_and_replays_of_sealed_payloads():
    import itertools

    from tensorwire.transports.broker import unsealed as _unsealed
    from tensorwire.transports.security import ReplayWindow, Sealer
    from tensorwire.wire import encode_message

    key = bytes(range(32))
    sealer = Sealer([key], b"dev1", itertools.count())
    chunks = [_one_chunk(encode_message(None, {"n": i})) for i in range(2)]
    first, second = (c + sealer([c]) for c in chunks)
    window = ReplayWindow()
    assert _unsealed(second, key, b"dev1", window, False) is not None
    # paho sends a payload again after a reconnect, with its number: one that never came is new
    assert bytes(_unsealed(first, key, b"dev1", window, False)) == chunks[0]
    assert _unsealed(first, key, b"dev1", window, True) is None  # the broker's redelivery
    with pytest.raises(AuthenticationError, match="replayed"):
        _unsealed(first, key, b"dev1", window, False)  # the same, as someone else publishes it
    altered = bytearray(first)
    altered[50] ^= 1
    with pytest.raises(AuthenticationError, match="MAC"):
        _unsealed(bytes(altered), key, b"dev1", window, True)
    with pytest.raises(AuthenticationError):
        _unsealed(second, key, b"dev2", ReplayWindow(), False)  # another sender's name


def test_a_killed_secured_client_is_announced_by_its_sealed_will(tls_broker, certs, prefix):
    url = tls_broker.url(prefix, user="tw")
    files = certs.devices["dev1"]
    left: list[tuple[str, str]] = []
    gone = threading.Event()

    def on_leave(cid: str, reason: str) -> None:
        left.append((cid, reason))
        gone.set()

    with _hub(url, certs, on_leave=on_leave) as hub:
        code = (
            "import tensorwire, time; tensorwire.connect("
            f"{url!r}, client_id='dev1', tls=tensorwire.TLS(ca={str(certs.ca)!r}), "
            f"key={str(files['secret'])!r}); time.sleep(60)"
        )
        proc = subprocess.Popen([sys.executable, "-c", code])
        try:
            hub.wait_for(1, timeout=T)
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(T)
        assert gone.wait(WILL_GRACE_S + T)
        assert left == [("dev1", "connection lost")] and hub.errors.total == 0


def test_a_secured_session_rides_out_a_broker_restart(certs, prefix):
    broker = _private(tls=_broker_tls(certs), users=USERS, persistence=True)
    url = broker.url(prefix, user="tw")
    try:
        with _hub(url, certs) as hub, _channel(url, certs) as ch:
            hub.wait_for(1, timeout=T)
            broker.restart(1.0)  # Mosquitto publishes every will as it stops: sealed ones
            assert _until(lambda: any(e.kind == "medium-back" for e in hub.events))
            hub.send("dev1", {"v": np.arange(3)}, timeout=T)
            assert np.array_equal(ch.recv(timeout=T)["v"], np.arange(3))
            ch.send({"v": np.arange(2)}, timeout=T)
            assert hub.recv(timeout=T)[0] == "dev1"
            assert _until(lambda: "dev1" not in hub._graces)
            time.sleep(0.5)  # late duplicates, if any, are dropped silently
            assert hub.errors.total == ch.errors.total == 0
            assert [e.kind for e in hub.events] == ["joined", "medium-lost", "medium-back"]
    finally:
        broker.stop()


def test_a_second_session_proving_the_same_secret_replaces_the_first(tls_broker, certs, prefix):
    url = tls_broker.url(prefix, user="tw")
    with _hub(url, certs) as hub, _channel(url, certs) as old:
        hub.wait_for(1, timeout=T)
        with _channel(url, certs) as new:
            assert _until(lambda: [e.kind for e in hub.events] == ["joined", "replaced"])
            assert hub._peers["dev1"].sid == new._session.session != old._session.session
            hub.send("dev1", {"v": np.arange(2)}, timeout=T)
            assert np.array_equal(new.recv(timeout=T)["v"], np.arange(2))


def test_the_broker_certificate_name_is_checked(tls_broker, certs, prefix):
    url = tls_broker.url(prefix, user="tw")
    with _hub(url, certs):
        ch = _channel(url, certs)  # the URL's host, 127.0.0.1, is in the certificate
        ch.close()
        with pytest.raises(AuthenticationError, match="certificate"):
            _channel(url, certs, tls=TLS(ca=certs.ca, server_name="elsewhere.example"))
        ch = _channel(url, certs, tls=TLS(ca=certs.ca, server_name="localhost"))
        ch.close()
        with pytest.raises(AuthenticationError, match="not trust"):
            tensorwire.connect(url, client_id="dev1", timeout=T)  # the system's CAs


def test_a_tls_hub_without_keys_says_it_admits_anyone(tls_broker, certs, prefix, caplog):
    import logging

    with caplog.at_level(logging.WARNING, logger="tensorwire"):
        tensorwire.serve(tls_broker.url(prefix, user="tw"), tls=_broker_tls(certs)).close()
    said = [r.getMessage() for r in caplog.records if "ANYONE" in r.getMessage()]
    assert said and USERS["tw"] not in said[0]


def test_local_hub_url_runs_a_tls_broker_for_a_secured_hub(certs):
    from tensorwire.transports.local import local_hub_url
    from tensorwire.transports.security import credentials_from_dir

    with local_hub_url("mqtt", secure=certs.directory) as url:
        assert url.startswith("mqtts://127.0.0.1:")
        with (
            tensorwire.serve(
                url, codec=None, **credentials_from_dir(certs.directory, "hub")
            ) as hub,
            tensorwire.connect(
                hub.url,
                client_id="dev2",
                timeout=T,
                **credentials_from_dir(certs.directory, "channel", "dev2"),
            ) as ch,
        ):
            hub.wait_for(1, timeout=T)
            assert hub.protocol == ch.protocol == "mqtts"
            hub.send("dev2", {"v": np.arange(2)}, timeout=T)
            assert np.array_equal(ch.recv(timeout=T)["v"], np.arange(2))


def test_a_secured_hub_closing_ends_the_session_with_its_sealed_bye(tls_broker, certs, prefix):
    url = tls_broker.url(prefix, user="tw")
    hub = _hub(url, certs)
    ch = _channel(url, certs)
    hub.wait_for(1, timeout=T)
    hub.close()
    with pytest.raises(PeerGone, match="closed the session"):
        ch.recv(timeout=T)
    assert ch.errors.total == 0
    ch.close()
