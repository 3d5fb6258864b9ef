"""tensorwire.transports.brokers.mosquitto: probe (in clear and over TLS), private broker lifecycle
(restarts, persistence, TLS listeners and users included, its owner killed), ensure_mosquitto."""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import struct
import threading
import time
from typing import Any

import numpy as np
import pytest
from killed_owner import killed_owner, wait_until
from waiting import until

import tensorwire
from tensorwire.errors import AuthenticationError, MissingDependency, TransportError
from tensorwire.transports.brokers import ports
from tensorwire.transports.brokers.mosquitto import (
    MosquittoBroker,
    ensure_mosquitto,
    find_mosquitto,
    mosquitto_answers,
)
from tensorwire.transports.security import TLS

T = 20.0

try:
    find_mosquitto()
except MissingDependency as exc:
    pytest.skip(str(exc), allow_module_level=True)


def _closed_port() -> int:
    with socket.create_server(("127.0.0.1", 0)) as s:
        return s.getsockname()[1]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie is gone too
        return f.read().split()[2] != "Z"


def test_probe_says_no_to_nothing_and_to_a_server_that_is_not_mqtt():
    assert not mosquitto_answers("127.0.0.1", _closed_port(), timeout=0.5)
    with socket.create_server(("127.0.0.1", 0)) as server:

        def talk_nonsense() -> None:
            conn, _ = server.accept()
            with conn:
                conn.recv(100)
                conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")

        t = threading.Thread(target=talk_nonsense)
        t.start()
        assert not mosquitto_answers("127.0.0.1", server.getsockname()[1], timeout=2)
        t.join(T)


def test_private_broker_serves_a_round_trip_then_leaves_nothing_behind():
    pytest.importorskip("paho.mqtt", reason="paho-mqtt is not installed (extra 'mqtt')")
    with MosquittoBroker() as broker:
        pid, directory = broker.pid, broker.dir
        assert pid is not None and directory is not None and directory.is_dir()
        conf = (directory / "mosquitto.conf").read_text()
        assert f"listener {broker.port} 127.0.0.1" in conf and "persistence false" in conf
        assert mosquitto_answers("127.0.0.1", broker.port)
        with (
            tensorwire.serve(broker.url("roundtrip")) as hub,
            tensorwire.connect(hub.url, client_id="c", timeout=T) as ch,
        ):
            hub.wait_for(1, timeout=T)
            hub.send("c", {"v": np.arange(10)})
            assert np.array_equal(ch.recv(timeout=T)["v"], np.arange(10))
            ch.send({"w": np.ones(3)})
            assert hub.recv(timeout=T)[0] == "c"
    assert not _alive(pid)
    assert not directory.exists()
    assert not mosquitto_answers("127.0.0.1", broker.port, timeout=0.5)


def test_private_broker_on_a_given_port():
    given: list[int] = []

    def on_a_port_given() -> MosquittoBroker:  # given free, so maybe taken before it binds:
        given.append(ports.free_port("127.0.0.1"))  # the brokers' own retry on a clash
        return MosquittoBroker(given[-1]).start()

    broker = ports.start_on_free_ports(on_a_port_given, lambda: None, "test")
    try:
        assert broker.port == given[-1] and mosquitto_answers("127.0.0.1", broker.port)
    finally:
        broker.stop()


def test_ensure_uses_the_broker_that_answers_and_starts_one_otherwise():
    with MosquittoBroker() as running:
        url = f"mqtt://127.0.0.1:{running.port}/exp"
        with ensure_mosquitto(url) as got:
            assert got == url
    dead = _closed_port()
    with ensure_mosquitto(f"mqtt://u:p@127.0.0.1:{dead}/exp?qos=2") as got:
        port = int(got.split("@")[1].split("/")[0].split(":")[1])
        limit = f"connection_max={MosquittoBroker().limits.connections}"  # the private one's
        assert port != dead and got == f"mqtt://u:p@127.0.0.1:{port}/exp?qos=2&{limit}"
        assert mosquitto_answers("127.0.0.1", port)
    assert not mosquitto_answers("127.0.0.1", port, timeout=0.5)


def test_missing_binary_says_how_to_install():
    with pytest.raises(MissingDependency, match="apt-get install mosquitto"):
        MosquittoBroker(binary="mosquitto-not-installed-here").start()


def test_a_broker_that_cannot_start_reports_its_log_and_cleans_up():
    broker = MosquittoBroker(settings={"no_such_option": "1"})
    with pytest.raises(TransportError, match="no_such_option"):
        broker.start()
    assert broker.dir is None and broker.pid is None


