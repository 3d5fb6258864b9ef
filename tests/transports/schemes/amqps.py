"""amqps:// under the conformance, fault and security suites: amqp:// over TLS to the broker,
on the session's private RabbitMQ node with a TLS listener (``amqp.py`` has the hooks; this
module runs them with TLS)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest

SCHEME = "amqps"


def _amqp() -> Any:
    """amqp.py's hooks, loaded once under a name of their own."""
    name = "tw_scheme_amqp_for_amqps"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name("amqp.py"))
        assert spec and spec.loader
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules[name] = module
    return sys.modules[name]


def hub_url(request: pytest.FixtureRequest) -> str:
    """A fresh prefix on the session node's TLS listener, whose CA this test trusts as the
    system's."""
    return _amqp().tls_hub_url(request)


def later_hub_url(request: pytest.FixtureRequest) -> str:
    """A fresh prefix a channel can dial before a hub serves it."""
    return hub_url(request)


def private_broker(request: pytest.FixtureRequest) -> Any:
    """The session's private node, through its TLS listener, for restarts."""
    return _amqp().tls_private_broker(request)


def secure_hub_url(request: pytest.FixtureRequest, enrolment: Any) -> str:
    """An ``amqps://`` URL on the session node's TLS listener for ``enrolment``."""
    return _amqp().secure_hub_url(request, enrolment, scheme="amqps")


def inject_garbage(hub_url: str) -> None:
    _amqp().inject_garbage(hub_url)


def inject_forged(hub_url: str, client_ids: list[str]) -> None:
    _amqp().inject_forged(hub_url, client_ids)


def proxy_target(hub_url: str) -> tuple[str, int]:
    return _amqp().proxy_target(hub_url)


def proxied_url(hub_url: str, port: int) -> str:
    return _amqp().proxied_url(hub_url, port)


def replay_last(hub_url: str, enrolment: Any) -> None:
    _amqp().replay_last(hub_url, enrolment)
