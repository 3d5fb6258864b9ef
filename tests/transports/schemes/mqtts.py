"""mqtts:// under the conformance, fault and security suites: mqtt:// over TLS to the broker,
on a private broker with a TLS listener and users (``mqtt.py`` has the hooks; this module runs
them with TLS)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest

SCHEME = "mqtts"


def _mqtt() -> Any:
    """mqtt.py's hooks, loaded once under a name of their own."""
    name = "tw_scheme_mqtt_for_mqtts"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name("mqtt.py"))
        assert spec and spec.loader
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules[name] = module
    return sys.modules[name]


def hub_url(request: pytest.FixtureRequest) -> str:
    """A fresh prefix on the session's TLS broker, whose CA this test trusts as the system's."""
    return _mqtt().tls_hub_url(request)


def later_hub_url(request: pytest.FixtureRequest) -> str:
    """A fresh prefix a channel can dial before a hub serves it."""
    return hub_url(request)


def private_broker(request: pytest.FixtureRequest) -> Any:
    """A private persistent broker with a TLS listener, for this test."""
    return _mqtt().private_broker(request, tls=True)


def secure_hub_url(request: pytest.FixtureRequest, enrolment: Any) -> str:
    """An ``mqtts://`` URL on the session's TLS broker for ``enrolment``."""
    return _mqtt().secure_hub_url(request, enrolment, scheme="mqtts")


def inject_garbage(hub_url: str) -> None:
    _mqtt().inject_garbage(hub_url)


def inject_forged(hub_url: str, client_ids: list[str]) -> None:
    _mqtt().inject_forged(hub_url, client_ids)


def proxy_target(hub_url: str) -> tuple[str, int]:
    return _mqtt().proxy_target(hub_url)


def proxied_url(hub_url: str, port: int) -> str:
    return _mqtt().proxied_url(hub_url, port)


def replay_last(hub_url: str, enrolment: Any) -> None:
    _mqtt().replay_last(hub_url, enrolment)
