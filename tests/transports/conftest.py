"""Fixtures for the transport conformance suite: one hub per test, any number of channels.

Each transport under test has a module in ``tests/transports/schemes/`` declaring the hooks of
``scheme_hooks.py`` (``SCHEME``, ``hub_url(request) -> str``, which calls ``pytest.skip`` with
the reason when what the transport needs, a broker say, cannot be had, and the injection
hooks; optional ones as it has them). Adding a transport to the suite is adding such a module.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import pytest
import scheme_hooks

import tensorwire


def _load(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"tw_scheme_{path.stem}", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return scheme_hooks.check(module)


SCHEMES = {
    mod.SCHEME: mod
    for mod in map(_load, sorted((Path(__file__).parent / "schemes").glob("[!_]*.py")))
}


@pytest.fixture(autouse=True)
def _fresh_log_limits() -> None:
    """Each test sees the hub's rate-limited warnings (one per kind and host every 10 s): a
    test that looks for one is not silenced by an earlier test's same warning."""
    from tensorwire.transports import base

    base._last_logged.clear()


@pytest.fixture(params=sorted(SCHEMES))
def scheme(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def scheme_module(scheme: str) -> ModuleType:
    """The scheme's module in tests/transports/schemes (hub_url, inject_garbage, ...)."""
    return SCHEMES[scheme]


@pytest.fixture
def make_hub(
    scheme: str, request: pytest.FixtureRequest
) -> Iterator[Callable[..., tensorwire.Hub]]:
    hubs: list[tensorwire.Hub] = []

    def make(**options) -> tensorwire.Hub:
        hub = tensorwire.serve(SCHEMES[scheme].hub_url(request), **options)
        hubs.append(hub)
        return hub

    yield make
    for hub in hubs:
        hub.close()


@pytest.fixture
def connect() -> Iterator[Callable[..., tensorwire.Channel]]:
    channels: list[tensorwire.Channel] = []

    def open_channel(url: str, **options) -> tensorwire.Channel:
        ch = tensorwire.connect(url, **options)
        channels.append(ch)
        return ch

    yield open_channel
    for ch in channels:
        ch.close()
