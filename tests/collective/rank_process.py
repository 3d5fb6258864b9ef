"""One rank of a test group, in its own process.

    python rank_process.py SCENARIO URL RANK SIZE

Joins the group at the rendezvous URL (served by the test), runs SCENARIO and prints one
JSON object per line on stdout: {"ready": ...} when the group is formed (with this rank's
listener address), then what the scenario reports, then {"done": ...} or {"error": ...}.
Scenarios that wait for the test read a line on stdin. Bounded: every operation has a
deadline and the whole process gives up after 300 s.
"""

from __future__ import annotations

import hashlib
import json
import signal
import sys
import time

import ml_dtypes
import numpy as np

from tensorwire.collective import Compression, Group
from tensorwire.errors import CollectiveError

DTYPES = ["float32", "float64", "float16", "bfloat16", "int32", "int64"]
SIZES = {"small": 4 << 10, "large": 16 << 20}  # bytes of each rank's input
FAULT_TIMEOUT = 4.0  # seconds: the deadline of the operations the fault scenarios break


def say(**fields: object) -> None:
    print(json.dumps(fields), flush=True)


def dtype_of(name: str) -> np.dtype:
    return np.dtype(ml_dtypes.bfloat16) if name == "bfloat16" else np.dtype(name)


def rank_input(name: str, nbytes: int, rank: int, salt: int = 0) -> np.ndarray:
    """Rank ``rank``'s input of ``nbytes`` bytes: every process can make anyone's."""
    dtype = dtype_of(name)
    rng = np.random.default_rng([rank, nbytes, salt, DTYPES.index(name)])
    n = nbytes // dtype.itemsize
    if dtype.kind in "iu":
        return rng.integers(-1000, 1000, n).astype(dtype)
    return rng.standard_normal(n, dtype=np.float32).astype(dtype)


def digest(arr: np.ndarray) -> str:
    return hashlib.sha1(np.ascontiguousarray(arr).view(np.uint8).data).hexdigest()[:16]


def check_reduction(name: str, op: str, got: np.ndarray, inputs: list[np.ndarray]) -> str:
    """'' when ``got`` is numpy's reduction of ``inputs`` within the rounding the
    collective may add (per step, in the dtype), else what differs."""
    dtype = dtype_of(name)
    if dtype.kind in "iu" or op in ("min", "max"):
        ufunc = {"sum": np.add, "min": np.minimum, "max": np.maximum}[op]
        want = inputs[0].copy()
        for x in inputs[1:]:
            ufunc(want, x, out=want)
        return "" if np.array_equal(got, want) else f"{op} differs from numpy's"
    wide = np.stack([x.astype(np.float64) for x in inputs])
    want = wide.sum(axis=0)
    bound = wide.__abs__().sum(axis=0)
    if op == "mean":
        want, bound = want / len(inputs), bound / len(inputs)
    eps = float(np.finfo(np.float32).eps if dtype == np.float32 else 0)
    eps = {"float16": 2.0**-10, "bfloat16": 2.0**-7, "float64": 2.0**-52}.get(name, eps)
    err = np.abs(got.astype(np.float64) - want)
    worst = float((err - len(inputs) * eps * bound).max(initial=0))
    return "" if worst <= 0 else f"{op} off numpy's by {worst} past the rounding bound"


