"""udp:// beyond the conformance suite: URL options, pacing, and loss on loopback in both
modes, made exact and unprivileged by dropping chosen datagrams in the sender: what reliable
resends, what best-effort keeps, reports and gives up, and when it finishes a message.

What a hostile peer or stranger can do is in test_udp_hostile.py; random loss in a pair of
network namespaces in test_udp_netns.py.
"""

from __future__ import annotations

import socket
import struct
import threading
import time

import numpy as np
import pytest
from udp_helpers import (
    T,
    _secured,
    _serve,
    fixture_enrolment,  # noqa: F401  (a fixture: enrolment)
)

import tensorwire
from tensorwire.errors import TransportError, TransportTimeout, TruncatedMessage
from tensorwire.transports.udp import flow_base as udp_flow_base
from tensorwire.transports.udp import sending as udp_sending
from tensorwire.transports.udp import sockets as udp_sockets
from tensorwire.transports.udp.flow import Flow
from tensorwire.transports.udp.options import parse_rate, parse_udp_url

_INDEX = struct.Struct("<I")  # a chunk's index, at offset 16 of its header


def _drop_datagrams(monkeypatch, lose, last: bool = False) -> list[int]:
    """Make every sender skip the datagrams ``lose(message_id, index)`` picks (and, if
    ``last``, every message's last one); return the list of indices skipped."""
    real = udp_sending.send_datagram
    dropped: list[int] = []

    def send(sock, parts, address, deadline):
        head = bytes(parts[0][-40:])  # a sealed datagram's clear part ends with it
        mid, index = struct.unpack_from("<Q", head, 8)[0], _INDEX.unpack_from(head, 16)[0]
        if lose(mid, index) or (last and index == _INDEX.unpack_from(head, 20)[0] - 1):
            dropped.append(index)
            return
        real(sock, parts, address, deadline)

    monkeypatch.setattr(udp_sending, "send_datagram", send)
    return dropped


def test_url_options_round_trip_and_errors():
    host, port, opts = parse_udp_url("udp://10.0.0.1:7000?mode=best-effort&mtu=9000&rate=5mbit")
    assert (host, port, opts.mode) == ("10.0.0.1", 7000, "best-effort")
    assert (opts.mtu, opts.rate) == (9000, 5e6)
    assert parse_rate("250kbit") == 250e3 and parse_rate("1.5gbit") == 1.5e9
    assert parse_udp_url("udp://h:1")[2].mtu == 1472
    for bad in ("mode=sometimes", "mtu=40", "mtu=70000", "rate=fast", "rate=5mbps", "speed=1"):
        with pytest.raises(TransportError):
            parse_udp_url(f"udp://h:1?{bad}")
    with _serve("best-effort") as hub:
        _, port, opts = parse_udp_url(hub.url)
        assert port > 0 and opts.mode == "best-effort" and opts.mtu == 1472


def test_channel_refuses_a_mode_other_than_the_hubs():
    with _serve("best-effort") as hub:
        url = hub.url.replace("mode=best-effort", "mode=reliable")
        with pytest.raises(TransportError, match="mode"):
            tensorwire.connect(url, timeout=T)
        with tensorwire.connect(hub.url.split("?")[0], timeout=T) as ch:
            assert ch.mode == "best-effort"


def test_pacing_keeps_to_the_rate():
    rate = 20e6  # bits/s
    data = np.random.default_rng(0).integers(0, 255, 1 << 20, dtype=np.uint8)
    with tensorwire.serve("udp://127.0.0.1:0?mtu=1472&rate=20mbit", codec=None) as hub:
        assert parse_udp_url(hub.url)[2].rate == rate
        ch = tensorwire.connect(hub.url, client_id="p", timeout=T)
        hub.wait_for(1, timeout=T)
        t = time.perf_counter()
        hub.send("p", {"d": data}, timeout=T)
        elapsed = time.perf_counter() - t
        assert np.array_equal(ch.recv(timeout=T)["d"], data)
        ch.close()
    expected = data.nbytes * 8 / rate  # 0.42 s
    assert 0.9 * expected <= elapsed <= 10 * expected


