"""zmq+tcp:// under CURVE: key files and URL options, mismatched encryption on either side,
wrong keys, a credential replacing its own session, and what crosses the wire (through a
recording proxy): no tensor or id in clear, an altered message never delivered, a replayed
connection refused."""

from __future__ import annotations

import shutil
import socket
import time

import numpy as np
import pytest
from recording_proxy import RecordingProxy
from waiting import until

zmq = pytest.importorskip("zmq", reason="pyzmq is not installed (extra 'zmq')")

from zmq_helpers import (  # noqa: E402
    T,
    fixture_hub,  # noqa: F401  (a fixture: hub)
)

import tensorwire  # noqa: E402
from tensorwire.errors import (  # noqa: E402
    AuthenticationError,
    PeerGone,
    TransportError,
    TransportTimeout,
)


@pytest.fixture(scope="module")
def enrolment(tmp_path_factory):
    pytest.importorskip("cryptography", reason="cryptography is not installed")
    from tensorwire.transports.certs import make_certs

    return make_certs(tmp_path_factory.mktemp("certs"), hosts=["127.0.0.1"], clients=["d1", "d2"])


@pytest.fixture
def curve_hub(enrolment):
    """A hub encrypting with CURVE (``hub.curve``) and admitting only enrolled devices."""
    d = enrolment.directory
    with tensorwire.serve(
        f"zmq+tcp://127.0.0.1:0?curve={d / 'hub.curve'}&keys={enrolment.keys}", codec=None
    ) as h:
        yield h


def _secured(enrolment, cid: str) -> dict:
    return {"curve": enrolment.directory / "hub.curve.pub", "key": enrolment.devices[cid]["secret"]}


def test_curve_and_secrets_from_url_options(curve_hub, enrolment):
    d = enrolment.directory
    url = f"{curve_hub.url}?curve={d / 'hub.curve.pub'}&secret={enrolment.devices['d1']['secret']}"
    with tensorwire.connect(url, client_id="d1", codec=None) as ch:
        curve_hub.wait_for(1, timeout=T)
        arr = np.arange(3 << 20, dtype=np.float32)  # 12 MiB: many pieces, zero-copy frames
        curve_hub.send("d1", {"x": arr}, timeout=T)
        assert np.array_equal(ch.recv(timeout=T)["x"], arr)
        ch.send({"x": arr[:5]}, timeout=T)
        assert np.array_equal(curve_hub.recv(timeout=T)[1]["x"], arr[:5])


def test_unknown_url_options_raise(enrolment):
    with pytest.raises(TransportError, match="unknown option"):
        tensorwire.serve("zmq+tcp://127.0.0.1:0?curv=x")
    with pytest.raises(TransportError, match="unknown option"):
        tensorwire.connect("zmq+tcp://127.0.0.1:1?linger=5", timeout=1)
    with pytest.raises(TransportError, match="differ"):
        tensorwire.serve("zmq+tcp://127.0.0.1:0?curve=a", curve="b")


def test_a_client_without_curve_is_told_at_once(curve_hub, enrolment):
    t = time.monotonic()
    with pytest.raises(AuthenticationError, match="CURVE"):
        tensorwire.connect(curve_hub.url, client_id="d1", key=enrolment.devices["d1"]["secret"])
    assert time.monotonic() - t < 10  # not the 30 s default timeout
    assert until(lambda: any(e.kind == "refused" for e in curve_hub.events))
    # "it connected without CURVE", or, when the client saw the mismatch first and hung up,
    # "it closed the connection during the ZMTP handshake (a client without CURVE ...?)"
    assert "without CURVE" in next(e.reason for e in curve_hub.events if e.kind == "refused")
    assert curve_hub.clients == []


def test_a_curve_client_does_not_talk_to_a_hub_in_clear(hub, enrolment):
    with pytest.raises(AuthenticationError, match="not encrypt"):  # both ways libzmq tells it
        tensorwire.connect(hub.url, client_id="d1", **_secured(enrolment, "d1"))
    assert hub.clients == []


