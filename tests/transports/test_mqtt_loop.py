"""mqtt:// channels of one process on one network loop: one thread for all of them (none per
channel), a connection that dies, a broker that hangs or lies to one connection, and a flood on
one channel leave the others running; the last channel to close ends the thread; a forked
child makes its own loop."""

from __future__ import annotations

import multiprocessing
import socket
import threading
import time
from collections.abc import Iterator

import pytest

pytest.importorskip("paho.mqtt", reason="paho-mqtt is not installed (extra 'mqtt')")

from mqtt_helpers import T, _private, _Raw, fixture_prefix  # noqa: F401  (a fixture: prefix)
from waiting import until

import tensorwire
from tensorwire.errors import TransportError
from tensorwire.transports.mqtt import loop as loops

LOOP = "tensorwire-mqtt-loop"


@pytest.fixture(scope="module", name="broker")
def fixture_broker() -> Iterator:
    broker = _private()
    yield broker
    broker.stop()


def _threads(name: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(name) and t.is_alive()]


def _loops() -> list[threading.Thread]:
    return [t for t in _threads(LOOP) if t.name == LOOP]  # not its dialer


def _connect(url: str, n: int, first: int = 0) -> list[tensorwire.Channel]:
    return [
        tensorwire.connect(url, client_id=f"d{i}", codec=None, timeout=T)
        for i in range(first, first + n)
    ]


def _round_trip(hub, channels, tag: int) -> None:
    """A broadcast every channel receives, and a reply from each the hub gathers."""
    hub.broadcast(meta={"tag": tag}, timeout=T)
    for ch in channels:
        assert ch.recv(timeout=T).meta == {"tag": tag}
        ch.send(meta={"from": ch.client_id, "tag": tag}, timeout=T)
    got = sorted(hub.recv(timeout=T)[0] for _ in channels)
    assert got == sorted(ch.client_id for ch in channels)


def test_a_process_channels_share_one_thread_which_ends_with_the_last(broker, prefix):
    with tensorwire.serve(broker.url(prefix), codec=None) as hub:
        before = threading.active_count()
        channels = _connect(hub.url, 30)
        try:
            hub.wait_for(30, timeout=T)
            assert len(_loops()) == 1  # one network thread for all 30, their timers too
            assert not _threads("paho-mqtt-client")
            assert threading.active_count() - before <= 2  # the loop (and a passing dialer)
            _round_trip(hub, channels, 1)
        finally:
            for ch in channels:
                ch.close()
        assert until(lambda: not _loops())  # the last channel ended it
        again = _connect(hub.url, 1, first=30)  # a new one starts a new loop
        try:
            assert len(_loops()) == 1
            _round_trip(hub, again, 2)
        finally:
            again[0].close()


def test_one_connection_dying_does_not_stop_the_others_on_its_loop(broker, prefix):
    with tensorwire.serve(broker.url(prefix), codec=None) as hub:
        channels = _connect(hub.url, 5)
        try:
            hub.wait_for(5, timeout=T)
            victim = channels[0]._connection
            assert victim is not None and victim.connects == 1
            victim.client.socket().shutdown(socket.SHUT_RDWR)  # its peer died under it
            _round_trip(hub, channels[1:], 1)  # the others go on meanwhile
            assert until(lambda: victim.connects == 2 and victim.up)  # dialled again
            # back in its session: what the broker kept for it meanwhile comes first
            assert channels[0].recv(timeout=T).meta == {"tag": 1}
            _round_trip(hub, channels, 2)
            assert sorted(hub.clients) == sorted(ch.client_id for ch in channels)
        finally:
            for ch in channels:
                ch.close()