@pytest.mark.parametrize("secured", [False, True])
def test_reliable_resends_exactly_the_lost_datagrams(monkeypatch, enrolment, secured):
    # secured: each resend is sealed anew (a fresh sequence number), so none is a replay
    hub_opts, client_opts = _secured(enrolment) if secured else ({}, {})
    first_try: set[tuple[int, int]] = set()

    def lose(mid: int, index: int) -> bool:  # the first copy of every 7th chunk, header too
        if index % 7 or (mid, index) in first_try:
            return False
        first_try.add((mid, index))
        return True

    dropped = _drop_datagrams(monkeypatch, lose)
    arr = np.random.default_rng(1).standard_normal(100_000).astype(np.float32)
    with _serve("reliable", **hub_opts) as hub:
        ch = tensorwire.connect(hub.url, client_id="dev1", timeout=T, **client_opts)
        hub.wait_for(1, timeout=T)
        hub.send("dev1", {"w": arr}, timeout=T)
        msg = ch.recv(timeout=T)
        assert msg["w"].tobytes() == arr.tobytes()
        assert msg.loss == {"w": 0.0}
        assert hub.udp_stats.retransmits == len(dropped) > 0
        assert hub.udp_stats.nack_rounds == 1
        ch.send({"back": arr})  # and the other way
        assert hub.recv(timeout=T)[1]["back"].tobytes() == arr.tobytes()
        assert ch.udp_stats.refused_datagrams == hub.udp_stats.refused_datagrams == 0
        ch.close()


def test_best_effort_keeps_previous_values_where_datagrams_were_lost(monkeypatch):
    dropped = _drop_datagrams(monkeypatch, lambda mid, index: index % 10 == 3)
    n = 100_000
    rounds = [np.full(n, float(r + 1), np.float32) for r in range(3)]
    with _serve("best-effort") as hub:
        ch = tensorwire.connect(hub.url, client_id="b", timeout=T)
        hub.wait_for(1, timeout=T)
        previous = np.zeros(n, np.float32)  # no earlier round: lost ranges read zero
        first = None
        for r, arr in enumerate(rounds):
            hub.send("b", {"w": arr, "step": np.array(r)}, timeout=T)
            msg = ch.recv(timeout=T)
            got = msg["w"]
            first = got if first is None else first
            assert got is first  # decoded in place into the previous round's array
            new, kept = got == arr, got == previous
            assert (new | kept).all() or (~new & ~kept).sum() <= 2 * len(dropped)
            assert 0.07 < msg.loss["w"] < 0.13 and abs(msg.loss["w"] - kept.mean()) < 0.01
            assert msg.loss["step"] == 0.0 and msg["step"] == r
            previous = got.copy()
        assert ch.udp_stats.partial_messages == 3
        ch.close()


def test_best_effort_header_comes_with_sent_so_losing_its_datagrams_loses_no_message(
    monkeypatch,
):
    # every datagram holding the prefix and header is lost (a 200-tensor header spans several)
    dropped = _drop_datagrams(monkeypatch, lambda mid, index: index < 4)
    tensors = {f"layer{i}": np.full(1000, float(i), np.float32) for i in range(200)}
    with _serve("best-effort") as hub:
        ch = tensorwire.connect(hub.url, client_id="h", timeout=T)
        hub.wait_for(1, timeout=T)
        hub.send("h", tensors, timeout=T)
        msg = ch.recv(timeout=T)  # was TruncatedMessage: the whole message lost
        assert dropped and sorted(set(dropped)) == [0, 1, 2, 3]
        assert set(msg.tensors) == set(tensors)
        assert all(msg.loss[k] == 0.0 for k in tensors)  # the header chunks carried no tensor
        for k, v in tensors.items():
            np.testing.assert_array_equal(msg[k], v)
        assert ch.udp_stats.lost_messages == 0
        ch.close()


