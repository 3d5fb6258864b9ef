"""shm:// specifics: received tensors are views that release themselves, flow control, one
segment per broadcast, bad segments refused typed, nothing leaked when a peer dies."""

from __future__ import annotations

import array
import fcntl
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
import uuid

import numpy as np
import pytest

import tensorwire
from tensorwire.codecs import available_codecs
from tensorwire.errors import (
    AuthenticationError,
    ChecksumMismatch,
    MalformedHeader,
    MessageTooLarge,
    PeerGone,
    TransportError,
    TransportTimeout,
    WireError,
)
from tensorwire.transports.session import ClientSession
from tensorwire.transports.shm import INLINE_BYTES, BadSegment
from tensorwire.transports.shm.options import address
from tensorwire.transports.sockets import listener
from tensorwire.wire import encode_message

T = 20.0  # seconds: generous bound for anything that should take milliseconds
BIG = np.arange(1 << 20, dtype=np.float32)  # 4 MiB: well over INLINE_BYTES


def _url() -> str:
    return f"shm://tw-test-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def hub():
    with tensorwire.serve(_url(), codec=None) as h:
        yield h


def _until(cond, what: str) -> None:
    deadline = time.monotonic() + T
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.005)


def _held(outbox) -> list[int]:
    """Ids of the outbox's segments some receiver still holds."""
    with outbox._cond:
        return sorted(s.id for s in outbox._segments.values() if s.holders)


def _open_fds() -> set[str]:
    # Checked after listing, which drops the descriptor the listing itself used.
    return {fd for fd in os.listdir("/proc/self/fd") if os.path.exists(f"/proc/self/fd/{fd}")}


def _memfd_maps() -> int:
    with open("/proc/self/maps") as f:
        return sum("memfd:tensorwire-" in line for line in f)


def test_big_messages_are_views_that_stay_valid_while_held(hub, connect):
    ch = connect(hub.url, client_id="v", codec=None)
    hub.wait_for(1, timeout=T)
    hub.send("v", {"x": BIG})
    first = ch.recv(timeout=T)
    hub.send("v", {"x": BIG * 2})
    second = ch.recv(timeout=T)
    x = first["x"]
    assert not x.flags.owndata and x.flags.writeable
    assert x.ctypes.data % 64 == 0  # the first tensor is placed on a 64-byte boundary
    assert np.array_equal(first["x"], BIG) and np.array_equal(second["x"], BIG * 2)
    ids = sorted(hub._outbox._segments)
    assert len(ids) == 2 and _held(hub._outbox) == ids
    del first, second, x
    _until(lambda: not _held(hub._outbox), "both segments are released")
    for i in range(5):  # the free segments are reused, not made anew
        hub.send("v", {"x": BIG + i})
        msg = ch.recv(timeout=T)
        assert np.array_equal(msg["x"], BIG + i)
        del msg
        _until(lambda: not _held(hub._outbox), "the segment is released")
    assert sorted(hub._outbox._segments) == ids


def test_recv_into_out_releases_the_segment_at_once(hub, connect):
    ch = connect(hub.url, client_id="o", codec=None)
    hub.wait_for(1, timeout=T)
    hub.send("o", {"x": BIG})
    out = ch.recv(timeout=T).tensors  # views of the first segment, kept as buffers
    hub.send("o", {"x": BIG * 3})
    got = ch.recv(timeout=T, out=out)
    assert got["x"] is out["x"] and np.array_equal(out["x"], BIG * 3)
    _until(lambda: len(_held(hub._outbox)) == 1, "the second segment is released")