def matrix(group: Group, sizes: list[str]) -> None:
    """Every operation x dtype x size against numpy: every rank checks what it can from
    the inputs it makes (everyone's when small, rank 0 everyone's when large); the test
    compares the digests across ranks."""
    n, r = group.size, group.rank
    for size in sizes:
        nbytes = SIZES[size]
        for name in DTYPES:
            mine = rank_input(name, nbytes, r)
            everyone = [rank_input(name, nbytes, k) for k in range(n)]
            if size == "large" and r != 0:
                everyone = []
            ops = ["sum", "min", "max"] + ([] if name.startswith("int") else ["mean"])
            for op in ops:
                out = np.empty_like(mine)
                group.allreduce(mine, op, out=out)  # type: ignore[arg-type]
                problem = check_reduction(name, op, out, everyone) if everyone else ""
                report(f"allreduce/{op}/{name}/{size}", out, problem)
            block = mine.size // n
            scattered = group.reduce_scatter(mine[: block * n], "sum")
            mine_block = slice(r * block, (r + 1) * block)
            blocks = [x[mine_block] for x in everyone]
            problem = check_reduction(name, "sum", scattered, blocks) if blocks else ""
            report(f"reduce_scatter/{name}/{size}/rank{r}", scattered, problem)
            piece = mine[: max(1, mine.size // n)]
            gathered = group.allgather(piece)
            ok = all(np.array_equal(gathered[k], x[: piece.size]) for k, x in enumerate(everyone))
            ok = ok and np.array_equal(gathered[r], piece)
            report(f"allgather/{name}/{size}", gathered, "" if ok else "allgather differs")
            b = mine.copy()
            group.broadcast(b, root=n - 1)
            ok = np.array_equal(b, rank_input(name, nbytes, n - 1))
            report(f"broadcast/{name}/{size}", b, "" if ok else "broadcast differs")


def report(case: str, result: np.ndarray, problem: str) -> None:
    say(case=case, digest=digest(result), problem=problem)


def algorithms(group: Group) -> None:
    """Each algorithm forced, on awkward sizes (empty, fewer elements than ranks, odd)."""
    n, r = group.size, group.rank
    for count in (0, 1, n - 1, 1001, 70_001):
        for algorithm in ("ring", "recursive_doubling"):
            x = np.arange(count, dtype=np.float64) * (r + 1)
            group.allreduce(x, algorithm=algorithm)  # type: ignore[arg-type]
            ok = np.array_equal(x, np.arange(count, dtype=np.float64) * (n * (n + 1) // 2))
            report(f"allreduce/{algorithm}/{count}", x, "" if ok else "differs")
        for algorithm in ("ring", "tree"):
            b = np.full(count, r, np.int64)
            group.broadcast(b, root=1 % n, algorithm=algorithm)  # type: ignore[arg-type]
            ok = bool((b == 1 % n).all())
            report(f"broadcast/{algorithm}/{count}", b, "" if ok else "differs")
    strided = np.arange(40, dtype=np.float32).reshape(8, 5)[:, ::2] * (r + 1)  # not contiguous
    group.allreduce(strided, "max")
    ok = np.array_equal(strided, np.arange(40, dtype=np.float32).reshape(8, 5)[:, ::2] * n)
    report("allreduce/strided", strided, "" if ok else "differs")
    group.barrier()


def torch_tensors(group: Group) -> None:
    import torch

    n, r = group.size, group.rank
    for dtype in (torch.float32, torch.bfloat16, torch.int64):
        values = torch.arange(3000) % 200  # exact in bfloat16 too
        t = (values + r).to(dtype)
        same = group.allreduce(t, "max")
        ok = same is t and bool((t == (values + n - 1).to(dtype)).all())
        report(f"torch/allreduce/{dtype}", t.view(torch.int8).numpy(), "" if ok else "differs")
    out = torch.empty(n, 4)
    group.allgather(torch.full((4,), float(r)), out=out)
    ok = bool((out == torch.arange(n, dtype=torch.float32)[:, None]).all())
    report("torch/allgather", out.numpy(), "" if ok else "differs")


def loop(group: Group) -> None:
    """Allreduce 1 MiB over and over (ready once the first is done), until it fails."""
    x = np.ones(1 << 18, np.float32)
    group.allreduce(x, timeout=FAULT_TIMEOUT)
    say(looping=True)
    while True:
        group.allreduce(x, timeout=FAULT_TIMEOUT)


def lie(group: Group, count: int) -> None:
    """Rank 1 allreduces 7 elements more than the others (``count``: by size, the
    algorithm's choice)."""
    x = np.ones(count + (7 if group.rank == 1 else 0), np.float32)
    group.allreduce(x, timeout=FAULT_TIMEOUT)


def stranger(group: Group) -> None:
    """Wait for the test's stranger, check it was refused, then allreduce."""
    sys.stdin.readline()
    deadline = time.monotonic() + 30
    while group.rank == 1 and not group.refusals and time.monotonic() < deadline:
        time.sleep(0.01)  # polling the group's state, not waiting for time to pass
    x = np.full(5000, group.rank, np.int64)
    group.allreduce(x, timeout=30)
    say(refusals=len(group.refusals), total=int(x[0]))


COMPRESSED_BYTES = 1 << 20  # each rank's float32 input in the compression scenario
FEEDBACK_CALLS = 20  # top-k / random-k calls on one input: error feedback catches up
SPARSE_RATIO = 0.1


def relative_error(got: np.ndarray, exact: np.ndarray) -> float:
    """max |got - exact| / max |exact|: the error as a fraction of the largest sum."""
    return float(np.abs(got.astype(np.float64) - exact).max() / np.abs(exact).max())


def compression(group: Group) -> None:
    """Every compression on random normal float32 data against the exact float64 sum: each
    case reports its error, whether it is within the method's bound, and its bytes."""
    n, r = group.size, group.rank
    everyone = [rank_input("float32", COMPRESSED_BYTES, k, salt=1) for k in range(n)]
    wide = np.stack([x.astype(np.float64) for x in everyone])
    exact, magnitude = wide.sum(axis=0), float(np.abs(wide).sum(axis=0).max())
    # each of the N compressions (N - 1 hops, then the final sums) is off by at most half
    # a step: fp16/bf16 rounding relative to the partial sum, int8 its block's max / 127
    steps = {"none": 2.0**-23, "fp16": 2.0**-10, "bf16": 2.0**-7, "int8": 1 / 127}
    for method, step in steps.items():
        for name in ("float32", "float64") if method == "int8" else ("float32",):
            x = everyone[r].astype(dtype_of(name))
            before = group.bytes_sent
            group.allreduce(x, compress=method)  # type: ignore[arg-type]
            sent = group.bytes_sent - before
            err = relative_error(x, exact)
            bound = n * (step / 2 + 2.0**-24) * magnitude / float(np.abs(exact).max())
            problem = "" if err <= bound else f"error {err} past the bound {bound}"
            say(case=f"{method}/{name}", digest=digest(x), problem=problem, error=err, bytes=sent)
    for method in ("topk", "randomk"):
        setting = Compression(method, ratio=SPARSE_RATIO)  # type: ignore[arg-type]
        total = np.zeros(exact.size)
        before = group.bytes_sent
        errors, l2 = [], []  # of the mean of the results after 1, T / 2 and T calls
        for call in range(1, FEEDBACK_CALLS + 1):
            x = everyone[r].copy()
            group.allreduce(x, compress=setting, key="gradient")
            total += x
            if call in (1, FEEDBACK_CALLS // 2, FEEDBACK_CALLS):
                errors.append(relative_error(total / call, exact))
                l2.append(float(np.linalg.norm(total / call - exact) / np.linalg.norm(exact)))
        sent = (group.bytes_sent - before) // FEEDBACK_CALLS
        say(
            case=method,
            digest=digest(total),
            problem="",
            error=errors[-1],
            errors=errors,
            l2=l2,
            bytes=sent,
        )


SCENARIOS = {
    "matrix": lambda g: matrix(g, ["small", "large"]),
    "small": lambda g: matrix(g, ["small"]),
    "algorithms": algorithms,
    "torch": torch_tensors,
    "loop": loop,
    "lie_small": lambda g: lie(g, 1000),  # recursive doubling
    "lie_large": lambda g: lie(g, 1 << 20),  # the ring
    "stranger": stranger,
    "compression": compression,
}


def main(scenario: str, url: str, rank: int, size: int) -> int:
    signal.alarm(300)
    pieces = {"piece_bytes": 64 << 10} if scenario == "algorithms" else {}  # many per segment
    group = Group.join(
        url, rank=rank, size=size, serve=False, heartbeat=0.25, timeout=120, **pieces
    )
    say(ready=rank, address=list(group.address))
    try:
        SCENARIOS[scenario](group)
    except CollectiveError as exc:
        culprit = getattr(exc, "rank", None)
        say(error=type(exc).__name__, rank=culprit, message=str(exc), t=time.monotonic())
        return 0
    finally:
        group.close()
    say(done=rank)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])))
