"""amqp:// specifics: names under a prefix, native fan-out, chunking, start order, cleanup,
strangers on the broker, repeated deliveries, and a broker that freezes or goes away."""

from __future__ import annotations

import importlib.util
import os
import signal
import threading
import time
import uuid
from pathlib import Path

import numpy as np
import pytest

pika = pytest.importorskip("pika", reason="pika is not installed (extra 'amqp')")

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
from tensorwire.transports.broker import unsealed  # noqa: E402
from tensorwire.transports.brokers.rabbitmq import rabbitmq_answers  # noqa: E402
from tensorwire.transports.security import ReplayWindow, Sealer  # noqa: E402
from tensorwire.wire import encode_message, iter_chunks  # noqa: E402
from tensorwire.wire.chunks import CHUNK_HEADER, CHUNK_MAGIC  # noqa: E402

BROKER = "amqp://guest:guest@127.0.0.1:5672/%2F"
T = 20.0


@pytest.fixture(scope="module")
def broker() -> str:
    if not rabbitmq_answers(BROKER):
        pytest.skip(f"no RabbitMQ answers at {BROKER} (apt-get install rabbitmq-server)")
    return BROKER


@pytest.fixture
def url(broker: str) -> str:
    return f"{broker}?prefix=twtest-{uuid.uuid4().hex[:12]}"