def test_a_wrong_hub_key_is_an_authentication_error(curve_hub, enrolment):
    with pytest.raises(AuthenticationError, match="its key is not the public key"):
        tensorwire.connect(
            curve_hub.url,
            client_id="d1",
            curve=enrolment.directory / "d2.curve",  # some other key pair's public key
            key=enrolment.devices["d1"]["secret"],
        )
    assert until(lambda: any("public key" in e.reason for e in curve_hub.events))


def test_the_hub_key_is_found_beside_the_ca_and_hub_curve_is_a_fallback(
    curve_hub, enrolment, tmp_path, caplog
):
    key = enrolment.devices["d1"]["secret"]
    with tensorwire.connect(
        curve_hub.url, client_id="d1", tls=tensorwire.TLS(ca=enrolment.ca), key=key
    ):
        curve_hub.wait_for(1, timeout=T)
    for name in ("ca.pem", "hub.curve"):  # an older directory: no hub.curve.pub
        shutil.copy(enrolment.directory / name, tmp_path / name)
    with tensorwire.connect(
        curve_hub.url, client_id="d1", tls=tensorwire.TLS(ca=tmp_path / "ca.pem"), key=key
    ):
        pass
    assert any("SECRET" in r.getMessage() for r in caplog.records)
    (tmp_path / "hub.curve").unlink()
    with pytest.raises(TransportError, match=r"hub\.curve\.pub"):
        tensorwire.connect(
            curve_hub.url, client_id="d1", tls=tensorwire.TLS(ca=tmp_path / "ca.pem")
        )


def test_a_hub_that_would_check_certificates_it_cannot_see_is_refused(enrolment):
    e = enrolment
    mutual = tensorwire.TLS(cert=e.hub_cert, key=e.hub_key, ca=e.ca)
    with pytest.raises(TransportError, match="cannot check client certificates"):
        tensorwire.serve("zmq+tcp://127.0.0.1:0", tls=mutual)
    with (
        tensorwire.serve("zmq+tcp://127.0.0.1:0", tls=mutual, auth=e.keys) as h,  # keys: fine
        tensorwire.connect(h.url, client_id="d2", **_secured(e, "d2")),
    ):
        h.wait_for(1, timeout=T)
    with pytest.raises(TransportError, match="curve=FILE"):
        tensorwire.serve("zmq+tcp://127.0.0.1:0", tls=tensorwire.TLS(), auth=e.keys)


def test_key_file_errors_name_the_file_and_never_the_key(enrolment, tmp_path):
    public, secret = (enrolment.directory / "hub.curve").read_text().split()
    cases = {
        "swapped.curve": f"{secret}\n{public}\n",  # the secret first
        "public-only.curve": f"{public}\n",
        "bad.curve": f"{public}\n{secret[:-1]}~~\n",
        "binary.curve": "\u00e9" * 80,
    }
    for name, text in cases.items():
        (tmp_path / name).write_text(text)
        with pytest.raises(TransportError) as info:
            tensorwire.serve("zmq+tcp://127.0.0.1:0", curve=tmp_path / name, auth=enrolment.keys)
        assert name in str(info.value) and secret not in str(info.value)
        assert secret[:8] not in str(info.value)
    with pytest.raises(TransportError, match="cannot read"):
        tensorwire.serve("zmq+tcp://127.0.0.1:0", curve=tmp_path / "missing.curve")


