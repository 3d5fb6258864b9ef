"""The fast paths of a group's links: small pieces sent and read by the operation's own
thread, large ones by the links' threads, in any order; digests off on loopback links
unless asked for. Ranks as threads of this process, over loopback TCP."""

from __future__ import annotations

import uuid

import numpy as np
import pytest
from test_collective_group import in_threads

from tensorwire.collective import Group, GroupOptions


def test_small_and_large_operations_alternate_with_exact_results() -> None:
    url = f"mem://coll-{uuid.uuid4().hex}"
    size = 3

    def body(rank: int) -> list[bool]:
        ok = []
        with Group.join(url, rank=rank, size=size, piece_bytes=64 << 10) as group:
            for step in range(6):
                small = np.full(1024, float(rank + step), np.float32)  # read inline
                large = np.full(300_000, float(rank * step), np.float32)  # the ring, readers
                group.allreduce(small)
                group.allreduce(large)
                root = np.full(4096, float(rank), np.float32)
                group.broadcast(root, root=step % size)  # a tree, read inline
                group.barrier()
                ok += [
                    bool((small == sum(r + step for r in range(size))).all()),
                    bool((large == sum(r * step for r in range(size))).all()),
                    bool((root == step % size).all()),
                ]
        return ok

    results = in_threads(size, body)
    assert all(isinstance(r, list) and all(r) and len(r) == 18 for r in results), results


def test_digests_go_on_loopback_links_only_when_asked_for() -> None:
    sent = {}
    for checksum in (True, "auto", False):
        url = f"mem://coll-{uuid.uuid4().hex}"

        def body(rank: int, checksum: bool | str = checksum, url: str = url) -> tuple[int, float]:
            with Group.join(url, rank=rank, size=2, checksum=checksum) as group:
                before = group.bytes_sent
                x = group.allreduce(np.ones(1024, np.float32))  # one piece each way
                return group.bytes_sent - before, float(x[0])

        results = in_threads(2, body)
        assert [r[1] for r in results] == [2.0, 2.0], results
        assert results[0][0] == results[1][0] > 4096, results
        sent[checksum] = results[0][0]
    assert sent[True] == sent[False] + 8  # an xxh3-64 digest
    assert sent["auto"] == sent[False]  # the links are over loopback


def test_a_checksum_setting_that_is_none_of_the_three_is_refused() -> None:
    with pytest.raises(ValueError, match="checksum"):
        GroupOptions(checksum="sometimes")  # type: ignore[arg-type]