def _scheme():
    """tests/transports/schemes/amqp.py (its private broker is the session's one)."""
    path = Path(__file__).with_name("schemes") / "amqp.py"
    spec = importlib.util.spec_from_file_location("tw_scheme_amqp_for_test_amqp", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


SCHEME = _scheme()


@pytest.fixture
def private(request):
    """The session's private RabbitMQ node, which these tests may freeze and restart."""
    return SCHEME.private_broker(request)


def _chunks(enc, message_id: int, size: int = 1 << 20) -> list[bytes]:
    return [b"".join(parts) for parts in iter_chunks(enc.frames(), message_id, size)]


def _forged_first_chunk(message_id: int, total: int = 16 << 30, piece: int = 1 << 10) -> bytes:
    """The first chunk of a message declaring ``total`` bytes, carrying ``piece`` of them."""
    header = CHUNK_HEADER.pack(CHUNK_MAGIC, 1, 0, 0, message_id, 0, total // piece, 0, total)
    return header + bytes(piece)


def _events(hub, kind: str) -> list:
    return [e for e in hub.events if e.kind == kind]


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


def _wait_until(condition, timeout: float = T) -> bool:
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.05)
    return condition()


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
            for conn in (hub._consumer.conn, ch._consumer.conn):
                assert conn._impl.params.heartbeat == 7  # what was negotiated with the broker


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
            assert _wait_until(lambda: _events(hub, "medium-lost"), timeout=60)
            assert time.monotonic() - t < 2 * (heartbeat + 5) + 1  # pika's bound
            assert hub.clients == ["d"]  # an outage is no reason to drop a member
        finally:
            os.killpg(node.pid, signal.SIGCONT)
        hub.send("d", {"v": np.arange(3)}, timeout=90)
        assert np.array_equal(ch.recv(timeout=90)["v"], np.arange(3))
        ch.send({"v": np.arange(2)}, timeout=90)
        assert hub.recv(timeout=90)[0] == "d"
        assert _events(hub, "medium-back") and not _events(hub, "left")


def test_an_outage_keeps_members_and_sends_wait_for_the_broker_within_their_deadline(private):
    url = private.hub_url()
    with (
        tensorwire.serve(url, codec=None) as hub,
        tensorwire.connect(hub.url, client_id="a", codec=None) as a,
        tensorwire.connect(hub.url, client_id="b", codec=None) as b,
    ):
        hub.wait_for(2, timeout=T)
        restart = threading.Thread(target=private.restart, args=(4.0,))
        restart.start()
        try:
            assert _wait_until(lambda: _events(hub, "medium-lost"))
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
    assert _wait_until(lambda: not any(_exists(kind, name) for kind, name in names))


def test_a_dropped_client_is_noticed(url):
    reasons: list[str] = []
    with tensorwire.serve(url, on_leave=lambda cid, why: reasons.append(why)) as hub:
        ch = tensorwire.connect(hub.url, client_id="d")
        hub.wait_for(1, timeout=T)
        ch._drop()
        assert _wait_until(lambda: not hub.clients, timeout=T)  # LEAVE_GRACE and a liveness round
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
        assert _wait_until(lambda: hub.errors, timeout=10)
        who, exc = hub.errors[0]
        assert who == "half" and isinstance(exc, ChunkError) and "never arrived" in str(exc)


def test_a_sender_that_has_not_joined_is_read_only_as_a_one_chunk_hello(url, connect):
    with tensorwire.serve(url) as hub:
        ch = connect(hub.url, client_id="c")
        hub.wait_for(1, timeout=T)
        data = encode_message({"v": np.arange(3)}, {"ghost": True})
        big = encode_message({"v": np.zeros(10_000)}, {"ghost": True})
        pieces = _chunks(big, 2, 4096)
        up = f"{hub.prefix}.up"
        SCHEME._publish(hub.url, [("", up, "ghost", body) for body in [*_chunks(data, 1), *pieces]])
        assert _wait_until(
            lambda: len(_events(hub, "refused")) == 1 and hub.errors.total == len(pieces)
        )
        assert all(who == "(not joined)" for who, _ in hub.errors)  # one log key for strangers
        with pytest.raises(TransportTimeout):
            hub.recv(timeout=0.5)
        ch.send({"v": np.arange(2)})
        assert hub.recv(timeout=T)[0] == "c" and hub.clients == ["c"]


def test_a_strangers_chunks_cost_microseconds_and_memory_for_what_arrived(url, connect):
    n = 2000
    with tensorwire.serve(url) as hub:
        ch = connect(hub.url, client_id="c")
        hub.wait_for(1, timeout=T)
        up = f"{hub.prefix}.up"
        forged = [("", up, "stranger", _forged_first_chunk(i)) for i in range(n)]
        forged += [("", up, "c", _forged_first_chunk(i)) for i in range(n)]  # as a member
        forged += [(f"{hub.prefix}.all", "", "hub", _forged_first_chunk(i)) for i in range(n)]
        SCHEME._publish(hub.url, forged)
        t = time.monotonic()
        ch.send({"v": np.arange(3)}, meta={"after": n})
        hub.broadcast({"v": np.arange(3)}, meta={"after": n})
        assert hub.recv(timeout=T)[1].meta == {"after": n}
        assert ch.recv(timeout=T).meta == {"after": n}
        # 6,000 chunks declaring 16 GiB each (the old reassembler took ~0.3 s per chunk)
        assert time.monotonic() - t < 10
        for side in (hub, ch):
            assert side._inflow._chunks.pending_bytes < 1 << 20  # 8 pending, what arrived


def test_forged_session_messages_change_nothing(url, connect):
    with tensorwire.serve(url) as hub:
        ch = connect(hub.url, client_id="c")
        hub.wait_for(1, timeout=T)
        bodies = [
            _chunks(encode_message(None, meta, kind=kind), 100 + i)[0]
            for i, (kind, meta) in enumerate(
                [
                    ("bye", {}),
                    ("bye", {"session": "0" * 32}),
                    ("welcome", {"session": ch._session.session, "version": 2}),
                    ("refuse", {"reason": "forged", "code": "auth", "version": 2}),
                ]
            )
        ]
        SCHEME._publish(
            hub.url,
            [("", f"{hub.prefix}.up", "c", body) for body in bodies]
            + [(f"{hub.prefix}.all", "", "hub", body) for body in bodies],
        )
        assert _wait_until(lambda: hub.errors.total == 4)  # the two byes and the two answers
        hub.send("c", {"v": np.arange(3)})
        assert np.array_equal(ch.recv(timeout=T)["v"], np.arange(3))
        ch.send({"v": np.arange(2)})
        assert hub.recv(timeout=T)[0] == "c"
        assert hub.clients == ["c"] and not _events(hub, "left")


def test_a_repeated_message_id_is_delivered_once(url, connect):
    with tensorwire.serve(url, codec=None) as hub:
        ch = connect(hub.url, client_id="c", codec=None)
        hub.wait_for(1, timeout=T)
        small = _chunks(encode_message({"v": np.arange(3)}, {"i": 1}), 11)
        big = _chunks(encode_message({"v": np.arange(100_000)}, {"i": 2}), 12, 1 << 16)
        twice = [*small, *small, *big, *big[:3]]
        SCHEME._publish(
            hub.url,
            [("", f"{hub.prefix}.up", "c", body) for body in twice]
            + [(f"{hub.prefix}.all", "", "hub", body) for body in twice],
        )
        assert [hub.recv(timeout=T)[1].meta["i"] for _ in range(2)] == [1, 2]
        assert [ch.recv(timeout=T).meta["i"] for _ in range(2)] == [1, 2]
        with pytest.raises(TransportTimeout):
            hub.recv(timeout=0.5)
        with pytest.raises(TransportTimeout):
            ch.recv(timeout=0.5)
        assert not hub.errors


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


# -- security: TLS to the broker, the hello's proof, MACs on every body ----------------------------


@pytest.fixture(scope="module")
def enrolment(tmp_path_factory):
    pytest.importorskip("cryptography", reason="cryptography is not installed")
    from tensorwire.transports.certs import make_certs

    return make_certs(
        tmp_path_factory.mktemp("amqp-certs"), hosts=["127.0.0.1"], clients=["d1", "d2", "d3"]
    )


@pytest.fixture
def secured(request, enrolment):
    """``(url, hub_options, client_options(cid))`` for a keyed hub on the session node's TLS
    listener (an ``amqps://`` URL; the CA given as ``tls=``)."""
    node = SCHEME._node(request, SCHEME._tls_settings(Path(enrolment.directory)))
    ca = tensorwire.TLS(ca=enrolment.ca)
    hub_options = {"tls": ca, "auth": tensorwire.Keys.load(enrolment.keys)}

    def client_options(cid: str) -> dict:
        return {"tls": ca, "key": enrolment.devices[cid]["secret"]}

    return node.url(f"twtest-{uuid.uuid4().hex[:12]}"), hub_options, client_options


def _round_trip(hub, ch, n: int = 3) -> None:
    hub.send(ch.client_id, {"v": np.arange(n)}, timeout=T)
    assert np.array_equal(ch.recv(timeout=T)["v"], np.arange(n))
    ch.send({"v": np.arange(n + 1)}, timeout=T)
    who, msg = hub.recv(timeout=T)
    assert who == ch.client_id and np.array_equal(msg["v"], np.arange(n + 1))


def test_amqps_and_tls_take_port_5671_and_unknown_options_raise():
    a = amqp.AmqpAddress("amqps://u:p@example.org/%2F?prefix=x")
    assert a.params.port == amqp.DEFAULT_TLS_PORT and a.params.ssl_options is not None
    b = amqp.AmqpAddress("amqp://u:p@example.org/%2F?prefix=x", tls=tensorwire.TLS())
    assert b.params.port == amqp.DEFAULT_TLS_PORT and b.params.ssl_options is not None
    assert (
        amqp.AmqpAddress("amqp://u:p@example.org:5000/%2F?prefix=x", tensorwire.TLS()).params.port
        == 5000
    )
    assert amqp.AmqpAddress("amqp://u:p@example.org/%2F?prefix=x").params.ssl_options is None
    with pytest.raises(TransportError, match="ssl_options") as info:  # TLS is tls=, never pika's
        amqp.AmqpAddress("amqps://u:hunter2@example.org/%2F?prefix=x&ssl_options=%7B%7D")
    assert "hunter2" not in str(info.value)


def test_a_broker_certificate_this_side_does_not_trust_fails_at_once(secured):
    url, _, _ = secured
    t = time.monotonic()
    with pytest.raises(tensorwire.AuthenticationError, match="does not trust"):
        tensorwire.connect(url, client_id="d1", timeout=30)  # the system's CAs: not ours
    assert time.monotonic() - t < 10


def test_a_client_certificate_on_a_broker_hub_identifies_nobody_to_the_hub(
    secured, enrolment, caplog
):
    """The hub's certificate and CA are for the broker; without keys the hub admits anyone
    who can reach the broker, and says so (a certificate never reaches it on amqp)."""
    import logging

    url, _, _ = secured
    tls = tensorwire.TLS(cert=enrolment.hub_cert, key=enrolment.hub_key, ca=enrolment.ca)
    with (
        caplog.at_level(logging.WARNING, logger="tensorwire"),
        tensorwire.serve(url, tls=tls) as hub,
    ):
        assert hub.authenticate is None
        with tensorwire.connect(hub.url, client_id="d9", tls=tensorwire.TLS(ca=enrolment.ca)):
            hub.wait_for(1, timeout=T)
    assert any("accepts ANYONE" in r.getMessage() for r in caplog.records)


def test_a_client_with_a_secret_refuses_a_hub_without_keys(secured, enrolment):
    url, hub_options, client_options = secured
    with (
        tensorwire.serve(url, tls=hub_options["tls"]) as hub,
        pytest.raises(tensorwire.AuthenticationError, match="secret"),
    ):
        tensorwire.connect(hub.url, client_id="d1", timeout=3, **client_options("d1"))


def test_every_body_after_the_welcome_is_sealed_and_a_broadcast_is_one_publish(secured):
    url, hub_options, client_options = secured
    with tensorwire.serve(url, codec=None, **hub_options) as hub:
        chans = [
            tensorwire.connect(hub.url, client_id=c, codec=None, **client_options(c))
            for c in ("d1", "d2", "d3")
        ]
        try:
            hub.wait_for(3, timeout=T)
            calls: list[tuple[str, int]] = []
            publish = hub._pub.publish

            def counting(exchange, routing_key, enc, chunk, deadline, sealer=None):
                calls.append((exchange, 0 if sealer is None else len(sealer.keys)))
                return publish(exchange, routing_key, enc, chunk, deadline, sealer)

            hub._pub.publish = counting
            big = np.arange(1_000_000)  # 8 MB: two chunks, each with its trailer
            hub.broadcast({"v": big})
            assert calls == [(f"{hub.prefix}.all", 3)]  # one publish, a MAC for each member
            for ch in chans:
                assert np.array_equal(ch.recv(timeout=T)["v"], big)
                assert ch._session.key is not None and not ch.errors
            for ch in chans:
                _round_trip(hub, ch)
            assert not hub.errors
        finally:
            for ch in chans:
                ch.close()
        deadline = time.monotonic() + T
        while hub.clients and time.monotonic() < deadline:  # the sealed byes end the sessions
            time.sleep(0.05)
        assert hub.clients == [] and not hub.errors


def test_forged_session_messages_to_a_keyed_client_change_nothing(secured, request):
    url, hub_options, client_options = secured
    with tensorwire.serve(url, **hub_options) as hub:
        ch = tensorwire.connect(hub.url, client_id="d1", **client_options("d1"))
        try:
            hub.wait_for(1, timeout=T)
            sid = ch._session.session

            def whole(kind: str, meta: dict) -> bytes:
                return _chunks(encode_message(None, meta, kind=kind), int(uuid.uuid4().int >> 64))[
                    0
                ]

            forged = [
                whole("bye", {"reason": "forged"}),  # counted: the hub seals its byes
                whole("refuse", {"reason": "forged", "code": "auth", "session": sid}),
                whole("refuse", {"reason": "forged", "code": "auth", "session": "0" * 32}),
                whole("welcome", {"session": sid, "version": 2}),
                whole("bye", {}) + b"\x00" * 20 + b"TWMA",  # a trailer that proves nothing
            ]
            plain = SCHEME._node(request).plain_url()  # another user of the broker
            SCHEME._publish(plain, [("", ch._queue, "hub", body) for body in forged])
            assert _wait_until(lambda: ch.errors.total >= 2)
            assert all(isinstance(e, tensorwire.AuthenticationError) for _, e in ch.errors)
            _round_trip(hub, ch)
            assert hub.clients == ["d1"] and ch._session.session == sid
        finally:
            ch.close()


def test_a_redelivery_is_dropped_quietly_and_a_replay_is_refused():
    key, window = b"k" * 32, ReplayWindow()
    sealer = Sealer([key], b"d1", iter(range(100)))
    chunk = _chunks(encode_message(None, {"n": 1}), 5)[0]
    body = chunk + sealer([chunk])
    assert bytes(unsealed(body, key, b"d1", window, False)) == chunk
    assert unsealed(body, key, b"d1", window, True) is None  # the broker's redelivery
    with pytest.raises(tensorwire.AuthenticationError, match="replayed"):
        unsealed(body, key, b"d1", window, False)  # published again by someone
    altered = bytearray(body)
    altered[50] ^= 1
    with pytest.raises(tensorwire.AuthenticationError):
        unsealed(bytes(altered), key, b"d1", window, True)  # redelivered proves nothing
    again = sealer.reseal(body)  # a publish retried after a lost connection: a new number
    assert again != body and bytes(unsealed(again, key, b"d1", window, False)) == chunk


def test_a_broker_restart_with_keys_is_ridden_out_with_a_sealed_hello(secured, request):
    url, hub_options, client_options = secured
    node = SCHEME._node(request)
    with tensorwire.serve(url, codec=None, **hub_options) as hub:
        ch = tensorwire.connect(hub.url, client_id="d1", codec=None, **client_options("d1"))
        try:
            hub.wait_for(1, timeout=T)
            sid = ch._session.session
            node.restart(1.0)
            assert _wait_until(lambda: _events(hub, "medium-back"), timeout=60)
            hub.send("d1", {"v": np.arange(3)}, timeout=60)
            assert np.array_equal(ch.recv(timeout=60)["v"], np.arange(3))
            assert _wait_until(lambda: ch._rehello_at is None)  # the hub answered, sealed
            _round_trip(hub, ch)
            assert ch._session.session == sid and not _events(hub, "left")
            assert not hub.errors and not ch.errors
        finally:
            ch.close()


def test_a_client_the_hub_forgot_in_an_outage_asks_in_a_new_session(secured, request):
    url, hub_options, client_options = secured
    node = SCHEME._node(request)
    with tensorwire.serve(url, codec=None, **hub_options) as hub:
        ch = tensorwire.connect(hub.url, client_id="d1", codec=None, **client_options("d1"))
        try:
            hub.wait_for(1, timeout=T)
            old = ch._session.session
            restart = threading.Thread(target=node.restart, args=(2.0,))
            restart.start()
            try:
                assert _wait_until(lambda: _events(hub, "medium-lost"), timeout=60)
                hub._medium_gone(TransportError("gave up"))  # as after OUTAGE_LIMIT
                assert hub.clients == []
            finally:
                restart.join(120)
            # its sealed hello is refused (the nonce is spent); a new session's hello is not
            assert _wait_until(lambda: hub.clients == ["d1"], timeout=60)
            assert _wait_until(lambda: ch._session.key is not None and ch._rehello_at is None)
            assert ch._session.session != old
            assert any("replayed hello" in e.reason for e in _events(hub, "refused"))
            _round_trip(hub, ch)
            ch.send({"v": np.arange(2)}, timeout=T)
            assert hub.recv(timeout=T)[0] == "d1"
        finally:
            ch.close()
