"""mqtt:// beyond the conformance suite, unsecured: URLs, chunking, QoS, fan-out, wills, broker
limits, the session on topics, and brokers that go away and come back."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
import uuid

import numpy as np
import pytest

pytest.importorskip("paho.mqtt", reason="paho-mqtt is not installed (extra 'mqtt')")

from mqtt_helpers import (
    T,
    _private,
    _Raw,
    fixture_prefix,  # noqa: F401  (a fixture: prefix)
)
from waiting import until

import tensorwire
from tensorwire.errors import (
    MissingDependency,
    PeerGone,
    TransportError,
    TransportTimeout,
)
from tensorwire.transports.broker import one_chunk as _one_chunk
from tensorwire.transports.brokers.mosquitto import MosquittoBroker, ensure_mosquitto
from tensorwire.transports.mqtt import (
    DEFAULT_CHUNK_BYTES,
    WILL_GRACE_S,
    MqttSettings,
)
from tensorwire.transports.session import ClientSession
from tensorwire.wire import encode_message, parse_chunk


@pytest.fixture(scope="module")
def broker():
    """``mqtt://host:port`` of the local Mosquitto, or of a private one."""
    try:
        with ensure_mosquitto("mqtt://127.0.0.1:1883") as url:
            yield url.rstrip("/")
    except MissingDependency as exc:
        pytest.skip(str(exc))


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
        assert until(lambda: [e.kind for e in hub.events] == ["joined"])  # one join, once
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
        assert until(lambda: [e.kind for e in hub.events] == ["refused"])


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
            assert until(lambda: any(e.kind == "medium-back" for e in hub.events))
            back = next(e for e in hub.events if e.kind == "medium-back")
            assert "lost our session" in back.reason  # messages in flight may be lost: said
            # at once: the send waits until d0 said hello again, so it has subscribed again
            hub.send("d0", {"v": np.arange(3)}, timeout=T)
            assert np.array_equal(ch.recv(timeout=T)["v"], np.arange(3))
            ch.send({"v": np.arange(2)}, timeout=T)
            assert hub.recv(timeout=T)[0] == "d0"
            assert until(lambda: "d0" not in hub._graces)  # came back in time
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
            assert until(lambda: not gone._connection.up)
            gone._drop()  # dies while the broker is down: its will is never published
            restart.join(T)
            assert until(lambda: hub.clients == ["stays"], WILL_GRACE_S + T)

            def left() -> list[tuple[str | None, str]]:
                return [(e.client_id, e.reason) for e in hub.events if e.kind == "left"]

            assert until(left)  # recorded just after the member is let go
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
            assert until(lambda: not hub._connection.up)
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


def test_a_big_message_on_a_session_the_hub_does_not_know_says_so(broker, prefix):
    # a device the hub has forgotten (its will came, or the hub restarted) sends its update:
    # read under the hello limits, the error names the missing session, not only the size
    url = f"{broker}/{prefix}"
    with tensorwire.serve(url) as hub:
        raw = _Raw(url)
        s = raw.settings
        update = encode_message({"w": np.ones(30_000, np.float32)})  # 120 KB: past 64 KiB
        raw.publish(s.up("gone", uuid.uuid4().hex), _one_chunk(update))
        raw.close()
        assert until(lambda: hub.errors), "the hub said nothing of the message"
        who, exc = hub.errors[0]
        assert who == "gone" and "no session open here" in str(exc)
        assert hub.clients == []