def test_a_receiver_holding_max_segments_makes_the_sender_wait(connect):
    with tensorwire.serve(_url(), codec=None, max_segments=2) as hub:
        ch = connect(hub.url, client_id="h", codec=None, max_segments=1)
        hub.wait_for(1, timeout=T)
        held = []
        for _ in range(2):
            hub.send("h", {"x": BIG})
            held.append(ch.recv(timeout=T))
        with pytest.raises(TransportTimeout, match="max_segments=2"):
            hub.send("h", {"x": BIG}, timeout=0.3)
        held.clear()
        hub.send("h", {"x": BIG}, timeout=T)  # waits for the releases, then goes
        assert np.array_equal(ch.recv(timeout=T)["x"], BIG)
        # and uplink: the hub's inbox holds the client's one allowed segment
        ch.send({"x": BIG})
        _until(lambda: bool(hub._inbox), "the first upload is delivered")
        with pytest.raises(TransportTimeout, match="max_segments=1"):
            ch.send({"x": BIG}, timeout=0.3)
        hub.recv(timeout=T)
        ch.send({"x": BIG}, timeout=T)
        assert np.array_equal(hub.recv(timeout=T)[1]["x"], BIG)


def test_a_receiver_holding_max_segments_does_not_hold_up_a_broadcast(connect):
    with tensorwire.serve(_url(), codec=None, max_segments=1) as hub:
        keeper = connect(hub.url, client_id="keeper", codec=None)
        other = connect(hub.url, client_id="other", codec=None)
        hub.wait_for(2, timeout=T)
        hub.send("keeper", {"x": BIG})
        held = [keeper.recv(timeout=T)]  # the one segment it may hold
        t = time.monotonic()
        sent = hub.broadcast({"x": BIG * 2}, timeout=0.5)
        assert sorted(sent) == ["other"] and isinstance(sent.failed["keeper"], TransportTimeout)
        assert time.monotonic() - t < T / 2
        assert np.array_equal(other.recv(timeout=T)["x"], BIG * 2)
        assert [e.client_id for e in hub.events if e.kind == "slow"] == ["keeper"]
        threading.Timer(0.3, held.clear).start()  # the keeper lets go while the hub waits
        sent = hub.broadcast({"x": BIG * 3}, timeout=T)
        assert sorted(sent) == ["keeper", "other"]
        for ch in (other, keeper):
            assert np.array_equal(ch.recv(timeout=T)["x"], BIG * 3)


def test_a_receiver_that_stops_reading_does_not_hold_up_a_broadcast(hub, connect):
    stuck = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    stuck.connect(address(hub.url.removeprefix("shm://")))
    # As a channel would say it: one codec group with "good", so one send round for both.
    hello = ClientSession("stuck", decoders=available_codecs(), max_message_bytes=16 << 30)
    stuck.send(hello.hello().to_bytes())
    stuck.recv(INLINE_BYTES)  # the welcome; then it reads nothing
    good = connect(hub.url, client_id="good", codec=None)  # joins second: is sent to second
    hub.wait_for(2, timeout=T)
    inline = {"x": np.zeros(15_000, np.float32)}  # 60 KiB: a packet
    with pytest.raises(TransportTimeout):
        for _ in range(1000):  # until its socket buffer is full
            hub.send("stuck", inline, timeout=0.2)
    arrived = []
    reader = threading.Thread(
        target=lambda: arrived.append((good.recv(timeout=T), time.monotonic()))
    )
    reader.start()
    t = time.monotonic()
    sent = hub.broadcast(inline, meta={"r": 1}, timeout=2.0)
    took = time.monotonic() - t
    reader.join(T)
    assert sorted(sent) == ["good"] and isinstance(sent.failed["stuck"], TransportTimeout)
    assert 1.5 < took < T / 2 and arrived[0][1] - t < 1.0  # good's came at once
    assert arrived[0][0].meta == {"r": 1} and "stuck" in hub.clients  # nothing half-sent
    stuck.close()


def test_a_refused_hello_is_answered_with_the_reason(hub):
    def refuse(hello, *tls_name) -> None:
        raise AuthenticationError("no token")

    hub.authenticate = refuse
    with pytest.raises(AuthenticationError, match="no token"):
        tensorwire.connect(hub.url, client_id="c", timeout=T)
    _until(lambda: any(e.kind == "refused" for e in hub.events), "reported, after its answer")
    assert hub.clients == [] and [e.kind for e in hub.events] == ["refused"]


