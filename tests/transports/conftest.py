"""Fixtures for the transport conformance suite: one hub per test, any number of channels."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

import tensorwire

# Every registered scheme is added here as its transport lands.
SCHEMES = ["tcp"]

URLS = {"tcp": "tcp://127.0.0.1:0"}


@pytest.fixture(params=SCHEMES)
def scheme(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def make_hub(scheme: str) -> Iterator[Callable[..., tensorwire.Hub]]:
    hubs: list[tensorwire.Hub] = []

    def make(**options) -> tensorwire.Hub:
        hub = tensorwire.serve(URLS[scheme], **options)
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
