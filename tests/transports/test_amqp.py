"""amqp:// specifics: names under a prefix, native fan-out, chunking, start order, cleanup, a
broker that cannot be reached or refuses the credentials, and one that freezes or goes away."""

from __future__ import annotations

import os
import signal
import threading
import time
import uuid

import numpy as np
import pytest

pika = pytest.importorskip("pika", reason="pika is not installed (extra 'amqp')")

from amqp_helpers import (  # noqa: E402
    BROKER,
    SCHEME,
    T,
    _chunks,
    _events,
    fixture_broker,  # noqa: F401  (a fixture: broker)
    fixture_url,  # noqa: F401  (a fixture: url)
)
from waiting import until  # noqa: E402

import tensorwire  # noqa: E402
from tensorwire.errors import (  # noqa: E402
    ChunkError,
    PeerGone,
    TransportError,
    TransportTimeout,
)
from tensorwire.transports import amqp  # noqa: E402
from tensorwire.transports.amqp import connection as amqp_connection  # noqa: E402
from tensorwire.transports.amqp import hub as amqp_hub  # noqa: E402
from tensorwire.transports.base import deadline_after  # noqa: E402
from tensorwire.transports.url import with_option  # noqa: E402
from tensorwire.wire import encode_message  # noqa: E402


@pytest.fixture
def private(request):
    """The session's private RabbitMQ node, which these tests may freeze and restart."""
    return SCHEME.private_broker(request)


def _exists(kind: str, name: str) -> bool:
    """Whether the broker has a queue or exchange of that name (a passive declare)."""
    conn = pika.BlockingConnection(pika.URLParameters(BROKER))
    try:
        ch = conn.channel()
        if kind == "queue":
            ch.queue_declare(name, passive=True)
        else:
            ch.exchange_declare(name, passive=True)
        return True
    except pika.exceptions.ChannelClosedByBroker as exc:
        return exc.reply_code != 404  # 405: an exclusive queue of another connection
    finally:
        conn.close()


def test_hub_url_carries_its_prefix_and_chunk(broker):
    with tensorwire.serve(broker) as hub:
        assert "prefix=tw-" in hub.url and hub.chunk == amqp.DEFAULT_CHUNK
    with tensorwire.serve(f"{broker}?prefix=twtest-{uuid.uuid4().hex[:8]}&chunk=65536") as hub:
        assert "chunk=65536" in hub.url and hub.chunk == 65536


@pytest.mark.parametrize(
    "bad",
    [
        "amqp://guest:guest@127.0.0.1:5672/%2F?prefix=x&chunk=10",
        "amqp://guest:guest@127.0.0.1:5672/%2F?prefix=x&chunk=lots",
        "amqp://guest:guest@127.0.0.1:5672/%2F?prefix=amq.mine",
        "amqp://guest:guest@127.0.0.1:5672/%2F?prefix=x&frobnicate=1",
        "amqp://guest:guest@127.0.0.1:5672/%2F?prefix=x&persistent=yes",
    ],
)
def test_bad_urls_are_refused_before_connecting(bad):
    with pytest.raises(TransportError):
        amqp.AmqpAddress(bad)


def test_a_channel_needs_the_hubs_prefix(broker):
    with pytest.raises(TransportError, match="prefix"):
        tensorwire.connect(broker, timeout=1)


def test_lossy_link_timeouts_are_the_defaults_and_the_url_overrides_them(broker):
    params = amqp.AmqpAddress(f"{broker}?prefix=x").params
    assert params.heartbeat == amqp.HEARTBEAT
    assert params.socket_timeout == amqp.CONNECT_TIMEOUT
    assert params.stack_timeout == amqp.HANDSHAKE_TIMEOUT
    given = f"{broker}?prefix=x&heartbeat=7&socket_timeout=3&stack_timeout=9"
    params = amqp.AmqpAddress(given).params
    assert (params.heartbeat, params.socket_timeout, params.stack_timeout) == (7, 3.0, 9.0)
    with tensorwire.serve(
        given.replace("prefix=x", f"prefix=twtest-{uuid.uuid4().hex[:8]}")
    ) as hub:
        assert "heartbeat=7" in hub.url  # clients get the hub's settings too
        with tensorwire.connect(hub.url, client_id="hb") as ch:
            hub.wait_for(1, timeout=T)
            for params in (hub._consumer.conn._impl.params, ch._link.conn.params):
                assert params.heartbeat == 7  # what was negotiated with the broker


