"""amqp:// against what else reaches the broker: a stranger's chunks, forged session messages,
repeated deliveries and replays; and the secured session (TLS to the broker, the hello's proof,
MACs on every body), through forgeries and broker restarts."""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("pika", reason="pika is not installed (extra 'amqp')")

from amqp_helpers import (
    SCHEME,
    T,
    _chunks,
    _events,
    fixture_broker,  # noqa: F401  (a fixture: broker, which url asks for)
    fixture_url,  # noqa: F401  (a fixture: url)
)
from waiting import until

import tensorwire
from tensorwire.errors import TransportError, TransportTimeout
from tensorwire.transports import amqp
from tensorwire.transports.broker import unsealed
from tensorwire.transports.security import ReplayWindow, Sealer
from tensorwire.wire import encode_message
from tensorwire.wire.chunks import CHUNK_HEADER, CHUNK_MAGIC


def _forged_first_chunk(message_id: int, total: int = 16 << 30, piece: int = 1 << 10) -> bytes:
    """The first chunk of a message declaring ``total`` bytes, carrying ``piece`` of them."""
    header = CHUNK_HEADER.pack(CHUNK_MAGIC, 1, 0, 0, message_id, 0, total // piece, 0, total)
    return header + bytes(piece)


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


def test_a_sender_that_has_not_joined_is_read_only_as_a_one_chunk_hello(url, connect):
    with tensorwire.serve(url) as hub:
        ch = connect(hub.url, client_id="c")
        hub.wait_for(1, timeout=T)
        data = encode_message({"v": np.arange(3)}, {"ghost": True})
        big = encode_message({"v": np.zeros(10_000)}, {"ghost": True})
        pieces = _chunks(big, 2, 4096)
        up = f"{hub.prefix}.up"
        SCHEME._publish(hub.url, [("", up, "ghost", body) for body in [*_chunks(data, 1), *pieces]])
        assert until(lambda: len(_events(hub, "refused")) == 1 and hub.errors.total == len(pieces))
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
        assert until(lambda: hub.errors.total == 4)  # the two byes and the two answers
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
            heard = ch._heard_at  # when the hub last spoke: a forgery must not move it
            SCHEME._publish(plain, [("", ch._queue, "hub", body) for body in forged])
            assert until(lambda: ch.errors.total >= 2)
            assert all(isinstance(e, tensorwire.AuthenticationError) for _, e in ch.errors)
            assert ch._heard_at == heard  # nor spare the client its looks at the hub's queue
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
            assert until(lambda: _events(hub, "medium-back"), timeout=60)
            hub.send("d1", {"v": np.arange(3)}, timeout=60)
            assert np.array_equal(ch.recv(timeout=60)["v"], np.arange(3))
            assert until(lambda: ch._rehello_at is None)  # the hub answered, sealed
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
                assert until(lambda: _events(hub, "medium-lost"), timeout=60)
                hub._medium_gone(TransportError("gave up"))  # as after OUTAGE_LIMIT
                assert hub.clients == []
            finally:
                restart.join(120)
            # its sealed hello is refused (the nonce is spent); a new session's hello is not
            assert until(lambda: hub.clients == ["d1"], timeout=60)
            assert until(lambda: ch._session.key is not None and ch._rehello_at is None)
            assert ch._session.session != old
            assert any("replayed hello" in e.reason for e in _events(hub, "refused"))
            _round_trip(hub, ch)
            ch.send({"v": np.arange(2)}, timeout=T)
            assert hub.recv(timeout=T)[0] == "d1"
        finally:
            ch.close()
