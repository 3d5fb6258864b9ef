"""What the udp:// test files share: the generous timeout, a hub on loopback in either mode,
and the enrolment (certificates and device keys) of secured sessions."""

from __future__ import annotations

import pytest

import tensorwire

T = 20.0  # seconds: generous bound for anything that should take milliseconds


def _serve(mode: str, **options):
    return tensorwire.serve(f"udp://127.0.0.1:0?mode={mode}&mtu=1472", codec=None, **options)


@pytest.fixture(scope="module", name="enrolment")
def fixture_enrolment(tmp_path_factory):
    from tensorwire.transports.certs import make_certs

    return make_certs(tmp_path_factory.mktemp("certs"), hosts=["127.0.0.1"], clients=["dev1"])


def _secured(e) -> tuple[dict, dict]:
    """``serve`` and ``connect`` (as dev1) keyword arguments: mutual TLS and enrolled keys."""
    d = e.devices["dev1"]
    hub = {"tls": tensorwire.TLS(cert=e.hub_cert, key=e.hub_key, ca=e.ca), "auth": e.keys}
    client = {"tls": tensorwire.TLS(cert=d["cert"], key=d["key"], ca=e.ca), "key": d["secret"]}
    return hub, client