def test_a_handshake_timeout_is_retried_within_the_deadline(broker, monkeypatch):
    from pika.adapters.utils.connection_workflow import AMQPConnectorStackTimeout

    real = pika.BlockingConnection
    attempts: list[float] = []

    def flaky(params):
        attempts.append(params.stack_timeout)
        if len(attempts) == 1:  # what pika raises when a lossy link stalls the handshake
            raise AMQPConnectorStackTimeout("Timeout during AMQP handshake")
        return real(params)

    monkeypatch.setattr(pika, "BlockingConnection", flaky)
    address = amqp.AmqpAddress(f"{broker}?prefix=x")
    amqp_connection.close_quietly(
        amqp_connection.connect_blocking(address, deadline_after(T), "retry")
    )
    assert len(attempts) == 2 and all(1.0 <= s <= T for s in attempts)

    def stalled(params):
        attempts.append(params.stack_timeout)
        raise AMQPConnectorStackTimeout("Timeout during AMQP handshake")

    monkeypatch.setattr(pika, "BlockingConnection", stalled)
    attempts.clear()
    with pytest.raises(TransportTimeout, match="could not reach RabbitMQ"):
        amqp_connection.connect_blocking(address, deadline_after(1.5), "stalled")
    assert len(attempts) > 1 and max(attempts) <= 1.5  # no attempt outlasts the deadline


def test_a_silent_broker_is_noticed_within_the_heartbeat_bounds_and_ridden_out(private):
    heartbeat = 2
    url = f"{private.hub_url()}&heartbeat={heartbeat}"
    node = private.node
    with tensorwire.serve(url) as hub, tensorwire.connect(hub.url, client_id="d") as ch:
        hub.wait_for(1, timeout=T)
        assert node.pid is not None
        os.killpg(node.pid, signal.SIGSTOP)  # alive for TCP, silent for AMQP
        try:
            t = time.monotonic()
            assert until(lambda: _events(hub, "medium-lost"), timeout=60)
            assert time.monotonic() - t < 2 * (heartbeat + 5) + 1  # pika's bound
            assert hub.clients == ["d"]  # an outage is no reason to drop a member
        finally:
            os.killpg(node.pid, signal.SIGCONT)
        hub.send("d", {"v": np.arange(3)}, timeout=90)
        assert np.array_equal(ch.recv(timeout=90)["v"], np.arange(3))
        ch.send({"v": np.arange(2)}, timeout=90)
        assert hub.recv(timeout=90)[0] == "d"
        assert _events(hub, "medium-back") and not _events(hub, "left")


@pytest.mark.parametrize("persistent", ["1", "0"])
def test_an_outage_keeps_members_and_sends_wait_for_the_broker_within_their_deadline(
    private, persistent
):
    """With transient messages too: nothing here sits in a queue across the restart."""
    url = with_option(private.hub_url(), "persistent", persistent)
    with (
        tensorwire.serve(url, codec=None) as hub,
        tensorwire.connect(hub.url, client_id="a", codec=None) as a,
        tensorwire.connect(hub.url, client_id="b", codec=None) as b,
    ):
        hub.wait_for(2, timeout=T)
        restart = threading.Thread(target=private.restart, args=(4.0,))
        restart.start()
        try:
            assert until(lambda: _events(hub, "medium-lost"))
            t = time.monotonic()
            result = hub.broadcast({"v": np.arange(3)}, timeout=1.0)
            assert time.monotonic() - t < 10  # 1 s, and a connect attempt the deadline cut short
            assert not result and sorted(result.failed) == ["a", "b"]
            assert all(isinstance(e, TransportTimeout) for e in result.failed.values())
            assert hub.clients == ["a", "b"]
            a.send({"v": np.arange(4)}, meta={"from": "a"}, timeout=120)  # waits for the broker
        finally:
            restart.join(120)
        sent = hub.broadcast({"v": np.arange(5)}, meta={"r": 1}, timeout=60)
        assert sorted(sent) == ["a", "b"]
        for ch in (a, b):
            assert ch.recv(timeout=T).meta == {"r": 1}  # the failed broadcast never arrives
        who, msg = hub.recv(timeout=T)
        assert who == "a" and msg.meta == {"from": "a"}
        with pytest.raises(TransportTimeout):  # once only
            hub.recv(timeout=1.0)
        assert _events(hub, "medium-back") and not _events(hub, "left")


def test_chunked_messages_both_ways_and_interleaved(url, connect):
    big = np.random.default_rng(0).standard_normal(200_000)  # 1.6 MB: 25 chunks of 64 KiB
    with tensorwire.serve(f"{url}&chunk=65536", codec=None) as hub:
        chans = [connect(hub.url, client_id=f"c{i}", codec=None) for i in range(3)]
        hub.wait_for(3, timeout=T)
        hub.broadcast({"x": big})
        for ch in chans:
            assert np.array_equal(ch.recv(timeout=T)["x"], big)
        senders = [
            threading.Thread(target=ch.send, args=({"x": big * i},), kwargs={"timeout": T})
            for i, ch in enumerate(chans)
        ]
        for t in senders:
            t.start()
        for t in senders:
            t.join(T)
        got = dict(hub.gather(timeout=T))
        for i in range(3):
            assert np.array_equal(got[f"c{i}"]["x"], big * i)
            got[f"c{i}"]["x"][0] = 1.0  # received arrays are the caller's to change
        assert not hub.errors


