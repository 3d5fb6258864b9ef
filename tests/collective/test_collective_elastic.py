"""Elastic mode: a rank killed or stopped mid-allreduce is dropped and the others complete
the operation over the ranks left and go on; a restarted rank rejoins at the next operation;
a stopped rank that wakes up is told it was dropped; a coordinator that dies is a typed error
on every rank; forged messages to the coordinator are refused."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from elastic_rank import FAULT_TIMEOUT
from ranks import Ranks

from tensorwire.collective import Group
from tensorwire.collective.coordination import VERDICT_SLACK_S
from tensorwire.transports import connect

WORKER = Path(__file__).with_name("elastic_rank.py")
SIZE = 4
VICTIM = 2
SLACK = 3.0  # seconds of scheduling on a busy 2-core machine, past the deadline
MORE_STEPS = 5  # "training continues"


def _group(tmp_path: Path, url: str | None = None) -> tuple[Ranks, Path]:
    stop = tmp_path / "stop"
    ranks = Ranks("train", SIZE, WORKER, elastic=True, url=url, extra=(str(stop),))
    return ranks, stop


def _step_over(
    ranks: Ranks, rank: int, over: list[int], after: float = 0.0, timeout: float = 60
) -> dict[str, Any]:
    """Rank ``rank``'s first step completed over ``over`` (past the monotonic time
    ``after``); every step up to it is right."""
    deadline = time.monotonic() + timeout
    while True:
        line, _ = ranks.until(rank, "step", max(deadline - time.monotonic(), 0.01))
        assert line["ok"], line
        if line["over"] == over and line["t"] > after:
            return line


def _rejoined(ranks: Ranks) -> None:
    """The restarted victim joins, and from then on every rank's steps include it."""
    ranks.until(VICTIM, "ready")
    joined = time.monotonic()
    for rank in range(SIZE):
        _step_over(ranks, rank, list(range(SIZE)), after=joined)


def _stop_all(ranks: Ranks, stop: Path, alive: list[int]) -> None:
    stop.touch()
    for rank in alive:
        ranks.until(rank, "done")


def _fault_mid_allreduce(ranks: Ranks, fault: signal.Signals) -> float:
    """Once every rank steps, ``fault`` the victim; how long the others took to complete a
    step over the three ranks left, and that they then go on."""
    for rank in range(SIZE):
        ranks.until(rank, "step")
    t0 = time.monotonic()
    os.kill(ranks.procs[VICTIM].pid, fault)
    left = [r for r in range(SIZE) if r != VICTIM]
    took = max(_step_over(ranks, r, left)["t"] - t0 for r in left)
    for rank in left:
        first = ranks.until(rank, "step")[0]["step"]
        for _ in range(MORE_STEPS):
            line, _ = ranks.until(rank, "step")
            assert line["ok"] and line["over"] == left, line
        assert line["step"] == first + MORE_STEPS
    return took


def test_a_rank_killed_mid_allreduce_is_dropped_and_rejoins_when_restarted(tmp_path: Path) -> None:
    ranks, stop = _group(tmp_path)
    with ranks:
        took = _fault_mid_allreduce(ranks, signal.SIGKILL)
        print(f"killed: the others completed the step over 3 ranks in {took:.2f} s")
        assert took < FAULT_TIMEOUT + SLACK, took  # a death is seen at once
        ranks.restart(VICTIM)  # once the others went on without it
        _rejoined(ranks)
        ranks.procs[VICTIM].kill()
        ranks.restart(VICTIM)  # at once: it waits until the group has dropped its predecessor
        _rejoined(ranks)
        _stop_all(ranks, stop, list(range(SIZE)))


def test_a_rank_stopped_mid_allreduce_is_dropped_and_told_so_when_continued(
    tmp_path: Path,
) -> None:
    ranks, stop = _group(tmp_path)
    with ranks:
        took = _fault_mid_allreduce(ranks, signal.SIGSTOP)
        print(f"stopped: the others completed the step over 3 ranks in {took:.2f} s")
        assert took < 2 * FAULT_TIMEOUT + SLACK, took  # its deadline, then the redo
        os.kill(ranks.procs[VICTIM].pid, signal.SIGCONT)
        error, before = ranks.until(VICTIM, "error", timeout=30)
        assert error["error"] == "RankDropped", error
        assert error["rank"] == VICTIM and "dropped" in error["message"], error
        assert all(line["ok"] for line in before if "step" in line), before
        left = [r for r in range(SIZE) if r != VICTIM]
        for rank in left:  # the others are not disturbed by it
            for _ in range(3):
                line, _ = ranks.until(rank, "step")
                assert line["ok"] and line["over"] == left, line
        _stop_all(ranks, stop, left)


@pytest.mark.parametrize("fault", [signal.SIGKILL, signal.SIGSTOP])
def test_a_coordinator_that_dies_or_hangs_is_a_typed_error_on_every_rank(
    tmp_path: Path, fault: signal.Signals
) -> None:
    with Ranks("coordinator", 1, WORKER, url="-", extra=(str(SIZE),)) as coordinator:
        url = coordinator.until(0, "url")[0]["url"]
        ranks, _ = _group(tmp_path, url)
        with ranks:
            for rank in range(SIZE):
                ranks.until(rank, "step")
            t0 = time.monotonic()
            os.kill(coordinator.procs[0].pid, fault)
            for rank in range(SIZE):
                error, _ = ranks.until(rank, "error", timeout=60)
                assert error["error"] == "CoordinatorLost", error
                assert error["t"] - t0 < FAULT_TIMEOUT + VERDICT_SLACK_S + SLACK, error


def test_forged_and_garbage_messages_to_the_coordinator_are_refused(tmp_path: Path) -> None:
    ranks, stop = _group(tmp_path)
    with ranks:
        for rank in range(SIZE):
            ranks.until(rank, "step")
        assert ranks.rendezvous is not None and ranks.rendezvous.coordinator is not None
        coordinator = ranks.rendezvous.coordinator
        with connect(ranks.rendezvous.url, client_id="stranger", timeout=30) as ch:
            forged = {"report": coordinator.op, "rank": 1, "key": "0" * 32, "seq": 1}
            hello = {"rank": 1, "size": SIZE, "host": "127.0.0.1", "port": 1, "elastic": True}
            for meta in (
                {"garbage": "x" * 1000},
                {**forged, "ok": False, "culprit": 3, "timeout": 1.0},  # "rank 1: 3 failed"
                {**hello, "size": SIZE + 1},
                {**hello, "elastic": False},  # a plain group's rank at an elastic hub
            ):
                ch.send(meta=meta)
                assert "error" in ch.recv(timeout=30).meta
        assert len(coordinator.refusals) == 4, coordinator.refusals
        for rank in range(SIZE):  # and the group goes on over every rank
            for _ in range(3):
                line, _ = ranks.until(rank, "step")
                assert line["ok"] and line["over"] == list(range(SIZE)), line
        _stop_all(ranks, stop, list(range(SIZE)))


def test_rank_0_serves_the_coordinator_by_default_and_a_mean_is_over_the_view() -> None:
    results: dict[int, tuple[list[float], tuple[int, ...], int, int]] = {}

    def rank(r: int) -> None:
        with Group.join("mem://elastic-default", rank=r, size=3, elastic=True, timeout=30) as g:
            x = np.full(8, float(g.member + 1), np.float32)
            g.allreduce(x, "mean")
            results[r] = (x.tolist(), g.members, g.rank, g.size)

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert results == {r: ([2.0] * 8, (0, 1, 2), r, 3) for r in range(3)}
