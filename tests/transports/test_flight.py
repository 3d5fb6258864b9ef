"""flight:// specifics: batching without copies, the two-call session, hostile clients."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.flight as flight
import pytest
from waiting import until

import tensorwire
from tensorwire.errors import (
    AuthenticationError,
    PeerGone,
    TransportError,
    TransportTimeout,
    WireError,
)
from tensorwire.transports.flight import batches as flight_batches
from tensorwire.transports.flight import hub as flight_hub
from tensorwire.transports.flight import options as flight_options
from tensorwire.transports.session import ClientSession
from tensorwire.transports.url import host_port
from tensorwire.wire import encode_message

T = 20.0


@pytest.fixture
def hub():
    with tensorwire.serve("flight://127.0.0.1:0") as h:
        yield h


@dataclass
class RawSession:
    """A session opened with plain pyarrow.flight calls, to misbehave in ways a channel won't."""

    client: flight.FlightClient
    down: flight.FlightStreamReader
    down_writer: flight.FlightStreamWriter
    up: flight.FlightStreamWriter

    def close(self) -> None:
        for closable in (self.up, self.down_writer, self.client):
            with contextlib.suppress(pa.ArrowException):  # the hub ended the call first
                closable.close()


def _raw_session(
    url: str, client_id: str, uplink: bool = True, schema: pa.Schema = flight_options.SCHEMA
) -> RawSession:
    client = flight.FlightClient(flight.Location.for_grpc_tcp(*host_port(url)))
    session = ClientSession(client_id, decoders=[], max_message_bytes=1 << 30)
    hello = flight.FlightDescriptor.for_command(session.hello().to_bytes())
    down_writer, down = client.do_exchange(hello)
    down_writer.done_writing()
    up = None
    if uplink:
        up, _ = client.do_exchange(
            flight.FlightDescriptor.for_path(*flight_options.UP, session.session)
        )
        up.begin(schema)
    return RawSession(client, down, down_writer, up)


def test_pieces_are_capped_and_big_tensors_go_uncopied():
    big = np.arange(3 << 18, dtype=np.float32)  # 3 MiB
    tensors = {"big": big, "empty": np.zeros(0), **{f"s{i}": np.full(10, i) for i in range(50)}}
    enc = encode_message(tensors)
    for _ in range(2):  # the second walk finds the digests cached, as a broadcast does
        pieces = list(flight_batches.pieces(enc, 1 << 20))
        assert max(len(p) for p in pieces) <= 1 << 20
        assert b"".join(bytes(p) for p in pieces) == enc.to_bytes()
        from_big = [p for p in pieces if np.shares_memory(np.frombuffer(p, np.uint8), big)]
        assert sum(len(p) for p in from_big) == big.nbytes
        assert len(pieces) == 3 + 2  # the big tensor in three, the small ones joined around it


def test_batch_bytes_are_views_of_the_arrow_buffer():
    data = np.arange(1000, dtype=np.uint8)
    batch = flight_batches.batch_of(memoryview(data))
    view = flight_batches.bytes_of(batch)
    assert bytes(view) == data.tobytes() and np.shares_memory(np.frombuffer(view, np.uint8), data)


def test_tiny_batches_round_trip_both_ways():
    tensors = {
        "big": np.random.default_rng(0).standard_normal((300, 500)),
        "small": {f"t{i}": np.arange(i, dtype=np.int16) for i in range(30)},
        "empty": np.zeros((0, 3), np.float32),
    }
    with (
        tensorwire.serve("flight://127.0.0.1:0", codec=None, batch_bytes=4096) as hub,
        tensorwire.connect(hub.url, client_id="c", codec=None, batch_bytes=3000) as ch,
    ):
        hub.wait_for(1, timeout=T)
        hub.send("c", tensors)
        first = ch.recv(timeout=T)
        hub.send("c", tensors)
        second = ch.recv(timeout=T, out=first.tensors)
        assert second["big"] is first["big"]
        assert np.array_equal(second["big"], tensors["big"])
        ch.send(tensors)
        _, back = hub.recv(timeout=T)
    assert np.array_equal(back["big"], tensors["big"])
    for i in range(30):
        assert np.array_equal(back["small"][f"t{i}"], np.arange(i, dtype=np.int16))
    assert back["empty"].shape == (0, 3)


