"""The aiortc (WebRTC data channel) baseline of ``bench transfer``: its two peers in the
testbed's namespaces move arrays intact, over the veth link only; the receiver's reassembly
refuses messages that lie; a receiving peer that dies is a clear error, never a hang."""

from __future__ import annotations

import os
import signal

import numpy as np
import pytest

pytest.importorskip("aiortc", reason="aiortc is not installed: pip install 'tensorwire[webrtc]'")

from tensorwire.bench.baselines import BaselineUnavailable
from tensorwire.bench.baselines.webrtc import (
    Sender,
    candidates,
    check_candidates,
)
from tensorwire.bench.transfer import bench_transfer
from tensorwire.bench.webrtc.peer import (
    ACK,
    HEADER,
    MAX_ARRAY_BYTES,
    ArrayReceiver,
    ChannelProtocolError,
    chunk_bytes,
    digest,
)
from tensorwire.bench.webrtc.pipe import PeerPipeError

pytestmark = pytest.mark.timeout(300)


def _sender(**kw: object) -> Sender:
    try:
        return Sender(**kw)  # type: ignore[arg-type]
    except BaselineUnavailable as exc:
        pytest.skip(f"the WebRTC baseline cannot run here: {exc}")


@pytest.fixture(scope="module")
def sender():
    s = _sender(verify=True)
    yield s
    s.close()


def test_arrays_arrive_intact_over_the_data_channel(sender: Sender):
    rng = np.random.default_rng(7)
    arrays = [
        rng.standard_normal((100, 100)).astype(np.float16),
        rng.integers(0, 256, 2 * sender.chunk_bytes + 7, dtype=np.uint8),  # 3 chunks, ragged
        rng.standard_normal(10).astype(np.float64),  # a smaller one: the buffer is resized
        np.empty(0, np.float32),
    ]
    for arr in arrays:
        seconds = sender.once(arr)
        assert 0 < seconds < 120
        assert sender.received_digest == digest(arr.tobytes()), arr.shape


def test_traffic_goes_over_the_testbeds_veth_only(sender: Sender):
    tb = sender.testbed
    assert sender.candidates and all(a.startswith("10.211.0.") for a, _ in sender.candidates)
    check_candidates(sender.candidates, tb.subnet)
    ours = os.stat("/proc/self/ns/net").st_ino
    for pipe in (sender._sender, sender._receiver):
        assert os.stat(f"/proc/{pipe.proc.pid}/ns/net").st_ino != ours  # not our network
    arr = np.ones(1 << 20, np.uint8)
    before = tb.counters()
    sender.once(arr)
    spent = tb.counters() - before
    device = next(c for c in spent.links.values() if c.role == "device")
    assert device.rx_bytes >= arr.nbytes  # every byte came in by the device's veth


def test_the_benchmark_runs_it_as_a_column():
    rows = bench_transfer(
        transports=(),
        baseline_modules=("webrtc",),
        dtypes=("float32",),
        shapes=((20, 30),),
        repeat=1,
        big_mib=0,
    )
    if not rows:
        pytest.skip("the WebRTC baseline was skipped (its reason is printed above)")
    (row,) = rows
    assert row["transport"] == "aiortc-webrtc" and row["bytes"] == 2400 and row["runs"] == 1
    assert row["median_ms"] > 0


def test_a_receiving_peer_that_dies_is_a_clear_error_not_a_hang(monkeypatch):
    import tensorwire.bench.baselines.webrtc as webrtc

    s = _sender()
    try:
        s.once(np.ones(100, np.float32))
        os.kill(s._receiver.proc.pid, signal.SIGKILL)
        s._receiver.proc.wait(timeout=10)
        monkeypatch.setattr(webrtc, "SETUP_TIMEOUT", 5.0)  # the ack's deadline: small arrays
        with pytest.raises(PeerPipeError, match=r"did not answer in time|ended|failed"):
            s.once(np.ones(1 << 16, np.float32))
    finally:
        s.close()


def test_candidates_outside_the_testbed_are_refused():
    sdp = (
        "a=candidate:1 1 udp 2130706431 10.211.0.2 40000 typ host\r\n"
        "a=candidate:2 1 udp 1694498815 192.0.2.9 40001 typ srflx raddr 10.211.0.2 rport 1\r\n"
    )
    found = candidates(sdp)
    assert found == [("10.211.0.2", "host"), ("192.0.2.9", "srflx")]
    check_candidates(found[:1], "10.211.0.0/24")
    with pytest.raises(RuntimeError, match=r"srflx candidate 192\.0\.2\.9"):
        check_candidates(found, "10.211.0.0/24")
    with pytest.raises(RuntimeError, match="outside"):
        check_candidates([("172.17.0.2", "host")], "10.211.0.0/24")
    with pytest.raises(RuntimeError, match="no ICE candidates"):
        check_candidates([], "10.211.0.0/24")


def test_chunks_follow_the_peers_max_message_size():
    assert chunk_bytes("v=0\r\na=max-message-size:65536\r\n") == 65536
    assert chunk_bytes("a=max-message-size:1048576\n") == 262144  # aiortc's own limit
    assert chunk_bytes("a=max-message-size:0\n") == 262144  # "any size"
    assert chunk_bytes("v=0\r\n") == 65536  # RFC 8841's default


def test_reassembly_acks_once_the_declared_bytes_are_in():
    r = ArrayReceiver()
    assert r.feed(HEADER.pack(5, 1)) is None
    assert r.feed(b"abc") is None
    assert r.feed(b"de") == ACK + digest(b"abcde")
    assert r.feed(HEADER.pack(0, 0)) == ACK  # an empty array, unverified
    assert r.feed(HEADER.pack(2, 0)) is None and r.feed(b"xy") == ACK
    assert bytes(r.buf) == b"xy"


def test_reassembly_refuses_lying_messages():
    with pytest.raises(ChannelProtocolError, match="header of 3 bytes"):
        ArrayReceiver().feed(b"abc")
    with pytest.raises(ChannelProtocolError, match="text message"):
        ArrayReceiver().feed("hello")
    big = ArrayReceiver()
    with pytest.raises(ChannelProtocolError, match="over"):
        big.feed(HEADER.pack(MAX_ARRAY_BYTES + 1, 0))
    assert big.buf.nbytes == 0  # nothing allocated for what a liar declared
    r = ArrayReceiver()
    r.feed(HEADER.pack(4, 0))
    with pytest.raises(ChannelProtocolError, match="6 bytes of an array of 4"):
        r.feed(b"abcdef")
