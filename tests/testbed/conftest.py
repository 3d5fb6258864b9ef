"""Fixtures for the testbed tests: real namespaces where this machine allows them.

Tests that need namespaces, or a tool, skip with the reason the capability probe gives.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from testbed_support import require

from tensorwire.testbed import Capabilities, Testbed, probe_capabilities


@pytest.fixture(scope="session")
def caps() -> Capabilities:
    return probe_capabilities()


@pytest.fixture(scope="module")
def testbed(caps: Capabilities) -> Iterator[Testbed]:
    """A 2-device testbed shared by a module's tests; each test sets the profile it needs."""
    require(caps, "netns", "tbf")
    with Testbed(devices=2) as tb:
        yield tb
