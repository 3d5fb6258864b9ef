"""What the amqp:// tests share: the machine's RabbitMQ and a fresh prefix on it per test,
the conformance suite's amqp hooks (its private node, raw publishing), chunking a message by
hand, a hub's events of one kind, and polling for a condition."""

from __future__ import annotations

import importlib.util
import uuid
from pathlib import Path

import pytest

from tensorwire.transports.brokers.rabbitmq import rabbitmq_answers
from tensorwire.wire import iter_chunks

BROKER = "amqp://guest:guest@127.0.0.1:5672/%2F"
T = 20.0


@pytest.fixture(scope="module", name="broker")
def fixture_broker() -> str:
    if not rabbitmq_answers(BROKER):
        pytest.skip(f"no RabbitMQ answers at {BROKER} (apt-get install rabbitmq-server)")
    return BROKER


@pytest.fixture(name="url")
def fixture_url(broker: str) -> str:
    return f"{broker}?prefix=twtest-{uuid.uuid4().hex[:12]}"


def _scheme():
    """tests/transports/schemes/amqp.py (its private broker is the session's one)."""
    path = Path(__file__).with_name("schemes") / "amqp.py"
    spec = importlib.util.spec_from_file_location("tw_scheme_amqp_for_test_amqp", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


SCHEME = _scheme()


def _chunks(enc, message_id: int, size: int = 1 << 20) -> list[bytes]:
    return [b"".join(parts) for parts in iter_chunks(enc.frames(), message_id, size)]


def _events(hub, kind: str) -> list:
    return [e for e in hub.events if e.kind == kind]
