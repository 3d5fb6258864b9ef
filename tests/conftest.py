"""Shared test settings, and how the suite shares out over pytest-xdist's workers.

``scripts/test.sh`` runs the suite on 4 workers (``-n 4 --dist loadgroup``: most tests wait on
sockets, brokers and namespaces rather than compute, so 4 fit on 2 cores). Tests that use the same
module-scoped fixtures (a benchmark run, a broker, a testbed) go to one worker together, so
they are built once, unless their module is marked ``spread`` (long tests, a cheap fixture: each
worker that takes one builds its own). Modules with a ``slow`` test are handed out first, so
that none starts last.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings

# CI runs on 2 cores; keep property tests thorough but bounded.
settings.register_profile(
    "ci", max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile("dev", max_examples=60, deadline=None)
settings.load_profile("ci")

SHARED_SCOPES = ("module", "package")


def _module_fixtures(item: pytest.Item) -> list[str]:
    """The names of the module-scoped fixtures ``item`` uses."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return []
    defs = info.name2fixturedefs.items()
    return sorted(name for name, d in defs if d and d[-1].scope in SHARED_SCOPES)


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        shared = _module_fixtures(item)
        if shared and not item.get_closest_marker("spread"):
            group = item.nodeid.split("::")[0] + "::" + "+".join(shared)
            item.add_marker(pytest.mark.xdist_group(group))
    # modules with a slow test first, each kept whole (a stable sort: the rest keep their order)
    slow = {item.nodeid.split("::")[0] for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.nodeid.split("::")[0] not in slow)