def test_best_effort_waits_for_a_late_sent_when_the_header_datagrams_were_lost(monkeypatch):
    # as on a lossy link, where TCP backoff holds "sent" back for longer than the idle timeout
    _drop_datagrams(monkeypatch, lambda mid, index: index == 0)
    real = Flow.send_control
    delay = 3 * udp_flow_base.IDLE_FLOOR

    def late_sent(self, kind, meta, tensors=None):
        if kind == "sent":
            time.sleep(delay)
        real(self, kind, meta, tensors)

    monkeypatch.setattr(Flow, "send_control", late_sent)
    arr = np.arange(20_000, dtype=np.float32)
    with _serve("best-effort") as hub:
        ch = tensorwire.connect(hub.url, client_id="late", timeout=T)
        hub.wait_for(1, timeout=T)
        t = time.perf_counter()
        ch.send({"w": arr})
        cid, msg = hub.recv(timeout=T)  # was: the whole message lost after the idle timeout
        assert cid == "late" and time.perf_counter() - t >= delay * 0.9
        assert msg.loss["w"] < 0.01
        assert hub.udp_stats.lost_messages == 0
        ch.close()


def test_best_effort_uplink_loss_is_reported_to_the_hub(monkeypatch):
    _drop_datagrams(monkeypatch, lambda mid, index: index == 5)
    arr = np.arange(50_000, dtype=np.float64)
    with _serve("best-effort") as hub:
        ch = tensorwire.connect(hub.url, client_id="u", codec=None, timeout=T)
        hub.wait_for(1, timeout=T)
        ch.send({"update": arr})
        cid, msg = hub.recv(timeout=T)
        assert cid == "u" and 0 < msg.loss["update"] < 0.01
        assert hub.udp_stats.partial_messages == 1
        ch.close()


def test_best_effort_finishes_at_its_last_datagram_while_sent_is_held_back(monkeypatch):
    # A loss on the control connection holds "sent" back for TCP's retransmission timeout (200 ms
    # and more); the message's last datagram already says the datagrams have ended.
    monkeypatch.setattr(udp_flow_base, "IDLE_FLOOR", 10 * T)  # so the idle timeout cannot end it
    _drop_datagrams(monkeypatch, lambda mid, index: index == 2)
    received = threading.Event()
    real = Flow.send_control

    def held_sent(self, kind, meta, tensors=None):
        if kind == "sent":
            received.wait(T)  # until the receiver has the message
        real(self, kind, meta, tensors)

    monkeypatch.setattr(Flow, "send_control", held_sent)
    arr = np.arange(20_000, dtype=np.float32)
    with _serve("best-effort") as hub:
        ch = tensorwire.connect(hub.url, client_id="e", timeout=T)
        hub.wait_for(1, timeout=T)
        sender = threading.Thread(target=hub.send, args=("e", {"w": arr}), kwargs={"timeout": T})
        sender.start()
        try:
            msg = ch.recv(timeout=T / 2)  # was: only once "sent" came
        finally:
            received.set()
            sender.join(T)
        assert 0 < msg.loss["w"] < 0.1 and ch.udp_stats.partial_messages == 1
        assert abs((msg["w"] != arr).mean() - msg.loss["w"]) < 0.01  # all the rest came
        with pytest.raises(TransportTimeout):  # the late "sent" is of a finished message
            ch.recv(timeout=0.5)
        assert ch.udp_stats.lost_messages == 0 and not ch.errors
        ch.close()


def test_best_effort_without_the_end_marker_finishes_after_the_idle_timeout(monkeypatch):
    _drop_datagrams(monkeypatch, lambda mid, index: index == 2, last=True)
    real = Flow.send_control

    def no_sent(self, kind, meta, tensors=None):
        if kind != "sent":  # as if the sender died between its last datagram and "sent"
            real(self, kind, meta, tensors)

    monkeypatch.setattr(Flow, "send_control", no_sent)
    with _serve("best-effort") as hub:
        ch = tensorwire.connect(hub.url, client_id="i", timeout=T)
        hub.wait_for(1, timeout=T)
        hub.send("i", {"w": np.ones(10_000, np.float32)}, timeout=T)
        t = time.perf_counter()
        msg = ch.recv(timeout=T)
        assert udp_flow_base.IDLE_FLOOR * 0.9 <= time.perf_counter() - t < T / 2
        assert 0 < msg.loss["w"] < 0.1
        ch.close()