def test_batch_of_another_schema_ends_the_session_with_a_wire_error(hub):
    reasons = {}
    hub.on_leave = lambda cid, reason: reasons.setdefault(cid, reason)
    good = tensorwire.connect(hub.url, client_id="good")
    ints = pa.RecordBatch.from_arrays(
        [pa.Array.from_buffers(pa.int64(), 4, [None, pa.py_buffer(np.arange(4))])], names=["n"]
    )
    evil = _raw_session(hub.url, "evil", schema=ints.schema)
    hub.wait_for(2, timeout=T)
    evil.up.write_batch(ints)
    assert until(lambda: hub.errors)
    assert until(lambda: "evil" in reasons) and "not a tensorwire message" in reasons["evil"]
    assert isinstance(hub.errors[0][1], WireError) and hub.clients == ["good"]
    good.send({"v": np.arange(3)})
    assert hub.recv(timeout=T)[0] == "good"
    evil.close()
    good.close()


def test_bad_control_message_is_reported_and_the_session_goes_on(hub):
    raw = _raw_session(hub.url, "odd")
    hub.wait_for(1, timeout=T)
    raw.up.write_metadata(b"not a message")
    raw.up.write_batch(flight_batches.batch_of(encode_message({"v": np.arange(3)}).to_bytes()))
    client, msg = hub.recv(timeout=T)
    assert client == "odd" and np.array_equal(msg["v"], np.arange(3))
    assert len(hub.errors) == 1 and isinstance(hub.errors[0][1], WireError)
    assert hub.clients == ["odd"]
    raw.close()


def test_junk_hello_is_refused_and_reported(hub):
    client = flight.FlightClient(flight.Location.for_grpc_tcp(*host_port(hub.url)))
    writer, reader = client.do_exchange(
        flight.FlightDescriptor.for_command(b"GET / HTTP/1.1\r\n" * 4)
    )
    writer.done_writing()
    with pytest.raises(StopIteration):
        reader.read_chunk()  # the hub ends the call without a welcome
    assert until(lambda: any(e.kind == "refused" for e in hub.events))  # reported after it ends
    (refused,) = [e for e in hub.events if e.kind == "refused"]
    assert "magic" in refused.reason and hub.clients == []
    client.close()


def test_a_refused_hello_is_answered_with_the_reason(hub):
    def refuse(hello, *tls_name) -> None:
        raise AuthenticationError("no token")

    hub.authenticate = refuse
    with pytest.raises(AuthenticationError, match="no token"):
        tensorwire.connect(hub.url, client_id="c", timeout=T)
    assert until(lambda: any(e.kind == "refused" for e in hub.events))  # reported after it answers
    assert until(lambda: hub._handshakes == 0)  # the uplink, opened beside the hello, ended too
    assert hub.clients == [] and [e.kind for e in hub.events] == ["refused"]  # one attempt, once
    assert "no token" in hub.events[0].reason


def test_an_uplink_naming_no_session_is_refused_when_it_hangs_up(hub):
    client = flight.FlightClient(flight.Location.for_grpc_tcp(*host_port(hub.url)))
    # The writer is kept: dropping it closes the call, which waits for the hub to end it.
    _writer, reader = client.do_exchange(
        flight.FlightDescriptor.for_path(*flight_options.UP, "nobody")
    )
    assert until(lambda: hub._handshakes == 1)  # the hub's end waits for the session
    t = time.monotonic()
    reader.cancel()
    assert until(lambda: any(e.kind == "refused" for e in hub.events))
    assert time.monotonic() - t < flight_options.HANDSHAKE_TIMEOUT / 2  # not the whole window
    client.close()


def test_unknown_descriptor_is_refused_with_a_clear_error(hub):
    client = flight.FlightClient(flight.Location.for_grpc_tcp(*host_port(hub.url)))
    _, reader = client.do_exchange(flight.FlightDescriptor.for_path("other"))
    with pytest.raises(flight.FlightServerError, match="tensorwire hub"):
        reader.read_chunk()
    client.close()


def test_session_without_uplink_is_refused(hub, monkeypatch):
    monkeypatch.setattr(flight_hub, "HANDSHAKE_TIMEOUT", 0.2)
    raw = _raw_session(hub.url, "half", uplink=False)
    with pytest.raises(StopIteration):
        raw.down.read_chunk()  # no welcome: the session never joined
    assert hub.clients == []
    raw.client.close()


def test_hub_close_says_bye_to_channels():
    hub = tensorwire.serve("flight://127.0.0.1:0")
    ch = tensorwire.connect(hub.url, client_id="c")
    hub.wait_for(1, timeout=T)
    t = time.monotonic()
    hub.close()
    assert time.monotonic() - t < flight_options.SHUTDOWN_TIMEOUT
    with pytest.raises(PeerGone, match="closed the session"):
        ch.recv(timeout=T)
    with pytest.raises(PeerGone):
        ch.send({"v": np.zeros(1)})
    ch.close()