def test_silent_connections_cost_no_thread_and_the_oldest_make_room(monkeypatch):
    monkeypatch.setattr(listener, "MAX_SILENT_PER_SOURCE", 3)  # read as the hub's listener is made
    with tensorwire.serve(_url(), codec=None) as hub:
        silent = []
        for _ in range(5):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            sock.connect(address(hub.url.removeprefix("shm://")))
            silent.append(sock)
        _until(lambda: sum("newer ones" in e.reason for e in hub.events) == 2, "two made room")
        assert hub._listener.silent <= 3 and not hub._listener._threads
        with tensorwire.connect(hub.url, client_id="late", timeout=T):  # spoke: in at once
            hub.wait_for(1, timeout=T)
        for sock in silent:
            sock.close()


def test_broadcast_writes_one_segment_that_every_client_maps(hub, connect):
    chans = [connect(hub.url, client_id=f"b{i}", codec=None) for i in range(3)]
    hub.wait_for(3, timeout=T)
    records = hub.broadcast({"x": BIG})
    assert sorted(records) == ["b0", "b1", "b2"]
    (seg,) = hub._outbox._segments.values()
    assert len(seg.mapped_by) == 3
    for ch in chans:
        assert np.array_equal(ch.recv(timeout=T)["x"], BIG)


def test_small_messages_travel_inline_and_are_writable(hub, connect):
    ch = connect(hub.url, client_id="s", codec=None)
    hub.wait_for(1, timeout=T)
    small = np.arange(100, dtype=np.int64)
    hub.send("s", {"x": small})
    msg = ch.recv(timeout=T)
    assert msg.wire_nbytes <= INLINE_BYTES and not hub._outbox._segments
    msg["x"][0] = 7  # the receiver's own memory
    assert np.array_equal(msg["x"][1:], small[1:])


def test_hub_closing_ends_the_channel_session(connect):
    hub = tensorwire.serve(_url())
    ch = connect(hub.url, client_id="c")
    hub.wait_for(1, timeout=T)
    hub.close()
    with pytest.raises(PeerGone):
        ch.recv(timeout=T)
    with pytest.raises(PeerGone):
        ch.send({"x": np.zeros(3)})


def test_names_are_checked_and_held_by_one_hub(hub):
    with pytest.raises(TransportError, match="another hub"):
        tensorwire.serve(hub.url)
    with pytest.raises(TransportError, match="1 to 90 characters"):
        tensorwire.serve("shm://no spaces")
    with pytest.raises(TransportError, match="names no hub"):
        tensorwire.connect("shm://")
    with pytest.raises(TransportTimeout):
        tensorwire.connect(_url(), timeout=0.2)
    url = hub.url
    hub.close()
    with tensorwire.serve(url):  # the name is free again once its hub closed
        pass


# -- bad input from a peer ------------------------------------------------------------


def _sealed_memfd(data: bytes, seals: int = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW) -> int:
    fd = os.memfd_create("test", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    os.write(fd, data)
    if seals:
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals)
    return fd


def _note(kind: str, **meta) -> bytes:
    return encode_message(None, meta, kind=kind).to_bytes()


def _hello(client_id: str) -> bytes:
    return ClientSession(client_id, decoders=[], max_message_bytes=1 << 30).hello().to_bytes()


def _corrupt_message() -> bytes:
    data = bytearray(encode_message({"x": BIG[:4096]}).to_bytes())
    data[-100] ^= 0xFF  # inside the tensor's bytes: its checksum no longer matches
    return bytes(data)


