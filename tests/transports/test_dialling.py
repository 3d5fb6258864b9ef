"""Dialling backs off between attempts, doubling up to a cap, each pause a random half to
whole of its step: devices that lost their hub together (a restart, a hub too busy to
answer) do not all dial again at the same instant, round after round."""

from __future__ import annotations

import pytest

from tensorwire.errors import SessionRefused, TransportTimeout
from tensorwire.transports.base import dialling

STEPS = [0.05, 0.1, 0.2, 0.2, 0.2]  # first_delay 0.05, doubled, capped at 0.2


def _pauses(monkeypatch: pytest.MonkeyPatch, failures: int) -> list[float]:
    """The pauses ``dial`` asks for before it gets through on attempt ``failures + 1``."""
    asked: list[float] = []
    monkeypatch.setattr(dialling.time, "sleep", asked.append)
    attempts = []

    def connect(deadline: float | None) -> str:
        attempts.append(deadline)
        if len(attempts) <= failures:
            raise ConnectionRefusedError("no one there yet")
        return "welcome"

    assert (
        dialling.dial(connect, what="x", timeout=60, first_delay=0.05, max_delay=0.2) == "welcome"
    )
    assert len(attempts) == failures + 1
    return asked


def test_pauses_double_to_the_cap_with_jitter_so_peers_come_back_apart(monkeypatch):
    runs = [_pauses(monkeypatch, len(STEPS)) for _ in range(20)]
    for pauses in runs:
        assert all(step / 2 <= p <= step for p, step in zip(pauses, STEPS, strict=True)), pauses
    firsts = {round(pauses[0], 6) for pauses in runs}
    assert len(firsts) > 10  # twenty devices that failed together: apart at once


def test_a_refusal_is_final_and_the_deadline_ends_the_retries(monkeypatch):
    asked: list[float] = []
    monkeypatch.setattr(dialling.time, "sleep", asked.append)

    def refused(deadline: float | None) -> str:
        raise SessionRefused("not enrolled")

    with pytest.raises(SessionRefused):
        dialling.dial(refused, what="x", timeout=60)
    assert asked == []

    def nobody(deadline: float | None) -> str:
        raise ConnectionRefusedError("no one there")

    with pytest.raises(TransportTimeout, match="could not reach x"):
        dialling.dial(nobody, what="x", timeout=0.0)
