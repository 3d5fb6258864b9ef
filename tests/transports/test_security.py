"""Authentication and encryption, for every scheme: only enrolled devices join, a stolen id
does not work, nothing replayed or altered is accepted, and no tensor byte travels in clear.

Scheme hooks (``tests/transports/schemes/<scheme>.py``), all optional:

- ``secure_hub_url(request, enrolment) -> str``: a URL for a secured hub (a broker scheme
  returns one on a private broker with a TLS listener); default: ``hub_url(request)``.
- ``hub_security(enrolment) -> dict`` / ``client_security(enrolment, client_id) -> dict``:
  the ``serve`` / ``connect`` keyword arguments; default: mutual TLS with the enrolment's CA
  plus ``auth=`` keys (hub) and ``key=`` the device's secret (client).
- ``proxied_url(url, port) -> str``: the URL a client uses to reach the hub (or its broker)
  through a TCP proxy listening on 127.0.0.1:``port``; without it the capture test is skipped.
- ``replay_last(url, enrolment)``: capture a message a client published on the shared medium
  and publish it again, once as is and once altered (broker schemes only).
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
import scheme_hooks
from recording_proxy import RecordingProxy

import tensorwire
from tensorwire.errors import AuthenticationError, TransportError
from tensorwire.transports.certs import Enrolment, make_certs

T = 30.0
PATTERN = np.frombuffer(b"TENSORWIRE-CLEARTEXT-PATTERN-42!" * 64, dtype=np.uint8)


@pytest.fixture(scope="session")
def enrolment(tmp_path_factory) -> Enrolment:
    pytest.importorskip("cryptography", reason="cryptography is not installed")
    return make_certs(
        tmp_path_factory.mktemp("certs"),
        hosts=["127.0.0.1", "localhost"],
        clients=["dev1", "dev2", "dev3"],
    )


def _hub_security(mod, e: Enrolment) -> dict:
    hook = scheme_hooks.optional(mod, "hub_security")
    if hook is not None:
        return hook(e)
    return {
        "tls": tensorwire.TLS(cert=e.hub_cert, key=e.hub_key, ca=e.ca),
        "auth": tensorwire.Keys.load(e.keys),
    }


def _client_security(mod, e: Enrolment, cid: str, as_id: str | None = None) -> dict:
    """Connect options for ``as_id`` (default ``cid``) holding ``cid``'s credentials."""
    hook = scheme_hooks.optional(mod, "client_security")
    if hook is not None:
        return hook(e, cid)
    files = e.devices[cid]
    return {
        "tls": tensorwire.TLS(cert=files["cert"], key=files["key"], ca=e.ca),
        "key": files["secret"],
    }


@pytest.fixture
def secure(scheme_module, request, enrolment):
    """``(hub, connect(cid, **overrides))`` for a secured hub of the scheme under test."""
    url_of = scheme_hooks.optional(scheme_module, "secure_hub_url")
    url = url_of(request, enrolment) if url_of else scheme_module.hub_url(request)
    hub = tensorwire.serve(url, codec=None, **_hub_security(scheme_module, enrolment))
    channels: list[tensorwire.Channel] = []

    def connect(cid: str, url: str | None = None, **overrides) -> tensorwire.Channel:
        options = {**_client_security(scheme_module, enrolment, cid), **overrides}
        ch = tensorwire.connect(url or hub.url, client_id=cid, codec=None, **options)
        channels.append(ch)
        return ch

    yield hub, connect
    for ch in channels:
        ch.close()
    hub.close()


def _round_trip(hub: tensorwire.Hub, ch: tensorwire.Channel, n: int) -> None:
    hub.send(ch.client_id, {"v": np.arange(n)}, timeout=T)
    assert np.array_equal(ch.recv(timeout=T)["v"], np.arange(n))
    ch.send({"v": np.arange(n + 1)}, timeout=T)
    who, msg = hub.recv(timeout=T)
    assert who == ch.client_id and np.array_equal(msg["v"], np.arange(n + 1))


def test_an_enrolled_device_joins_and_talks(secure):
    hub, connect = secure
    ch = connect("dev1")
    hub.wait_for(1, timeout=T)
    _round_trip(hub, ch, 5)


def test_without_credentials_a_client_cannot_join(secure, scheme_module, enrolment):
    hub, connect = secure
    with pytest.raises(TransportError):  # AuthenticationError, or a TLS refusal
        connect("dev1", tls=None, key=None, timeout=5)
    with pytest.raises(TransportError):
        connect("dev1", key=None, timeout=5)  # the certificate alone is not the secret
    assert hub.clients == []


