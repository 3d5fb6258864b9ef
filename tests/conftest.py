"""Shared test settings, and how the suite shares out over pytest-xdist's workers.

``scripts/test.sh`` runs the suite on 4 workers (``-n 4``: most tests wait on sockets, brokers
and namespaces rather than compute, so 4 fit on 2 cores). Modules with a ``slow`` test are
put first, so that none starts last, and a worker that runs out of tests takes half of the
busiest one's queue (``--dist worksteal``); a costly result that several tests read (a
benchmark run) is made once for all workers (``made_once.py``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, settings

# CI runs on 2 cores; keep property tests thorough but bounded.
settings.register_profile(
    "ci", max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile("dev", max_examples=60, deadline=None)
settings.load_profile("ci")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # modules with a slow test first, each kept whole (a stable sort: the rest keep their order)
    slow = {item.nodeid.split("::")[0] for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.nodeid.split("::")[0] not in slow)


@pytest.fixture(autouse=True)
def _tensorwire_logger_as_it_was() -> Iterator[None]:
    """A CLI command run in-process (CliRunner) sends tensorwire's log lines to standard
    error for good (``cli/logs.py``): put the logger back after each test, so that a later
    test's warnings do not land in pytest's progress lines."""
    logger = logging.getLogger("tensorwire")
    handlers, level, propagate = list(logger.handlers), logger.level, logger.propagate
    yield
    logger.handlers[:] = handlers
    logger.setLevel(level)
    logger.propagate = propagate