def _bad(case: str) -> tuple[bytes, list[int]]:
    """A packet (and the descriptors to attach) that is wrong in the way ``case`` says."""
    if case == "junk-packet":
        return b"\x00" * 100, []
    if case == "packet-too-big":
        return b"\x00" * (INLINE_BYTES + 1), []
    if case == "bad-meta":
        return _note("shm", seg="one", offset=0, nbytes=8), []
    if case == "unknown-segment":
        return _note("shm", seg=7, offset=0, nbytes=8), []
    if case == "unsealed":
        return _note("shm", seg=1, offset=0, nbytes=8), [_sealed_memfd(b"\0" * 4096, seals=0)]
    if case == "not-a-memfd":
        r, w = os.pipe()
        os.close(w)
        return _note("shm", seg=1, offset=0, nbytes=8), [r]
    if case == "overrun":
        return _note("shm", seg=1, offset=4000, nbytes=200), [_sealed_memfd(b"\0" * 4096)]
    if case == "declared-huge":
        return _note("shm", seg=1, offset=0, nbytes=1 << 40), [_sealed_memfd(b"\0" * 4096)]
    if case == "sparse":
        fd = _sealed_memfd(b"", seals=0)
        os.ftruncate(fd, 1 << 30)  # 1 GiB declared, nothing behind it
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW)
        return _note("shm", seg=1, offset=0, nbytes=1 << 30), [fd]
    if case == "release-not-held":
        return _note("release", seg=99), []
    if case == "corrupt-data":
        data = _corrupt_message()
        return _note("shm", seg=1, offset=0, nbytes=len(data)), [_sealed_memfd(data)]
    raise AssertionError(case)


EXPECTED = {
    "junk-packet": WireError,
    "packet-too-big": MessageTooLarge,
    "bad-meta": MalformedHeader,
    "unknown-segment": BadSegment,
    "unsealed": BadSegment,
    "not-a-memfd": BadSegment,
    "overrun": BadSegment,
    "declared-huge": BadSegment,
    "sparse": BadSegment,
    "release-not-held": BadSegment,
    "corrupt-data": ChecksumMismatch,
}


@pytest.mark.parametrize("case", sorted(EXPECTED))
def test_bad_packets_and_segments_are_refused_typed_and_others_served(case, hub, connect):
    good = connect(hub.url, client_id="good", codec=None)
    hub.wait_for(1, timeout=T)
    fds_before = _open_fds()
    packet, fds = _bad(case)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    sock.settimeout(T)
    sock.connect(address(hub.url.removeprefix("shm://")))
    sock.send(_hello("intruder"))
    sock.recv(INLINE_BYTES)
    hub.wait_for(2, timeout=T)
    ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
    sock.sendmsg([packet], ancillary)
    for fd in fds:
        os.close(fd)
    _until(lambda: hub.errors, "the hub reports the bad packet")
    ((who, err),) = hub.errors
    assert who == "intruder" and isinstance(err, EXPECTED[case]), err
    assert err.__traceback__ is None  # a kept error must not keep a segment's views alive
    assert "intruder" in hub.clients  # the packet boundary held: only that packet is lost
    sock.close()
    _until(lambda: hub.clients == ["good"], "the intruder is gone")
    _until(lambda: _open_fds() <= fds_before, "the descriptors it passed are closed")
    hub.send("good", {"x": BIG})
    assert np.array_equal(good.recv(timeout=T)["x"], BIG)
    good.send({"x": BIG})
    assert np.array_equal(hub.recv(timeout=T)[1]["x"], BIG)


# -- nothing leaked -----------------------------------------------------------------------

_CLIENT = textwrap.dedent(
    """
    import sys, time, numpy as np, tensorwire
    ch = tensorwire.connect(sys.argv[1], client_id="doomed", codec=None)
    msg = ch.recv(timeout=20)               # views of the hub's segment, kept
    ch.send({"x": np.ones(1 << 20, np.float32)})
    print("ready", flush=True)
    time.sleep(60)
    """
)


