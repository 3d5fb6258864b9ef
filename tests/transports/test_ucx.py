"""ucx:// beyond the shared suites: its URL options, and the sealed records that carry an
authenticated session (UCX encrypts nothing): bytes on the stream are not the tensor's, and a
record forged, altered or replayed ends the connection instead of reaching ``recv``."""

from __future__ import annotations

import numpy as np
import pytest

from tensorwire.errors import PeerGone, TransportError
from tensorwire.transports.ucx.records import Records
from tensorwire.transports.ucx.settings import UcxSettings

KEY = bytes(range(32))
PATTERN = b"TENSORWIRE-CLEARTEXT-PATTERN-42!" * 64


def test_url_options_become_ucx_settings_and_unknown_ones_are_refused():
    s = UcxSettings.from_url("ucx://127.0.0.1:0?ucx_tls=tcp,cma,self&ucx_net_devices=lo")
    assert s.config()["TLS"] == "tcp,cma,self" and s.config()["NET_DEVICES"] == "lo"
    assert s.query() == "?ucx_tls=tcp,cma,self"
    assert UcxSettings.from_url("ucx://127.0.0.1:0").config()["NET_DEVICES"] == "lo"
    with pytest.raises(TransportError, match="unknown option"):
        UcxSettings.from_url("ucx://127.0.0.1:0?tls_list=tcp")
    with pytest.raises(TransportError, match="comma-separated"):
        UcxSettings.from_url("ucx://127.0.0.1:0?ucx_tls=tcp;rm -rf")


def _open_all(receiver: Records, records: list[bytearray]) -> bytes:
    out = b""
    for rec in records:
        receiver.head[:] = rec[:4]
        size = receiver.body_size()
        out += bytes(receiver.open(memoryview(rec)[4 : 4 + size]))
    return out


def test_sealed_records_hide_the_tensor_and_open_only_for_the_peer():
    hub, client = Records(KEY, hub=True), Records(KEY, hub=False)
    records = client.seal([PATTERN, np.arange(300_000, dtype=np.int64)])
    assert all(PATTERN[:32] not in bytes(r) for r in records), "tensor bytes in clear"
    assert len(records) >= 3  # 2.4 MB: cut into 1 MiB records
    opened = _open_all(hub, records)
    assert opened[: len(PATTERN)] == PATTERN
    assert opened[len(PATTERN) :] == np.arange(300_000, dtype=np.int64).tobytes()


def test_a_forged_altered_replayed_or_reflected_record_is_refused():
    hub, client = Records(KEY, hub=True), Records(KEY, hub=False)
    first, second = client.seal([PATTERN]), client.seal([b"x" * 100])
    altered = bytearray(second[0])
    altered[10] ^= 1
    with pytest.raises(PeerGone, match="authentication"):
        _open_all(hub, [altered])
    hub2 = Records(KEY, hub=True)
    _open_all(hub2, first)
    with pytest.raises(PeerGone, match="authentication"):
        _open_all(hub2, first)  # replayed: the counter moved on
    with pytest.raises(PeerGone, match="authentication"):
        _open_all(Records(KEY, hub=False), first)  # reflected back to its sender's side
    with pytest.raises(PeerGone, match="authentication"):
        _open_all(Records(bytes(32), hub=True), first)  # another session's key
    stranger = Records(KEY, hub=True)
    stranger.head[:] = (1 << 30).to_bytes(4, "big")
    with pytest.raises(PeerGone, match="allowed"):
        stranger.body_size()  # a record declaring 1 GiB is refused before it is read


def test_a_secured_session_round_trips_over_ucx(tmp_path):
    pytest.importorskip("ucxx", reason="ucxx is not installed (extra 'ucx')")
    import tensorwire
    from tensorwire.transports.certs import make_certs

    e = make_certs(tmp_path, hosts=["127.0.0.1"], clients=["dev1"])
    hub = tensorwire.serve("ucx://127.0.0.1:0", auth=tensorwire.Keys.load(e.keys))
    secret = e.devices["dev1"]["secret"]
    with hub, tensorwire.connect(hub.url, client_id="dev1", key=secret) as ch:
        hub.wait_for(1, timeout=30)
        assert ch._pipe.records is not None  # sealed after the welcome
        big = np.frombuffer(PATTERN * 1024, np.uint8)
        hub.send("dev1", {"p": big}, timeout=30)
        assert np.array_equal(ch.recv(timeout=30)["p"], big)
        ch.send({"p": big[:100]}, timeout=30)
        assert np.array_equal(hub.recv(timeout=30)[1]["p"], big[:100])


def test_only_a_hub_served_on_a_loopback_host_refuses_other_addresses():
    from tensorwire.transports.ucx.reach import loopback_only

    assert all(loopback_only(h) for h in ("127.0.0.1", "127.3.2.1", "::1", "localhost"))
    assert not any(loopback_only(h) for h in ("0.0.0.0", "10.211.0.1", "::", "example.org"))
