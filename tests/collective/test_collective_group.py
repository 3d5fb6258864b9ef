"""Forming a group (rendezvous on any transport, torchrun's variables), its argument
checks, and a rank that leaves; ranks as threads of this process."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from tensorwire.collective import CollectiveError, CollectiveMismatch, Group, RankFailed, Rendezvous


def in_threads(size: int, body: Callable[[int], Any], timeout: float = 60) -> list[Any]:
    """``body(rank)`` for every rank at once; what each returned (or raised)."""
    results: list[Any] = [None] * size

    def run(rank: int) -> None:
        try:
            results[rank] = body(rank)
        except Exception as exc:  # handed to the test, which asserts on it
            results[rank] = exc

    threads = [threading.Thread(target=run, args=(r,), daemon=True) for r in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    assert not any(t.is_alive() for t in threads)
    return results


def test_rank_0_serves_the_rendezvous_on_any_transport() -> None:
    url = f"mem://coll-{uuid.uuid4().hex}"

    def body(rank: int) -> list[float]:
        with Group.join(url, rank=rank, size=3) as group:
            x = np.full(10, float(rank))
            return group.allreduce(x, "max").tolist()

    assert in_threads(3, body) == [[2.0] * 10] * 3


def test_from_env_reads_torchruns_variables() -> None:
    url = f"mem://coll-{uuid.uuid4().hex}"

    def body(rank: int) -> int:
        env = {"RANK": str(rank), "WORLD_SIZE": "2", "TENSORWIRE_RENDEZVOUS": url}
        with Group.from_env(env) as group:
            return int(group.allreduce(np.array([rank + 1]))[0])

    assert in_threads(2, body) == [3, 3]


def test_from_env_meets_one_port_past_master_port(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, Any] = {}
    monkeypatch.setattr(Group, "join", classmethod(lambda cls, url, **kw: seen.update(kw, url=url)))
    env = {"RANK": "1", "WORLD_SIZE": "4", "MASTER_ADDR": "10.0.0.5", "MASTER_PORT": "29500"}
    Group.from_env(env, timeout=5.0)
    assert seen == {"url": "tcp://10.0.0.5:29501", "rank": 1, "size": 4, "timeout": 5.0}


def test_from_env_without_torchrun_says_what_is_missing() -> None:
    with pytest.raises(ValueError, match="WORLD_SIZE, MASTER_ADDR, MASTER_PORT not set"):
        Group.from_env({"RANK": "0"})


def test_the_rendezvous_refuses_a_rank_that_came_already() -> None:
    with Rendezvous("tcp://127.0.0.1:0", 2, timeout=2) as rdv:

        def body(rank: int) -> Group:
            return Group.join(rdv.url, rank=0, size=2, serve=False, connect_timeout=30)

        results = in_threads(2, body)
    assert all(isinstance(r, CollectiveError) for r in results), results
    reasons = sorted(str(r).rsplit(": ", 1)[-1] for r in results)
    assert "has come already" in reasons[0] and "did not come" in reasons[1], reasons


def refused(group: Group, calls: tuple[Callable[[], object], ...]) -> list[str]:
    """The type of the error each call raises (ValueError or TypeError, or the test fails);
    then a barrier, to show the group is still good."""
    errors = []
    for call in calls:
        with pytest.raises((ValueError, TypeError)) as info:
            call()
        errors.append(type(info.value).__name__)
    group.barrier()
    return errors


def test_bad_arguments_are_refused_before_anything_is_sent() -> None:
    def body(rank: int) -> list[str]:
        with Group.join(url, rank=rank, size=2) as g:
            return refused(
                g,
                (
                    lambda: g.allreduce(np.ones(3), "prod"),  # type: ignore[arg-type]
                    lambda: g.allreduce(np.ones(3, np.int32), "mean"),
                    lambda: g.allreduce(np.ones(3), out=np.ones(4)),
                    lambda: g.allreduce(np.ones(3), algorithm="tree"),  # type: ignore[arg-type]
                    lambda: g.reduce_scatter(np.ones(3)),
                    lambda: g.allgather(np.ones(3), out=np.ones(5)),
                    lambda: g.broadcast(np.ones(3), root=2),
                    lambda: g.allreduce(np.array(["a"])),
                    lambda: g.allreduce([1.0, 2.0]),
                    lambda: g.allreduce(np.broadcast_to(np.ones(1), (3,))),  # read-only
                ),
            )

    url = f"mem://coll-{uuid.uuid4().hex}"
    first, second = in_threads(2, body)
    assert first == second
    assert first.count("TypeError") == 3


def test_a_rank_that_leaves_is_named_by_the_next_operation() -> None:
    url = f"mem://coll-{uuid.uuid4().hex}"
    left = threading.Event()

    def body(rank: int) -> Any:
        group = Group.join(url, rank=rank, size=2, timeout=30)
        group.allreduce(np.ones(4))
        if rank == 1:
            group.close()
            left.set()
            return None
        left.wait(30)
        with pytest.raises(RankFailed) as info:
            group.allreduce(np.ones(4))
        group.close()
        return info.value

    error = in_threads(2, body)[0]
    assert isinstance(error, RankFailed)
    assert error.rank == 1
    assert "left the group" in str(error)


def test_a_rank_that_never_calls_the_operation_is_named_at_the_deadline() -> None:
    url = f"mem://coll-{uuid.uuid4().hex}"
    all_done = threading.Barrier(3, timeout=30)

    def body(rank: int) -> Any:
        with Group.join(url, rank=rank, size=3, heartbeat=0.1) as group:
            if rank == 2:  # alive (its links still beat) but busy elsewhere
                all_done.wait()
                return None
            try:
                group.allreduce(np.ones(8), timeout=1.0)
            except RankFailed as exc:
                return exc
            finally:
                all_done.wait()

    errors = in_threads(3, body)[:2]
    assert [e.rank for e in errors] == [2, 2], errors
    assert all("had not started operation #1" in str(e) for e in errors), errors


@pytest.mark.parametrize("algorithm", ["ring", "recursive_doubling"])
def test_a_rank_with_another_dtype_is_a_typed_error_on_every_rank(algorithm: str) -> None:
    url = f"mem://coll-{uuid.uuid4().hex}"

    def body(rank: int) -> Any:
        with Group.join(url, rank=rank, size=3, timeout=30) as group:
            x = np.ones(1000, np.float64 if rank == 1 else np.float32)
            with pytest.raises(CollectiveMismatch) as info:
                group.allreduce(x, algorithm=algorithm)  # type: ignore[arg-type]
            return info.value

    errors = in_threads(3, body)
    assert all(isinstance(e, CollectiveMismatch) for e in errors), errors
    assert all("float64[1000]" in str(e) and "float32[1000]" in str(e) for e in errors), errors