def test_a_wrong_secret_gets_authentication_error(secure):
    hub, connect = secure
    with pytest.raises(AuthenticationError):
        connect("dev2", key=b"\x01" * 32, timeout=10)
    assert hub.clients == []


def test_an_id_takeover_fails_and_leaves_the_real_client_connected(
    secure, scheme_module, enrolment
):
    hub, connect = secure
    real = connect("dev1")
    hub.wait_for(1, timeout=T)
    thief = _client_security(scheme_module, enrolment, "dev2")  # enrolled, but as dev2
    with pytest.raises(AuthenticationError):
        connect("dev1", **thief, timeout=10)
    assert hub.clients == ["dev1"]
    _round_trip(hub, real, 3)


def test_a_replayed_or_altered_message_is_refused(secure, scheme_module, enrolment):
    replay = scheme_hooks.optional(scheme_module, "replay_last")
    if replay is None:
        pytest.skip(
            "not a shared medium: the transport's own encryption refuses replays and "
            "alterations (its own tests check it)"
        )
    hub, connect = secure
    ch = connect("dev1")
    hub.wait_for(1, timeout=T)
    ch.send({"v": np.arange(4)}, meta={"n": 1}, timeout=T)
    assert hub.recv(timeout=T)[1].meta == {"n": 1}
    replay(hub.url, enrolment)
    deadline = time.monotonic() + 5
    while hub.errors.total < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    with pytest.raises(tensorwire.TransportTimeout):
        hub.recv(timeout=1)  # neither the replay nor the altered copy was delivered
    assert hub.errors.total >= 2
    _round_trip(hub, ch, 2)


def test_no_tensor_bytes_travel_in_clear(secure, scheme_module):
    proxied = scheme_hooks.optional(scheme_module, "proxied_url")
    if proxied is None:
        pytest.skip("this scheme does not cross a network")
    hub, connect = secure
    target = scheme_module.proxy_target(hub.url)
    proxy = RecordingProxy(target)
    try:
        ch = connect("dev1", url=proxied(hub.url, proxy.port))
        hub.wait_for(1, timeout=T)
        hub.send("dev1", {"p": PATTERN}, timeout=T)
        assert np.array_equal(ch.recv(timeout=T)["p"], PATTERN)
        ch.send({"p": PATTERN}, timeout=T)
        assert np.array_equal(hub.recv(timeout=T)[1]["p"], PATTERN)
        time.sleep(0.2)
        seen = proxy.all_seen
        assert len(seen) > PATTERN.nbytes, "the proxy saw nothing: test is broken"
        assert bytes(PATTERN[:32]) not in seen, "tensor bytes crossed in clear"
    finally:
        proxy.close()


def test_the_certs_command_files_work_from_a_url(tmp_path, scheme, scheme_module, request):
    if scheme != "tcp":
        pytest.skip("URL options are parsed once for every scheme; tcp shows it")
    e = make_certs(tmp_path, hosts=["127.0.0.1"], clients=["dev9"])
    d = e.devices["dev9"]
    hub_url = f"tcp://127.0.0.1:0?cert={e.hub_cert}&certkey={e.hub_key}&ca={e.ca}&keys={e.keys}"
    with tensorwire.serve(hub_url) as hub:
        url = f"{hub.url}?ca={e.ca}&cert={d['cert']}&certkey={d['key']}&secret={d['secret']}"
        with tensorwire.connect(url, client_id="dev9") as ch:
            hub.wait_for(1, timeout=T)
            _round_trip(hub, ch, 2)
    assert Path(e.keys).stat().st_mode & 0o077 == 0


def test_a_hub_without_credentials_says_once_that_it_admits_anyone(make_hub, connect, caplog):
    import logging

    def said(words: str) -> list[logging.LogRecord]:
        return [r for r in caplog.records if words in r.getMessage()]

    with caplog.at_level(logging.INFO, logger="tensorwire"):
        hub = make_hub()
        connect(hub.url, client_id="a")
        connect(hub.url, client_id="b")
        hub.wait_for(2, timeout=T)
        # the hub's thread logs a join (and, the first time, the warning) as it admits it
        deadline = time.monotonic() + T
        while len(said("joined")) < 2 or not said("accepts ANYONE"):
            assert time.monotonic() < deadline, [r.getMessage() for r in caplog.records]
            time.sleep(0.01)
    assert len(said("accepts ANYONE")) == 1
