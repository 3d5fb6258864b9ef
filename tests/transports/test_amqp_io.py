"""amqp:// devices of one process share one I/O thread (issue #27: a thread per device was 100
threads per process handing the interpreter lock around), each keeping its own broker
connection, credentials and queue; one device's connection dying, or its callback failing,
does not stop the others."""

from __future__ import annotations

import socket
import threading

import numpy as np
import pytest

pytest.importorskip("pika", reason="pika is not installed (extra 'amqp')")

from waiting import until

import tensorwire
from tensorwire.transports.amqp import ioloop

SCHEME = __import__("amqp_helpers").SCHEME
T = 60.0  # seconds: joins on a loaded 2-core machine


@pytest.fixture(name="url")
def fixture_url(request) -> str:
    return SCHEME.private_broker(request).hub_url()  # the session's private node


def _amqp_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("tensorwire-amqp")]


def _round(hub, chans) -> None:
    """A broadcast that every channel receives, and a reply from each that the hub gets."""
    hub.broadcast({"w": np.arange(1000, dtype=np.float32)}, timeout=T)
    for ch in chans:
        assert ch.recv(timeout=T)["w"].shape == (1000,)
        ch.send({"id": np.array([int(ch.client_id[1:])])}, timeout=T)
    got = {hub.recv(timeout=T)[0] for _ in chans}
    assert got == {ch.client_id for ch in chans}


def test_devices_of_one_process_share_one_io_thread_and_keep_a_connection_each(url):
    with tensorwire.serve(url, codec=None) as hub:
        before = _amqp_threads()
        chans = [tensorwire.connect(hub.url, client_id=f"d{i}", timeout=T) for i in range(30)]
        try:
            hub.wait_for(len(chans), timeout=T)
            added = [n for n in _amqp_threads() if n not in before]
            assert added in ([], ["tensorwire-amqp-io"]), added  # none per device
            assert [t.name for t in threading.enumerate()].count("tensorwire-amqp-io") == 1
            conns = {id(ch._link.conn) for ch in chans}
            assert len(conns) == len(chans)  # one broker connection per device
            assert len({ch._queue for ch in chans}) == len(chans)
            _round(hub, chans)
        finally:
            for ch in chans:
                ch.close()
        assert until(lambda: not hub.clients, timeout=T)


def _cut(ch) -> None:
    """End the device's TCP connection under pika's feet (as a reset would), on the I/O
    thread that owns it."""
    sock = ch._link.conn._transport._sock
    ioloop.shared().call(lambda: sock.shutdown(socket.SHUT_RDWR))


def test_one_devices_connection_dying_does_not_stop_the_others(url):
    with tensorwire.serve(url, codec=None) as hub:
        chans = [tensorwire.connect(hub.url, client_id=f"d{i}", timeout=T) for i in range(4)]
        try:
            hub.wait_for(len(chans), timeout=T)
            cut, others = chans[0], chans[1:]
            first = cut._link.conn
            _cut(cut)
            _round(hub, others)  # the others go on meanwhile
            # the cut device reconnects by itself, says hello again, and is a member still
            assert until(lambda: cut._link.conn not in (None, first), timeout=T)
            assert until(lambda: cut._rehello_at is None, timeout=T)
            _round(hub, chans)
            assert sorted(hub.clients) == sorted(ch.client_id for ch in chans)
        finally:
            for ch in chans:
                ch.close()


def test_a_failing_callback_reconnects_only_its_device(url):
    with tensorwire.serve(url, codec=None) as hub:
        chans = [tensorwire.connect(hub.url, client_id=f"d{i}", timeout=T) for i in range(3)]
        try:
            hub.wait_for(len(chans), timeout=T)
            bad = chans[0]
            first = bad._link.conn
            real = bad._take
            failed: list[int] = []

            def take_once(*args):
                if not failed:
                    failed.append(1)
                    raise RuntimeError("a bug in the device's callback")
                return real(*args)

            bad._take = take_once
            hub.send("d0", {"v": np.arange(5)}, timeout=T)  # acknowledged, dropped by the bug
            assert until(lambda: failed and bad._link.conn not in (None, first), timeout=T)
            assert until(lambda: bad._link._ready, timeout=T)
            _round(hub, chans)  # the device goes on, and so did the others
        finally:
            for ch in chans:
                ch.close()


def test_a_flood_of_devices_in_one_process_adds_no_thread_per_device(url):
    with tensorwire.serve(url, codec=None) as hub:
        before = threading.active_count()
        chans: list = []
        joiners = [
            threading.Thread(
                target=lambda i=i: chans.append(
                    tensorwire.connect(hub.url, client_id=f"f{i}", timeout=T)
                )
            )
            for i in range(100)
        ]
        try:
            for t in joiners:
                t.start()
            for t in joiners:
                t.join(T)
            hub.wait_for(100, timeout=T)
            assert threading.active_count() - before <= 1  # the I/O thread, if it is new
            hub.broadcast({"w": np.ones(1 << 16, np.float32)}, timeout=T)
            assert all(ch.recv(timeout=T)["w"].size == 1 << 16 for ch in chans)
        finally:
            for ch in chans:
                ch.close()
