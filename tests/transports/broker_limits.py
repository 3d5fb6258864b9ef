"""What the tests of brokers at their connection limit share: a private broker started for
the module (skipped, saying why, where it cannot start), and the hub's warning, waited for."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from tensorwire.errors import MissingDependency


def running(broker: Any) -> Iterator[Any]:
    """For a fixture: ``broker`` started (the test skipped with the reason if it cannot be),
    stopped when the fixture ends."""
    try:
        broker.start()
    except MissingDependency as exc:
        pytest.skip(str(exc))
    yield broker
    broker.stop()


def near_limit_warning(hub: Any, timeout: float) -> str:
    """The reason of the hub's first ``broker-near-limit`` event, waited for: it is recorded
    just after the join that reached the mark, so it may follow ``wait_for``."""
    deadline = time.monotonic() + timeout
    while True:
        warned = [e.reason for e in hub.events if e.kind == "broker-near-limit"]
        if warned:
            return warned[0]
        assert time.monotonic() < deadline, f"no broker-near-limit event: {list(hub.events)}"
        time.sleep(0.05)
