"""Skipping testbed tests, with the reason, where this machine lacks what they need."""

from __future__ import annotations

import pytest

from tensorwire.testbed import Capabilities


def require(caps: Capabilities, *names: str) -> None:
    """Skip the test, printing why, unless every capability in ``names`` is available."""
    for name in names:
        if not caps.has(name):
            reason = caps[name].reason if name in caps.items else "not probed"
            pytest.skip(f"{name} unavailable: {reason}")
