"""A rank that dies, hangs, lies about its shape, or a stranger at a rank's port: every
other rank raises a typed error naming the culprit within the deadline, or the group goes on."""

from __future__ import annotations

import os
import signal
import socket
import time

import pytest
from rank_process import FAULT_TIMEOUT
from ranks import Ranks

from tensorwire.collective import messages
from tensorwire.transports.sockets import send_encoded

SIZE = 4
VICTIM = 2
SLACK = 1.5  # seconds of scheduling on a busy 2-core machine, past the deadline


def _failures_after(ranks: Ranks, fault: str) -> dict[int, float]:
    """Once every rank is looping, ``fault`` the victim; every other rank's time to raise."""
    for rank in range(SIZE):
        ranks.until(rank, "looping")
    victim = ranks.procs[VICTIM]
    t0 = time.monotonic()
    os.kill(victim.pid, signal.SIGKILL if fault == "kill" else signal.SIGSTOP)
    try:
        took = {}
        for rank in range(SIZE):
            if rank == VICTIM:
                continue
            error, _ = ranks.until(rank, "error", timeout=FAULT_TIMEOUT + 30)
            assert error["error"] == "RankFailed", error
            assert error["rank"] == VICTIM, error
            assert f"rank {VICTIM} failed" in error["message"]
            took[rank] = error["t"] - t0
        return took
    finally:
        if fault == "stop":
            os.kill(victim.pid, signal.SIGCONT)


def test_a_rank_killed_mid_allreduce_is_named_by_every_other_within_the_deadline() -> None:
    with Ranks("loop", SIZE) as ranks:
        took = _failures_after(ranks, "kill")
    assert max(took.values()) < FAULT_TIMEOUT, took


def test_a_rank_stopped_mid_allreduce_is_named_by_every_other_by_the_deadline() -> None:
    with Ranks("loop", SIZE) as ranks:
        took = _failures_after(ranks, "stop")
    assert max(took.values()) < FAULT_TIMEOUT + SLACK, took


@pytest.mark.parametrize(("scenario", "count"), [("lie_small", 1000), ("lie_large", 1 << 20)])
def test_a_rank_lying_about_its_shape_is_a_typed_error_on_every_rank(
    scenario: str, count: int
) -> None:
    with Ranks(scenario, SIZE) as ranks:
        for rank in range(SIZE):
            error, _ = ranks.until(rank, "error", timeout=60)
            assert error["error"] == "CollectiveMismatch", error
            assert f"float32[{count + 7}]" in error["message"], error


def _refused(address: tuple[str, int], payload: bytes) -> bytes:
    """What a rank's listener answers ``payload`` with before it closes the connection."""
    with socket.create_connection(address, timeout=30) as sock:
        sock.sendall(payload)
        answer = b""
        while chunk := sock.recv(4096):
            answer += chunk
    return answer


def test_a_stranger_at_a_ranks_port_is_refused_and_the_group_goes_on() -> None:
    with Ranks("stranger", 3) as ranks:
        ready = [ranks.until(rank, "ready")[0] for rank in range(3)]
        address = tuple(ready[1]["address"])
        assert _refused(address, b"GET / HTTP/1.0\r\n\r\n" * 100) == b""
        wrong_token = messages.hello(2, "not the group's token").to_bytes()
        assert _refused(address, wrong_token) == b""
        with socket.create_connection(address, timeout=30) as sock:  # a valid token's shape
            send_encoded(sock, messages.hello(0, "0" * 32))
            assert sock.recv(1) == b""
        for rank in range(3):
            ranks.tell(rank)
        results = [ranks.until(rank, "total")[0] for rank in range(3)]
    assert [r["total"] for r in results] == [0 + 1 + 2] * 3
    assert results[1]["refusals"] == 3
