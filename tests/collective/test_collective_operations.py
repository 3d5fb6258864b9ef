"""Every operation x dtype x size on 2, 3 and 4 ranks (separate processes on loopback),
against numpy, with every rank's result bit-identical."""

from __future__ import annotations

from collections import defaultdict

import pytest
from ranks import Ranks


def run(scenario: str, size: int) -> dict[str, dict[int, str]]:
    """Run ``scenario``; every case's digest by rank. Fails on any case's problem."""
    digests: dict[str, dict[int, str]] = defaultdict(dict)
    with Ranks(scenario, size) as ranks:
        for rank in range(size):
            _, lines = ranks.until(rank, "done", timeout=150)
            for line in lines:
                if "case" in line:
                    assert not line["problem"], (rank, line)
                    digests[line["case"]][rank] = line["digest"]
            assert not [line for line in lines if "error" in line], lines
    return digests


def assert_identical(digests: dict[str, dict[int, str]], size: int) -> None:
    for case, by_rank in digests.items():
        if "/rank" in case:
            continue  # reduce_scatter: each rank holds its own block
        assert len(by_rank) == size, (case, by_rank)
        assert len(set(by_rank.values())) == 1, (case, by_rank)


@pytest.mark.parametrize("size", [2, 3])
def test_every_operation_small(size: int) -> None:
    digests = run("small", size)
    assert any(c.startswith("reduce_scatter/bfloat16") for c in digests)
    assert_identical(digests, size)


@pytest.mark.slow
def test_every_operation_small_and_large_on_4_ranks() -> None:
    digests = run("matrix", 4)
    assert "allreduce/mean/bfloat16/large" in digests
    assert_identical(digests, 4)


@pytest.mark.parametrize("size", [3, 4])
def test_every_algorithm_on_awkward_sizes(size: int) -> None:
    assert_identical(run("algorithms", size), size)


def test_torch_tensors_in_place_and_into_out() -> None:
    pytest.importorskip("torch")
    assert_identical(run("torch", 2), 2)