def test_a_persistent_broker_restarts_on_its_port_and_directory_and_keeps_sessions():
    pytest.importorskip("paho.mqtt", reason="paho-mqtt is not installed (extra 'mqtt')")
    import paho.mqtt.client as paho
    from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.properties import Properties

    got: list[bytes] = []
    present: list[bool] = []
    acked = threading.Event()

    def client(name: str) -> paho.Client:
        c = paho.Client(
            CallbackAPIVersion.VERSION2, client_id=name, protocol=MQTTProtocolVersion.MQTTv5
        )
        c.on_connect = lambda _c, _u, flags, _r, _p: present.append(flags.session_present)
        c.on_message = lambda _c, _u, m: got.append(m.payload)
        c.on_subscribe = lambda *_: acked.set()
        return c

    props = Properties(PacketTypes.CONNECT)
    props.SessionExpiryInterval = 60
    with MosquittoBroker(persistence=True) as broker:
        port, directory, pid = broker.port, broker.dir, broker.pid
        assert directory is not None
        conf = (directory / "mosquitto.conf").read_text()
        assert "persistence true" in conf and f"persistence_location {directory}/" in conf
        sub = client("tw-sub")
        sub.connect("127.0.0.1", port, clean_start=False, properties=props)
        sub.loop_start()
        sub.subscribe("t/#", qos=1)
        assert acked.wait(T)
        sub.disconnect()  # the session stays, for its expiry
        sub.loop_stop()
        broker.restart(0.5)
        assert (broker.port, broker.dir) == (port, directory) and broker.pid != pid
        assert not _alive(pid) and mosquitto_answers("127.0.0.1", port)
        pub = client("tw-pub")
        pub.connect("127.0.0.1", port)
        pub.loop_start()
        pub.publish("t/x", b"queued while away", qos=1).wait_for_publish(T)
        pub.disconnect()
        pub.loop_stop()
        sub.connect("127.0.0.1", port, clean_start=False, properties=props)
        sub.loop_start()
        deadline = time.monotonic() + T
        while not got and time.monotonic() < deadline:
            time.sleep(0.02)
        sub.disconnect()
        sub.loop_stop()
    assert got == [b"queued while away"] and present[-1] is True
    assert not directory.exists()


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    pytest.importorskip("cryptography", reason="cryptography is not installed")
    from tensorwire.transports.certs import make_certs

    return make_certs(tmp_path_factory.mktemp("certs"), hosts=["127.0.0.1"], clients=["dev1"])


def _tls(certs) -> TLS:
    return TLS(cert=certs.hub_cert, key=certs.hub_key, ca=certs.ca)


def test_a_tls_broker_with_users_serves_mqtts_and_refuses_strangers(certs):
    pytest.importorskip("paho.mqtt", reason="paho-mqtt is not installed (extra 'mqtt')")
    users = {"alice": "s3c:ret@", "bob": "other"}
    with MosquittoBroker(tls=_tls(certs), users=users) as broker:
        assert broker.dir is not None
        conf = (broker.dir / "mosquitto.conf").read_text()
        for line in (
            f"listener {broker.port} 127.0.0.1",
            f"certfile {certs.hub_cert}",
            f"keyfile {certs.hub_key}",
            f"cafile {certs.ca}",
            "tls_version tlsv1.3",
            "require_certificate false",
            "allow_anonymous false",
            f"password_file {broker.dir / 'passwd'}",
        ):
            assert line in conf
        passwd = broker.dir / "passwd"
        assert passwd.stat().st_mode & 0o077 == 0 and "s3c:ret@" not in passwd.read_text()
        limit = f"connection_max={broker.limits.connections}"
        assert broker.url("p") == f"mqtts://127.0.0.1:{broker.port}/p?{limit}"
        url = broker.url("p", user="alice")
        assert url == f"mqtts://alice:s3c%3Aret%40@127.0.0.1:{broker.port}/p?{limit}"
        with pytest.raises(TransportError, match="not a user"):
            broker.url("p", user="carol")
        assert mosquitto_answers("127.0.0.1", broker.port)  # over TLS, refused or not
        with pytest.raises(AuthenticationError, match="user and password"):
            tensorwire.serve(url.replace("s3c%3Aret%40", "wrong"), tls=TLS(ca=certs.ca))
        with (
            tensorwire.serve(url, tls=TLS(ca=certs.ca)) as hub,
            tensorwire.connect(hub.url, client_id="c", tls=TLS(ca=certs.ca), timeout=T) as ch,
        ):
            hub.wait_for(1, timeout=T)
            ch.send({"v": np.arange(3)})
            assert hub.recv(timeout=T)[0] == "c"


