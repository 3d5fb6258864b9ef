"""mqtt:// secured: users and passwords on the broker, TLS to it, keys and MACs; forged,
replayed and duplicated session messages from another user of the broker; a secured session
through kills, restarts and a second session."""

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

from mqtt_helpers import (
    T,
    _private,
    _Raw,
    fixture_prefix,  # noqa: F401  (a fixture: prefix)
)
from waiting import until

import tensorwire
from tensorwire.errors import (
    AuthenticationError,
    MissingDependency,
    PeerGone,
    TransportError,
)
from tensorwire.transports.broker import one_chunk as _one_chunk
from tensorwire.transports.brokers.mosquitto import MosquittoBroker
from tensorwire.transports.mqtt import (
    DEFAULT_TLS_PORT,
    WILL_GRACE_S,
    MqttSettings,
)
from tensorwire.transports.security import TLS
from tensorwire.wire import decode_message, parse_chunk


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
        assert until(lambda: hub.errors.total >= 2 and ch.errors.total >= 1)
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
        assert until(lambda: spy.got)  # the spy's copy of the hello may come after the join
        topic, hello = spy.got[0]
        spy.subscribe(spy.settings.ctl("dev1", ch._session.session))
        spy.publish(topic, hello)  # the opening hello, replayed
        assert until(lambda: any("/ctl/" in t for t, _ in spy.got))  # answered ...
        time.sleep(0.2)
        assert "dev1" in hub._graces  # ... but the grace goes on
        with ch._cond:  # the client itself asks (sealed): that vouches for it
            ch._ask(time.monotonic() + WILL_GRACE_S)
            ch._cond.notify_all()
        assert until(lambda: "dev1" not in hub._graces)
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
    assert until(lambda: mallory.got)
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
            assert until(lambda: any(e.kind == "medium-back" for e in hub.events))
            hub.send("dev1", {"v": np.arange(3)}, timeout=T)
            assert np.array_equal(ch.recv(timeout=T)["v"], np.arange(3))
            ch.send({"v": np.arange(2)}, timeout=T)
            assert hub.recv(timeout=T)[0] == "dev1"
            assert until(lambda: "dev1" not in hub._graces)
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
            assert until(lambda: [e.kind for e in hub.events] == ["joined", "replaced"])
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
