"""Fixtures shared by the codec tests."""

from __future__ import annotations

import pytest
from codec_helpers import CODECS

from tensorwire.codecs import Codec, get_threads, set_threads


@pytest.fixture(params=CODECS, ids=repr)
def codec(request: pytest.FixtureRequest) -> Codec:
    return request.param


@pytest.fixture
def threads():
    """Lets a test change set_threads(); restores the previous count afterwards."""
    before = get_threads()
    yield set_threads
    set_threads(before)