def test_without_mosquitto_passwd_the_password_file_is_hashed_the_same_way(certs, monkeypatch):
    pytest.importorskip("paho.mqtt", reason="paho-mqtt is not installed (extra 'mqtt')")
    from tensorwire.transports.brokers import mosquitto

    monkeypatch.setattr(mosquitto, "find_mosquitto_passwd", lambda: None)
    with MosquittoBroker(users={"alice": "pw"}) as broker:
        assert broker.dir is not None
        assert (broker.dir / "passwd").read_text().startswith("alice:$7$101$")
        url = broker.url("p", user="alice")
        with tensorwire.serve(url) as hub, tensorwire.connect(url, client_id="c", timeout=T):
            hub.wait_for(1, timeout=T)
        with pytest.raises(AuthenticationError):
            tensorwire.serve(url.replace(":pw@", ":no@"))


def test_a_broker_that_requires_client_certificates(certs):
    pytest.importorskip("paho.mqtt", reason="paho-mqtt is not installed (extra 'mqtt')")
    dev = certs.devices["dev1"]
    device_tls = TLS(cert=dev["cert"], key=dev["key"], ca=certs.ca)
    with pytest.raises(TransportError, match="ca="):
        MosquittoBroker(tls=TLS(cert=certs.hub_cert, key=certs.hub_key), require_certificate=True)
    with MosquittoBroker(tls=_tls(certs), require_certificate=True) as broker:
        assert mosquitto_answers("127.0.0.1", broker.port)
        assert "require_certificate true" in (broker.dir / "mosquitto.conf").read_text()
        with pytest.raises(TransportError):  # no certificate: the broker hangs up
            tensorwire.serve(broker.url("p"), tls=TLS(ca=certs.ca), timeout=2)
        with (
            tensorwire.serve(broker.url("p"), tls=device_tls) as hub,
            tensorwire.connect(hub.url, client_id="c", tls=device_tls, timeout=T),
        ):
            hub.wait_for(1, timeout=T)


def test_the_probe_tells_a_tls_broker_from_a_tls_server_that_is_not_one(certs):
    import ssl

    ctx = TLS(cert=certs.hub_cert, key=certs.hub_key).server_context()
    with socket.create_server(("127.0.0.1", 0)) as server:

        def talk_https() -> None:
            for _ in range(2):  # the probe tries in clear, then over TLS
                conn, _ = server.accept()
                with (
                    contextlib.suppress(OSError, ssl.SSLError),
                    ctx.wrap_socket(conn, server_side=True) as tls,
                ):
                    tls.recv(100)
                    tls.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")

        t = threading.Thread(target=talk_https)
        t.start()
        assert not mosquitto_answers("127.0.0.1", server.getsockname()[1], timeout=2)
        t.join(T)


def test_a_private_broker_ends_when_the_process_that_started_it_is_killed():
    """SIGKILL gives its owner no chance to stop it: the broker's reaper does, and removes
    its directory."""
    code = (
        "from tensorwire.transports.brokers.mosquitto import MosquittoBroker; import time\n"
        "b = MosquittoBroker().start(); print(b.pid, b.dir, flush=True); time.sleep(120)"
    )
    with killed_owner(code, T) as (pid_text, directory):
        pid = int(pid_text)
        assert _alive(pid) and os.path.isdir(directory)
    deadline = time.monotonic() + T
    wait_until(lambda: not _alive(pid), deadline)
    if _alive(pid):
        os.kill(pid, 9)
        pytest.fail(f"the broker outlived its killed owner by {T} s")
    wait_until(lambda: not os.path.exists(directory), deadline)  # removed right after it ended
    assert not os.path.exists(directory), "the killed owner's broker directory stayed"


_IP_LOCAL_PORT_RANGE = 51  # Linux 6.3+: the ports a socket's connect() may pick from, lo | hi << 16


def _connect_from(port: int, server: socket.socket) -> None:
    """Connect to ``server`` from 127.0.0.1:``port``, the one local port the kernel may pick
    (as any connection's pick would be, the port being free): ``OSError`` if it is not free.
    Skips where the kernel lacks ``IP_LOCAL_PORT_RANGE``."""
    with socket.socket() as conn:
        try:
            only = struct.pack("=I", port | port << 16)
            conn.setsockopt(socket.IPPROTO_IP, _IP_LOCAL_PORT_RANGE, only)
        except OSError:
            pytest.skip("no IP_LOCAL_PORT_RANGE here (Linux 6.3+)")
        conn.connect(server.getsockname())
        assert conn.getsockname()[1] == port  # it did take it


