"""Fixtures shared by the codec tests."""

from __future__ import annotations

import pytest
from codec_helpers import CODECS

from tensorwire.codecs import Codec, get_threads, set_threads


@pytest.fixture(params=CODECS, ids=repr)
def codec(request: pytest.FixtureRequest) -> Codec:
    return request.param


@pytest.fixture
def threads():
    """Lets a test change set_threads(); restores the previous count afterwards."""
    before = get_threads()
    yield set_threads
    set_threads(before)


@pytest.fixture(autouse=True)
def idle_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    """``auto`` takes the load average for its codecs' slowdown until it hears an encode;
    these tests' choices are about data, links and streams, not about what else the machine
    runs: they see an idle one (the tests of that prior set their own)."""
    monkeypatch.setattr("tensorwire.codecs.slowdown.cpu_contention", lambda: 1.0)