def test_client_whose_process_dies_leaves(hub):
    reasons = {}
    hub.on_leave = lambda cid, reason: reasons.setdefault(cid, reason)
    code = (
        "import sys, time, tensorwire\n"
        f"ch = tensorwire.connect({hub.url!r}, client_id='doomed')\n"
        "print('up', flush=True)\n"
        "time.sleep(60)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    try:
        assert proc.stdout.readline() == b"up\n"
        hub.wait_for(1, timeout=T)
    finally:
        proc.kill()
        proc.wait(timeout=T)
    assert until(lambda: "doomed" in reasons) and "connection broke" in reasons["doomed"]
    assert hub.clients == []


def test_send_to_a_client_that_stops_reading_times_out_and_drops_it(hub):
    raw = _raw_session(hub.url, "stuck")
    hub.wait_for(1, timeout=T)
    raw.down.read_chunk()  # the welcome; then it reads nothing more
    big = np.ones(64 << 20, np.uint8)
    t = time.monotonic()
    with pytest.raises(TransportTimeout, match="dropped"):
        hub.send("stuck", {"x": big}, timeout=0.5)
    assert time.monotonic() - t < T / 2
    assert hub.clients == []
    raw.close()  # ends the blocked write, so the hub closes promptly


def test_sends_with_a_deadline_share_one_watchdog_thread(hub):
    ch = tensorwire.connect(hub.url, client_id="w", codec=None)
    hub.wait_for(1, timeout=T)
    before = threading.active_count()
    for _ in range(50):
        ch.send({"v": np.arange(3)}, timeout=T)
        hub.recv(timeout=T)
    mine = [t for t in threading.enumerate() if t.name == "tensorwire-flight-deadline-w"]
    assert len(mine) == 1 and threading.active_count() <= before + 1
    ch.close()
    assert until(lambda: not mine[0].is_alive())


class _DeafHub(flight.FlightServerBase):
    """Welcomes a channel, then never reads its uplink."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0))
        self.release = threading.Event()

    def do_exchange(self, context, descriptor, reader, writer) -> None:
        if descriptor.descriptor_type == flight.DescriptorType.CMD:
            writer.begin(flight_options.SCHEMA)
            welcome = encode_message(None, {"decoders": [], "version": 2}, kind="welcome")
            writer.write_metadata(welcome.to_bytes())
        self.release.wait(T)


def test_channel_send_to_a_hub_that_stops_reading_times_out():
    server = _DeafHub()
    try:
        ch = tensorwire.connect(f"flight://127.0.0.1:{server.port}", client_id="c", codec=None)
        t = time.monotonic()
        with pytest.raises(TransportTimeout):
            ch.send({"x": np.ones(64 << 20, np.uint8)}, timeout=0.5)
        assert time.monotonic() - t < T / 2
        with pytest.raises(PeerGone, match="reconnect"):
            ch.send({"x": np.ones(1)})
        ch.close()
    finally:
        server.release.set()
        server.shutdown()


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    pytest.importorskip("cryptography", reason="cryptography is not installed")
    from tensorwire.transports.certs import make_certs

    return make_certs(
        tmp_path_factory.mktemp("certs"), hosts=["127.0.0.1"], clients=["dev1", "dev2"]
    )


def _device_tls(certs, cid: str, **overrides) -> tensorwire.TLS:
    files = certs.devices[cid]
    return tensorwire.TLS(
        **{"cert": files["cert"], "key": files["key"], "ca": certs.ca, **overrides}
    )


def test_a_tls_hub_serves_no_plaintext(certs):
    with tensorwire.serve(
        "flight://127.0.0.1:0", tls=tensorwire.TLS(cert=certs.hub_cert, key=certs.hub_key)
    ) as hub:
        with pytest.raises(TransportTimeout):
            tensorwire.connect(hub.url, client_id="plain", timeout=1)
        raw = flight.FlightClient(flight.Location.for_grpc_tcp(*host_port(hub.url)))
        with pytest.raises(flight.FlightUnavailableError):  # at the call, or its first read
            _, reader = raw.do_exchange(flight.FlightDescriptor.for_command(b"x"))
            reader.read_chunk()
        raw.close()
        with tensorwire.connect(hub.url, client_id="c", tls=tensorwire.TLS(ca=certs.ca)) as ch:
            hub.wait_for(1, timeout=T)
            hub.send("c", {"v": np.arange(3)})
            assert np.array_equal(ch.recv(timeout=T)["v"], np.arange(3))
        assert hub.authenticate is None  # TLS alone (no CA, no keys) checks no client


def test_mutual_tls_alone_checks_the_certificate_name(certs):
    tls = tensorwire.TLS(cert=certs.hub_cert, key=certs.hub_key, ca=certs.ca)
    with tensorwire.serve("flight://127.0.0.1:0", tls=tls) as hub:
        with pytest.raises(AuthenticationError, match="certificate is for 'dev2'"):
            tensorwire.connect(hub.url, client_id="dev1", tls=_device_tls(certs, "dev2"))
        with tensorwire.connect(hub.url, client_id="dev1", tls=_device_tls(certs, "dev1")):
            hub.wait_for(1, timeout=T)
        with pytest.raises(TransportTimeout):  # no client certificate: gRPC refuses the TLS
            tensorwire.connect(
                hub.url, client_id="dev1", tls=tensorwire.TLS(ca=certs.ca), timeout=1
            )


def test_a_hub_certificate_that_does_not_verify_is_final(certs, tmp_path):
    from tensorwire.transports.certs import make_certs

    other = make_certs(tmp_path, hosts=["127.0.0.1"], clients=["dev1"])
    tls = tensorwire.TLS(cert=certs.hub_cert, key=certs.hub_key)
    with tensorwire.serve("flight://127.0.0.1:0", tls=tls) as hub:
        t = time.monotonic()
        with pytest.raises(AuthenticationError, match="failed on a certificate"):
            tensorwire.connect(hub.url, client_id="c", tls=tensorwire.TLS(ca=other.ca), timeout=T)
        with pytest.raises(AuthenticationError, match="failed on a certificate"):
            tensorwire.connect(
                hub.url,
                client_id="c",
                tls=tensorwire.TLS(ca=certs.ca, server_name="elsewhere"),
                timeout=T,
            )
        assert time.monotonic() - t < T / 2  # refused, not retried until the timeout
        assert hub.clients == []


def test_an_uplink_from_another_certificate_does_not_attach(certs, monkeypatch):
    monkeypatch.setattr(flight_hub, "HANDSHAKE_TIMEOUT", 0.5)
    tls = tensorwire.TLS(cert=certs.hub_cert, key=certs.hub_key, ca=certs.ca)
    with tensorwire.serve("flight://127.0.0.1:0", tls=tls) as hub:
        location = flight.Location.for_grpc_tls(*host_port(hub.url))

        def client(cid: str) -> flight.FlightClient:
            files = certs.devices[cid]
            return flight.FlightClient(
                location,
                tls_root_certs=certs.ca.read_bytes(),
                cert_chain=files["cert"].read_bytes(),
                private_key=files["key"].read_bytes(),
            )

        owner, thief = client("dev1"), client("dev2")
        session = ClientSession("dev1", decoders=[], max_message_bytes=1 << 20)
        down_writer, down = owner.do_exchange(
            flight.FlightDescriptor.for_command(session.hello().to_bytes())
        )
        down_writer.done_writing()
        up, _ = thief.do_exchange(
            flight.FlightDescriptor.for_path(*flight_options.UP, session.session)
        )
        with contextlib.suppress(*flight_options.FLIGHT_ERRORS):  # refused at once, maybe
            up.begin(flight_options.SCHEMA)
        with pytest.raises(StopIteration):
            while True:  # the schema, then the end: no welcome
                assert down.read_chunk().app_metadata is None
        assert until(lambda: any("no opening session" in e.reason for e in hub.events))
        assert hub.clients == []
        for c in (owner, thief):
            c.close()


def test_tls_files_are_checked_at_once(certs, tmp_path):
    with pytest.raises(TransportError, match="cert= and key="):
        tensorwire.serve("flight://127.0.0.1:0", tls=tensorwire.TLS(ca=certs.ca))
    bad = tmp_path / "bad.pem"
    bad.write_text("not a certificate")
    with pytest.raises(OSError):
        tensorwire.connect("flight://127.0.0.1:1", client_id="c", tls=tensorwire.TLS(ca=bad))


def test_unknown_url_options_raise(hub):
    with pytest.raises(TransportError, match="unknown option"):
        tensorwire.serve("flight://127.0.0.1:0?compress=1")
    with pytest.raises(TransportError, match="unknown option"):
        tensorwire.connect(f"{hub.url}?compress=1", client_id="c")


def test_a_client_certificate_that_names_no_one_is_refused(certs, tmp_path):
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    ca_key = serialization.load_pem_private_key((certs.directory / "ca.key").read_bytes(), None)
    ca = x509.load_pem_x509_certificate(certs.ca.read_bytes())
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([]))  # signed by the CA, but no common name nor SAN
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .sign(ca_key, hashes.SHA256())
    )
    (tmp_path / "anon.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (tmp_path / "anon.key").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    tls = tensorwire.TLS(cert=certs.hub_cert, key=certs.hub_key, ca=certs.ca)
    with tensorwire.serve("flight://127.0.0.1:0", tls=tls) as hub:
        anon = tensorwire.TLS(cert=tmp_path / "anon.pem", key=tmp_path / "anon.key", ca=certs.ca)
        with pytest.raises(AuthenticationError, match="names no one"):
            tensorwire.connect(hub.url, client_id="dev1", tls=anon, timeout=T)
        assert hub.clients == []