def _lingering(port: int) -> bool:
    """Whether a connection ended on 127.0.0.1:``port``'s side lingers there in TIME_WAIT:
    the kernel then keeps the port from connect()'s picks by itself, held or not."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            rows = [line.split() for line in f.readlines()[1:]]
        if any(row[1].endswith(f":{port:04X}") and row[3] == "06" for row in rows):
            return True
    return False


def test_a_restart_holds_the_port_while_the_broker_is_down_and_it_answers_after():
    """Down for a restart, the broker keeps its port: no connection takes it as its local end
    (one did, and the restart failed: "Error: Address already in use") and nothing else binds
    it; it answers on it again after. A round in which a TIME_WAIT (a probe's, say) kept the
    port anyway proves nothing, and another is run (4 in all)."""
    with MosquittoBroker() as broker, socket.create_server(("127.0.0.1", 0)) as server:
        port, failed = broker.port, []

        def restart() -> None:
            try:
                broker.restart(2.0)
            except BaseException as exc:  # said below
                failed.append(exc)

        for _ in range(4):
            thread = threading.Thread(target=restart, daemon=True)
            thread.start()
            try:  # down (2 s) once its process is gone; not probed: that could leave a TIME_WAIT
                assert until(lambda: broker.pid is None, timeout=T), "the broker did not stop"
                kept_anyway = _lingering(port)  # none starts while nothing listens
                with pytest.raises(OSError) as taken:  # none left to pick: EADDRNOTAVAIL
                    _connect_from(port, server)
                assert taken.value.errno in (errno.EADDRNOTAVAIL, errno.EADDRINUSE), taken.value
                with socket.socket() as other, pytest.raises(OSError, match="in use"):
                    other.bind(("127.0.0.1", port))
                assert broker.pid is None, "the broker was back before its port was tried"
            finally:
                thread.join(T + 2.0)
            assert not thread.is_alive() and not failed, f"the restart failed: {failed}"
            assert mosquitto_answers("127.0.0.1", port)
            if not kept_anyway:
                break


def test_a_restart_whose_listener_cannot_bind_fails_at_once_with_the_log_line(monkeypatch):
    """Were its port taken while it was down, the restart says Mosquitto's error, not a
    timeout, and the broker is torn down."""
    broker = MosquittoBroker(startup_timeout=60).start()
    taker, taken = socket.socket(), []
    taker.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # past the TIME_WAITs
    end = broker._end_process

    def end_then_take() -> None:  # as a program that bound the port meanwhile would
        end()
        if not taken:  # once (stop() ends it too)
            taken.append(broker.port)
            broker._held.release()
            taker.bind(("127.0.0.1", broker.port))
            taker.listen()

    monkeypatch.setattr(broker, "_end_process", end_then_take)
    try:
        started = time.monotonic()
        with pytest.raises(TransportError, match=r"did not start: .*Address already in use"):
            broker.restart()
        assert time.monotonic() - started < 30 and broker.dir is None and broker.pid is None
    finally:
        taker.close()
        broker.stop()


def _burst_to_a_slow_subscriber(broker: MosquittoBroker, count: int) -> int:
    """``count`` QoS 1 messages of 100 KiB published at once to an MQTT 5 subscriber (Receive
    Maximum 65,535, as a hub's) that takes 1 ms over each; how many it got."""
    import paho.mqtt.client as mqtt
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.properties import Properties

    got = [0]

    def on_message(client: Any, userdata: Any, message: Any) -> None:
        got[0] += 1
        time.sleep(0.001)  # the slow reader under test, not a wait for a state

    sub = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="hub", protocol=mqtt.MQTTv5)
    props = Properties(PacketTypes.CONNECT)
    props.ReceiveMaximum = 65_535
    sub.on_message = on_message
    pub = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="devices", protocol=mqtt.MQTTv5)
    pub.max_inflight_messages_set(65_535)
    subscribed = threading.Event()
    sub.on_subscribe = lambda *a: subscribed.set()
    try:
        sub.connect("127.0.0.1", broker.port, properties=props)
        sub.subscribe("up/#", qos=1)
        sub.loop_start()
        assert subscribed.wait(T)
        pub.connect("127.0.0.1", broker.port)
        pub.loop_start()
        payload = bytes(100 << 10)  # a device's reply: the broker's socket to the hub fills
        infos = [pub.publish(f"up/{i}", payload, qos=1) for i in range(count)]
        for info in infos:  # every one taken by the broker
            info.wait_for_publish(T)
        # then until the subscriber has them all, or nothing came for a second (dropped)
        last, seen = time.monotonic(), -1
        while got[0] < count and time.monotonic() - last < 1.0:
            if got[0] != seen:
                last, seen = time.monotonic(), got[0]
            until(lambda s=seen: got[0] != s, timeout=0.2)  # type: ignore[misc]
        return got[0]
    finally:
        for client in (pub, sub):
            client.loop_stop()
            client.disconnect()


def test_a_private_broker_queues_a_burst_to_a_slow_hub_that_mosquittos_default_drops():
    count = 2000
    with MosquittoBroker(devices=100, settings={"max_queued_messages": "1000"}) as default:
        assert _burst_to_a_slow_subscriber(default, count) < count  # the default drops
    with MosquittoBroker(devices=100) as sized:
        assert _burst_to_a_slow_subscriber(sized, count) == count