def test_a_killed_client_leaks_nothing(connect):
    fds_before, maps_before = _open_fds(), _memfd_maps()
    url = _url()
    name = url.removeprefix("shm://")
    shm_before = {f for f in os.listdir("/dev/shm") if name in f}  # others' come and go
    hub = tensorwire.serve(url, codec=None)
    try:
        proc = subprocess.Popen(
            [sys.executable, "-c", _CLIENT, url], stdout=subprocess.PIPE, text=True
        )
        try:
            hub.wait_for(1, timeout=T)
            hub.send("doomed", {"x": BIG})
            _, up = hub.recv(timeout=T)
            assert (up["x"] == 1).all()
            assert proc.stdout.readline() == "ready\n"
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(T)
            _until(lambda: not hub.clients, "the hub notices the client died")
            assert _held(hub._outbox) == []  # what the dead client held is free again
            del up
        finally:
            proc.kill()
            proc.wait(T)
            proc.stdout.close()
    finally:
        hub.close()
    _until(lambda: _open_fds() <= fds_before, "every descriptor is closed")
    _until(lambda: _memfd_maps() <= maps_before, "every segment is unmapped")
    assert {f for f in os.listdir("/dev/shm") if name in f} == shm_before
    with tensorwire.serve(url):  # and the name is free
        pass


def test_processes_of_other_users_are_refused(hub):
    if os.geteuid() != 0:
        pytest.skip("needs root to run a process as another user")
    code = textwrap.dedent(
        """
        import socket, sys
        s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        s.settimeout(10)
        s.connect("\\0" + sys.argv[1])
        s.send(bytes.fromhex(sys.argv[2]))
        print("refused" if b"refuse" in s.recv(65536) else "answered")
        """
    )
    hello = _hello("stranger")
    args = ["-I", "-c", code, address(hub.url[6:])[1:], hello.hex()]
    # The child needs no packages: any interpreter user 65534 may run will do.
    for python in (os.path.realpath(sys.executable), "/usr/bin/python3"):
        try:
            out = subprocess.run(
                [python, *args], user=65534, capture_output=True, text=True, timeout=T
            )
            break
        except PermissionError:
            continue
    else:
        pytest.skip("no python interpreter that user 65534 may run")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "refused" and hub.clients == []
    # the refusal goes out before the hub records it: the record may come a moment later
    _until(
        lambda: any("not of this user" in e.reason for e in hub.events if e.kind == "refused"),
        "the refusal is recorded",
    )


# -- security ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    pytest.importorskip("cryptography", reason="cryptography is not installed")
    from tensorwire.transports.certs import make_certs

    return make_certs(tmp_path_factory.mktemp("certs"), hosts=["127.0.0.1"], clients=["dev1"])


def test_keys_admit_and_tls_is_accepted_but_not_used(certs, connect):
    tls = tensorwire.TLS(cert=certs.hub_cert, key=certs.hub_key, ca=certs.ca)
    with tensorwire.serve(_url(), tls=tls, auth=tensorwire.Keys.load(certs.keys)) as hub:
        secret = certs.devices["dev1"]["secret"]
        ch = connect(hub.url, client_id="dev1", key=secret)  # no certificate: none is checked
        hub.wait_for(1, timeout=T)
        hub.send("dev1", {"x": BIG})
        assert np.array_equal(ch.recv(timeout=T)["x"], BIG)
        with pytest.raises(AuthenticationError, match="sent no proof"):
            connect(hub.url, client_id="dev1", tls=tensorwire.TLS(ca=certs.ca), timeout=T)
        assert hub.clients == ["dev1"]


def test_a_hub_asked_for_client_certificates_without_keys_refuses_to_start(certs):
    tls = tensorwire.TLS(cert=certs.hub_cert, key=certs.hub_key, ca=certs.ca)
    with pytest.raises(TransportError, match="cannot check client certificates"):
        tensorwire.serve(_url(), tls=tls)
    with tensorwire.serve(_url(), tls=tensorwire.TLS(cert=certs.hub_cert, key=certs.hub_key)):
        pass  # encryption alone asks for nothing shm:// lacks: no TLS, nothing leaves the host


def test_unknown_url_options_raise(hub):
    with pytest.raises(TransportError, match="unknown option"):
        tensorwire.serve(f"{_url()}?mode=fast")
    with pytest.raises(TransportError, match="unknown option"):
        tensorwire.connect(f"{hub.url}?mode=fast", client_id="c")