def test_broadcast_to_all_is_one_publish_to_the_fanout(url, connect):
    with tensorwire.serve(url) as hub:
        chans = {c: connect(hub.url, client_id=c) for c in ("a", "b", "c")}
        hub.wait_for(3, timeout=T)
        calls: list[tuple[str, str]] = []
        publish = hub._pub.publish

        def counting(exchange, routing_key, *args):
            calls.append((exchange, routing_key))
            return publish(exchange, routing_key, *args)

        hub._pub.publish = counting
        hub.broadcast({"v": np.arange(3)})
        assert calls == [(f"{hub.prefix}.all", "")]
        for ch in chans.values():
            assert np.array_equal(ch.recv(timeout=T)["v"], np.arange(3))
        calls.clear()
        hub.broadcast({"v": np.arange(4)}, clients=["a", "b"])  # a subset: one unicast each
        assert sorted(exchange for exchange, _ in calls) == ["", ""]
        assert np.array_equal(chans["a"].recv(timeout=T)["v"], np.arange(4))
        assert np.array_equal(chans["b"].recv(timeout=T)["v"], np.arange(4))
        with pytest.raises(TransportTimeout):
            chans["c"].recv(timeout=0.5)


@pytest.mark.parametrize("query, mode", [("", 2), ("&persistent=0", 1)])
def test_data_is_kept_on_the_brokers_disk_unless_the_url_says_persistent_0(url, query, mode):
    """Delivery mode 2 (on disk) by default, 1 (memory) with ?persistent=0, which the hub's
    URL hands to its devices: seen on a copy of the broadcast, and on the device's publisher."""
    with tensorwire.serve(url + query) as hub:
        assert ("persistent=0" in hub.url) == (mode == 1)
        tap = pika.BlockingConnection(pika.URLParameters(BROKER))
        try:
            ch = tap.channel()
            copy = ch.queue_declare("", exclusive=True).method.queue
            ch.queue_bind(copy, f"{hub.prefix}.all")
            with tensorwire.connect(hub.url, client_id="a") as dev:
                hub.wait_for(1, timeout=T)
                assert dev._pub._props.delivery_mode == mode
                hub.broadcast({"v": np.arange(3)})
                assert np.array_equal(dev.recv(timeout=T)["v"], np.arange(3))
            got: list = []
            assert until(lambda: got.append(ch.basic_get(copy, auto_ack=True)[1]) or got[-1], T)
            assert got[-1].delivery_mode == mode
        finally:
            tap.close()


def test_a_second_hub_on_the_same_prefix_is_refused(url):
    with tensorwire.serve(url), pytest.raises(TransportError, match="in use"):
        tensorwire.serve(url)


def test_close_says_goodbye_and_leaves_nothing_on_the_broker(url):
    hub = tensorwire.serve(url)
    ch = tensorwire.connect(hub.url, client_id="x")
    hub.wait_for(1, timeout=T)
    names = [("queue", f"{hub.prefix}.up"), ("exchange", f"{hub.prefix}.all"), ("queue", ch._queue)]
    assert all(_exists(kind, name) for kind, name in names)
    hub.close()
    with pytest.raises(PeerGone):
        ch.recv(timeout=T)
    with pytest.raises(PeerGone):
        ch.send({"v": np.zeros(1)})
    ch.close()
    assert until(lambda: not any(_exists(kind, name) for kind, name in names))


def test_a_dropped_client_is_noticed(url):
    reasons: list[str] = []
    with tensorwire.serve(url, on_leave=lambda cid, why: reasons.append(why)) as hub:
        ch = tensorwire.connect(hub.url, client_id="d")
        hub.wait_for(1, timeout=T)
        ch._drop()
        assert until(lambda: not hub.clients, timeout=T)  # LEAVE_GRACE and a liveness round
        assert "dropped" in reasons[0]
        with pytest.raises(PeerGone):
            hub.send("d", {"v": np.zeros(1)})


def test_a_message_whose_chunks_stop_coming_is_reported(url, monkeypatch, connect):
    monkeypatch.setattr(amqp_hub, "REASSEMBLY_TIMEOUT", 0.5)
    with tensorwire.serve(url) as hub:
        connect(hub.url, client_id="half")
        hub.wait_for(1, timeout=T)
        first = _chunks(encode_message({"x": np.zeros(10_000)}), 7, 4096)[0]
        SCHEME._publish(hub.url, [("", f"{hub.prefix}.up", "half", first)])
        assert until(lambda: hub.errors, timeout=10)
        who, exc = hub.errors[0]
        assert who == "half" and isinstance(exc, ChunkError) and "never arrived" in str(exc)


def test_an_unreachable_broker_times_out():
    import socket

    with socket.create_server(("127.0.0.1", 0)) as probe:
        port = probe.getsockname()[1]
    t = time.monotonic()
    with pytest.raises(TransportTimeout, match="is it running"):
        tensorwire.connect(f"amqp://guest:guest@127.0.0.1:{port}/%2F?prefix=x", timeout=1)
    with pytest.raises(TransportTimeout, match="is it running"):
        tensorwire.serve(f"amqp://guest:guest@127.0.0.1:{port}/%2F?prefix=x", timeout=1)
    assert time.monotonic() - t < 10


def test_wrong_credentials_fail_at_once(broker):
    with pytest.raises(TransportError, match="credentials"):
        tensorwire.serve("amqp://nobody:wrong@127.0.0.1:5672/%2F?prefix=twtest-creds", timeout=T)
