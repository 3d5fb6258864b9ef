"""Typed options: what serve / connect keywords become, parsed once (on mem://: no sockets)."""

from __future__ import annotations

import time
import uuid

import numpy as np
import pytest

import tensorwire
from tensorwire.transports import ChannelOptions, Credentials, HubOptions, Timeouts
from tensorwire.transports.certs import make_certs


def _url() -> str:
    return f"mem://options-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def enrolment(tmp_path_factory):
    return make_certs(tmp_path_factory.mktemp("certs"), hosts=["127.0.0.1"], clients=["dev1"])


def test_keywords_become_typed_values():
    options = ChannelOptions.from_kwargs({"client_id": "d", "timeout": 3.5, "codec": None})
    assert options.timeouts == Timeouts(connect=3.5) and options.client_id == "d"
    assert options.codec is None and options.credentials == Credentials()
    with pytest.raises(TypeError, match="give timeouts= or timeout=, not both"):
        ChannelOptions.from_kwargs({"timeout": 1, "timeouts": Timeouts()})
    with pytest.raises(ValueError, match="fanout must be one of"):
        HubOptions.from_kwargs({"fanout": "sideways"})


def test_credentials_come_once_from_arguments_a_url_or_a_directory(enrolment):
    hub = Credentials.from_dir(enrolment.directory, "hub")
    assert hub.tls is not None and hub.keys is not None and hub.secret is None
    dev = Credentials.from_dir(enrolment.directory, "channel", "dev1")
    assert dev.secret is not None and dev.keys is None
    rest, from_url = Credentials.from_url(
        f"tcp://127.0.0.1:1?ca={enrolment.ca}&keys={enrolment.keys}", "hub"
    )
    assert rest == "tcp://127.0.0.1:1" and from_url.tls is not None and from_url.keys is not None
    with pytest.raises(TypeError, match="tls is given both in the URL and as a keyword"):
        HubOptions.from_kwargs({"tls": hub.tls}, from_url)
    with pytest.raises(TypeError, match="give credentials= or tls=, not both"):
        HubOptions.from_kwargs({"tls": hub.tls, "credentials": hub})
    # a ready-made options value still takes what the URL names
    merged = HubOptions.from_kwargs({"options": HubOptions()}, from_url)
    assert merged.credentials.keys is from_url.keys


def test_enrolled_credentials_from_a_directory_admit_only_the_device(enrolment):
    url = _url()
    with tensorwire.serve(url, credentials=Credentials.from_dir(enrolment.directory, "hub")) as hub:
        creds = Credentials.from_dir(enrolment.directory, "channel", "dev1")
        with tensorwire.connect(url, client_id="dev1", credentials=creds) as ch:
            hub.wait_for(1, timeout=10)
            ch.send({"v": np.arange(3)}, timeout=10)
            assert hub.recv(timeout=10)[0] == "dev1"
        with pytest.raises(tensorwire.AuthenticationError):
            tensorwire.connect(url, client_id="dev1", timeout=5)


def test_the_call_timeout_is_the_wait_of_a_call_given_none():
    url = _url()
    call = Timeouts(connect=5, call=0.3)
    with (
        tensorwire.serve(url, timeouts=call) as hub,
        tensorwire.connect(url, client_id="d", timeouts=call) as ch,
    ):
        hub.wait_for(1)
        for wait in (hub.recv, ch.recv):
            t = time.monotonic()
            with pytest.raises(tensorwire.TransportTimeout):
                wait()
            assert 0.25 < time.monotonic() - t < 5
        with pytest.raises(tensorwire.GatherTimeout):
            list(hub.gather())