def test_the_same_credential_replaces_a_session_and_another_cannot(curve_hub, enrolment):
    first = tensorwire.connect(curve_hub.url, client_id="d1", **_secured(enrolment, "d1"))
    second = tensorwire.connect(curve_hub.url, client_id="d1", **_secured(enrolment, "d1"))
    try:
        assert until(lambda: any(e.kind == "replaced" for e in curve_hub.events))
        with pytest.raises(AuthenticationError, match="does not know its secret"):
            tensorwire.connect(
                curve_hub.url,
                client_id="d1",
                curve=enrolment.directory / "hub.curve.pub",
                key=enrolment.devices["d2"]["secret"],
            )
        curve_hub.send("d1", {"v": np.arange(3)}, timeout=T)
        assert np.array_equal(second.recv(timeout=T)["v"], np.arange(3))
        assert curve_hub.clients == ["d1"]
    finally:
        first.close()
        second.close()


@pytest.fixture
def proxy(curve_hub):
    p = RecordingProxy(("127.0.0.1", int(curve_hub.url.rsplit(":", 1)[1])))
    yield p
    p.close()


def _through(proxy: RecordingProxy, enrolment, cid: str = "d1") -> tensorwire.Channel:
    url = f"zmq+tcp://127.0.0.1:{proxy.port}"
    return tensorwire.connect(url, client_id=cid, codec=None, **_secured(enrolment, cid))


def test_neither_tensors_nor_client_and_session_ids_cross_in_clear(curve_hub, proxy, enrolment):
    """Under CURVE the routing id (= session id) travels encrypted too: nobody on the path
    learns which routing id would receive a client's messages."""
    pattern = np.frombuffer(b"ZMQ-CURVE-CLEARTEXT-CHECK-PATTERN" * 64, np.uint8)
    with _through(proxy, enrolment) as ch:
        curve_hub.wait_for(1, timeout=T)
        session = ch._session.session
        curve_hub.send("d1", {"p": pattern}, timeout=T)
        assert np.array_equal(ch.recv(timeout=T)["p"], pattern)
        ch.send({"p": pattern}, timeout=T)
        curve_hub.recv(timeout=T)
    wire = bytes(proxy.seen["up"] + proxy.seen["down"])
    assert len(wire) > 2 * pattern.nbytes and b"CURVE" in wire  # the ZMTP greeting
    for clear in (bytes(pattern[:32]), session.encode(), b"d1\x00", b'"d1"', b"hello"):
        assert clear not in wire


def test_an_altered_message_is_never_delivered(curve_hub, proxy, enrolment):
    with _through(proxy, enrolment) as ch:
        curve_hub.wait_for(1, timeout=T)
        proxy.flip_next("down")
        curve_hub.send("d1", {"v": np.arange(1000)}, timeout=T)
        with pytest.raises(PeerGone):  # at once: libzmq would stall the connection instead
            ch.recv(timeout=T)
    with _through(proxy, enrolment, "d2") as ch:
        assert until(lambda: "d2" in curve_hub.clients)
        proxy.flip_next("up")
        ch.send({"v": np.arange(1000)}, timeout=T)
        with pytest.raises(TransportTimeout):
            curve_hub.recv(timeout=2)
        assert any("altered" in e.reason for e in curve_hub.events if e.kind == "refused")


def test_a_replayed_connection_is_refused(curve_hub, proxy, enrolment):
    with _through(proxy, enrolment) as ch:
        curve_hub.wait_for(1, timeout=T)
        ch.send({"v": np.arange(4)}, timeout=T)
        curve_hub.recv(timeout=T)
    assert until(lambda: curve_hub.clients == [])
    refused = sum(e.kind == "refused" for e in curve_hub.events)
    replay = socket.create_connection(("127.0.0.1", int(curve_hub.url.rsplit(":", 1)[1])))
    try:
        replay.sendall(bytes(proxy.seen["up"]))  # the client's side of the whole connection
        # the CURVE handshake fails: the hub's per-connection cookie key is not the old one
        assert until(lambda: sum(e.kind == "refused" for e in curve_hub.events) > refused)
        with pytest.raises(TransportTimeout):
            curve_hub.recv(timeout=1)
        assert curve_hub.clients == []
    finally:
        replay.close()