def test_reliable_send_through_a_dead_path_times_out_and_is_not_delivered(monkeypatch):
    with _serve("reliable") as hub:
        ch = tensorwire.connect(hub.url, client_id="d", timeout=T)
        hub.wait_for(1, timeout=T)
        with monkeypatch.context() as patch:
            _drop_datagrams(patch, lambda mid, index: True)
            with pytest.raises(TransportTimeout, match="resending"):
                hub.send("d", {"w": np.ones(1000)}, timeout=T)
            with pytest.raises(TransportTimeout):
                hub.send("d", {"w": np.ones(1000)}, timeout=0.01)
        with pytest.raises(TransportTimeout):
            ch.recv(timeout=0.2)
        hub.send("d", {"w": np.arange(3.0)}, timeout=T)  # the path is back
        assert np.array_equal(ch.recv(timeout=T)["w"], np.arange(3.0))
        ch.close()


@pytest.mark.parametrize("sent_delay", [0.0, 0.3])
def test_best_effort_loses_a_message_that_lost_half_its_bytes_and_says_so(monkeypatch, sent_delay):
    # its last datagram comes, but what came cannot be delivered: it waits for "sent" (held
    # back here, as a lossy control connection does) so that the loss is reported, not dropped
    monkeypatch.setattr(udp_flow_base, "IDLE_FLOOR", 10 * T)  # so the idle timeout cannot end it
    dropped = _drop_datagrams(monkeypatch, lambda mid, index: 3 <= index % 10 < 9)
    real = Flow.send_control

    def late_sent(self, kind, meta, tensors=None):
        if kind == "sent":
            time.sleep(sent_delay)
        real(self, kind, meta, tensors)

    monkeypatch.setattr(Flow, "send_control", late_sent)
    with _serve("best-effort") as hub:
        ch = tensorwire.connect(hub.url, client_id="h", codec=None, timeout=T)
        hub.wait_for(1, timeout=T)
        hub.send("h", {"w": np.ones(100_000, np.float32)}, timeout=T)
        with pytest.raises(TruncatedMessage, match="of its"):  # the hub announced it: raised
            ch.recv(timeout=T)
        assert dropped and ch.udp_stats.lost_messages == 1
        monkeypatch.undo()
        hub.send("h", {"w": np.arange(3.0)}, timeout=T)
        assert np.array_equal(ch.recv(timeout=T)["w"], np.arange(3.0))
        ch.close()


def test_control_rtt_is_the_paths_minimum_and_the_fallback_before_any_sample():
    fresh = socket.socket()  # no RTT sample yet: the kernel's minimum reads 0xFFFFFFFF
    assert udp_sockets.control_rtt(fresh, 0.5) == 0.5
    fresh.close()
    with socket.create_server(("127.0.0.1", 0)) as server:
        client = socket.create_connection(server.getsockname())
        peer, _ = server.accept()
        with client, peer:
            for _ in range(5):
                client.sendall(b"x")
                peer.recv(1)
            info = client.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 152)
            if len(info) < 152:
                pytest.skip("this kernel keeps no minimum RTT (tcpi_min_rtt)")
            srtt, min_rtt = (
                struct.unpack_from("<I", info, 68)[0],
                struct.unpack_from("<I", info, 148)[0],
            )
            assert 0 < udp_sockets.control_rtt(client, 9.0) == min_rtt / 1e6 <= srtt / 1e6


def test_a_best_effort_send_cut_by_its_deadline_is_dropped_not_delivered():
    with tensorwire.serve("udp://127.0.0.1:0?mode=best-effort&rate=20mbit", codec=None) as hub:
        ch = tensorwire.connect(hub.url, client_id="c", codec=None, timeout=T)
        hub.wait_for(1, timeout=T)
        with pytest.raises(TransportTimeout):  # 4 MiB at 20 Mbit/s takes 1.7 s
            hub.send("c", {"w": np.ones(1 << 20, np.float32)}, timeout=0.3)
        with pytest.raises(TransportTimeout):  # the receiver was told to drop what came
            ch.recv(timeout=3 * udp_flow_base.IDLE_FLOOR)
        hub.send("c", {"w": np.arange(3.0)}, timeout=T)
        assert np.array_equal(ch.recv(timeout=T)["w"], np.arange(3.0))
        ch.close()