@pytest.mark.parametrize("lie", [None, b"\xff" * 64], ids=["hangs", "lies"])
def test_a_broker_that_hangs_or_lies_to_one_channel_holds_up_no_other(broker, prefix, lie):
    """A 'broker' that accepts and says nothing, or garbage (paho ends that connection and
    the loop dials again): that channel's connect fails in its time; the others, on the same
    loop, keep their round trips quick meanwhile."""
    fake = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []

    def serve_fake() -> None:
        fake.settimeout(0.2)
        for _ in range(200):  # bounded: 40 s at most
            try:
                conn, _ = fake.accept()
            except TimeoutError:
                continue
            except OSError:
                return  # closed
            held.append(conn)
            if lie is not None:
                conn.sendall(lie)

    threading.Thread(target=serve_fake, daemon=True).start()
    port = fake.getsockname()[1]
    with tensorwire.serve(broker.url(prefix), codec=None) as hub:
        channels = _connect(hub.url, 3)
        try:
            hub.wait_for(3, timeout=T)
            failed: list[Exception] = []

            def doomed() -> None:
                try:
                    tensorwire.connect(f"mqtt://127.0.0.1:{port}/{prefix}", codec=None, timeout=3)
                except TransportError as exc:
                    failed.append(exc)

            attempt = threading.Thread(target=doomed)
            attempt.start()
            slowest, tag = 0.0, 0
            while attempt.is_alive() and tag < 100:
                tag += 1
                t = time.monotonic()
                _round_trip(hub, channels, tag)
                slowest = max(slowest, time.monotonic() - t)
            attempt.join(T)
            assert len(failed) == 1, "the connect to a broker that never let it in failed"
            assert tag >= 2 and slowest < 2.0, f"{tag} round trips, the slowest {slowest:.2f} s"
            assert held  # it did reach the fake
            _round_trip(hub, channels, tag + 1)
        finally:
            fake.close()
            for conn in held:
                conn.close()
            for ch in channels:
                ch.close()


def test_a_flood_on_one_channel_does_not_starve_the_others(broker, prefix):
    with tensorwire.serve(broker.url(prefix), codec=None) as hub:
        channels = _connect(hub.url, 3)
        raw = _Raw(hub.url)
        try:
            hub.wait_for(3, timeout=T)
            flooded = channels[0]
            topic = hub.settings.down(flooded.client_id, flooded._session.session)
            stop = threading.Event()

            def flood() -> None:
                for i in range(20_000):  # bounded; junk the channel drops
                    if stop.is_set():
                        return
                    raw._client.publish(topic, b"junk %d" % i, qos=0)

            flooder = threading.Thread(target=flood, daemon=True)
            flooder.start()
            try:
                for tag in range(5):
                    t = time.monotonic()
                    _round_trip(hub, channels[1:], tag)
                    assert time.monotonic() - t < 5.0
            finally:
                stop.set()
                flooder.join(T)
            for tag in range(5):  # the flooded one got every broadcast through the junk
                assert flooded.recv(timeout=T).meta == {"tag": tag}
            _round_trip(hub, channels, 99)
        finally:
            raw.close()
            for ch in channels:
                ch.close()


def _child(url: str, done: multiprocessing.Queue) -> None:
    try:
        with tensorwire.connect(url, client_id="child", codec=None, timeout=T) as ch:
            parent_loop = loops._shared.get(multiprocessing.parent_process().pid)  # type: ignore[union-attr]
            ch.send(meta={"own_loop": ch._connection.loop is not parent_loop}, timeout=T)
        done.put("ok")
    except Exception as exc:  # reported to the parent, which asserts on it
        done.put(f"{type(exc).__name__}: {exc}")


def test_a_forked_child_makes_its_own_loop(broker, prefix):
    with tensorwire.serve(broker.url(prefix), codec=None) as hub:
        (parent,) = _connect(hub.url, 1)
        try:
            hub.wait_for(1, timeout=T)
            ctx = multiprocessing.get_context("fork")
            done = ctx.Queue()
            proc = ctx.Process(target=_child, args=(hub.url, done))
            proc.start()
            assert done.get(timeout=T) == "ok"
            proc.join(T)
            who, msg = hub.recv(timeout=T)
            assert who == "child" and msg.meta == {"own_loop": True}
            _round_trip(hub, [parent], 1)  # the parent's loop is untouched
        finally:
            parent.close()
