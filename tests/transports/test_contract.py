"""The transport contract is code: a hub or channel that leaves out a method of the template
fails the type check (mypy, as scripts/test.sh runs it) and cannot be made, and every
registered transport fills it in."""

from __future__ import annotations

import inspect
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import tensorwire
from tensorwire.errors import MissingDependency
from tensorwire.transports import ChannelOptions, HubOptions
from tensorwire.transports.registry import transports

ROOT = Path(__file__).resolve().parents[2]

INCOMPLETE = """
from typing import Any

from tensorwire.transports import ChannelOptions, HubOptions
from tensorwire.transports.base import Channel, Hub
from tensorwire.transports.session import Welcomed
from tensorwire.wire import EncodedMessage


class HalfHub(Hub):  # no _close_transport
    def _send_encoded(self, client_id: str, enc: EncodedMessage, deadline: float | None) -> None:
        pass


class HalfChannel(Channel):  # no _recv_message, no _drop
    def _open(self, deadline: float | None) -> Welcomed:
        raise OSError

    def _send_encoded(self, enc: EncodedMessage, deadline: float | None) -> None:
        pass


HalfHub("half://x", HubOptions())
HalfChannel("half://x", ChannelOptions())
"""


def test_a_transport_that_leaves_out_a_method_fails_mypy(tmp_path):
    module = tmp_path / "half_transport.py"
    module.write_text(textwrap.dedent(INCOMPLETE))
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--config-file",
            str(ROOT / "pyproject.toml"),
            "--no-incremental",
            str(module),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    out = done.stdout
    assert done.returncode == 1, out
    assert (
        'Cannot instantiate abstract class "HalfHub" with abstract attribute "_close_transport"'
        in out
    )
    half = 'Cannot instantiate abstract class "HalfChannel" with abstract attributes'
    assert f'{half} "_drop" and "_recv_message"' in out


def test_nor_can_it_be_made():
    from tensorwire.transports.base import Hub

    class HalfHub(Hub):
        def _send_encoded(self, client_id, enc, deadline):
            pass

    with pytest.raises(TypeError, match="_close_transport"):
        HalfHub("half://x", HubOptions())


@pytest.mark.parametrize("entry", transports(), ids=lambda e: e.scheme)
def test_every_registered_transport_fills_in_the_template(entry):
    try:
        hub, channel = entry.load("hub"), entry.load("channel")
    except MissingDependency as exc:
        pytest.skip(str(exc))
    assert not inspect.isabstract(hub), hub.__abstractmethods__
    assert not inspect.isabstract(channel), channel.__abstractmethods__
    assert issubclass(entry.options_type("hub"), HubOptions)
    assert issubclass(entry.options_type("channel"), ChannelOptions)


def test_an_unknown_keyword_names_what_the_transport_takes():
    with pytest.raises(TypeError, match=r"unknown option\(s\) colour; .* takes .*backlog"):
        tensorwire.serve("tcp://127.0.0.1:0", colour="blue")
    with pytest.raises(TypeError, match=r"unknown option\(s\) backlog; ChannelOptions takes"):
        tensorwire.connect("mem://nobody", backlog=3)
