"""Mutated or truncated payloads raise WireError subclasses and never write past ``out``."""

from __future__ import annotations

import contextlib

import numpy as np
from codec_helpers import CODECS
from hypothesis import given
from hypothesis import strategies as st

from tensorwire.errors import WireError

GUARD = 256


def _source() -> np.ndarray:
    rng = np.random.default_rng(7)
    return np.concatenate(
        [
            np.arange(40_000, dtype=np.float32),  # compressible
            rng.random(10_000).astype(np.float32),  # mostly incompressible
            np.zeros(30_000, dtype=np.float32),
        ]
    )


SOURCE = _source()
PAYLOADS = [bytes(codec.encode(SOURCE)) for codec in CODECS]

edits = st.lists(
    st.tuples(st.floats(0, 1, exclude_max=True), st.integers(0, 255)), min_size=1, max_size=8
)


def _decode_guarded(index: int, payload: bytes) -> None:
    """Decode into the front of a larger buffer and check nothing past it changed."""
    backing = np.full(SOURCE.nbytes + GUARD, 0xA5, dtype=np.uint8)
    with contextlib.suppress(WireError):
        CODECS[index].decode(payload, out=backing[: SOURCE.nbytes])
    assert (backing[SOURCE.nbytes :] == 0xA5).all()
    try:
        result = CODECS[index].decode(payload, max_size=SOURCE.nbytes)
    except WireError:
        return
    assert result.nbytes <= SOURCE.nbytes


@given(st.integers(0, len(CODECS) - 1), edits, st.booleans())
def test_mutated_payloads(index: int, changes: list[tuple[float, int]], in_header: bool) -> None:
    payload = bytearray(PAYLOADS[index])
    span = 64 if in_header else len(payload)  # the header and the first block's header
    for where, value in changes:
        payload[int(where * span)] = value
    _decode_guarded(index, bytes(payload))


@given(st.integers(0, len(CODECS) - 1), st.floats(0, 1, exclude_max=True))
def test_truncated_payloads(index: int, keep: float) -> None:
    payload = PAYLOADS[index]
    _decode_guarded(index, payload[: int(keep * len(payload))])


@given(
    st.integers(0, len(CODECS) - 1),
    st.floats(0, 1),
    st.binary(min_size=1, max_size=64),
    st.integers(0, 64),
)
def test_spliced_payloads(index: int, where: float, insert: bytes, remove: int) -> None:
    payload = PAYLOADS[index]
    at = int(where * len(payload))
    _decode_guarded(index, payload[:at] + insert + payload[at + remove :])


@given(st.integers(0, len(CODECS) - 1), st.binary(max_size=300))
def test_random_bytes(index: int, payload: bytes) -> None:
    _decode_guarded(index, payload)
