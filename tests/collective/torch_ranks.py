"""Ranks of the torch.distributed tests, each in a process of its own (multiprocessing's
spawn): every rank joins the default group of backend "tensorwire" through a FileStore,
and a gloo group beside it, runs a scenario and puts its report on a queue."""

from __future__ import annotations

import functools
import multiprocessing
import os
import queue
import signal
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import numpy as np

FAULT_TIMEOUT = 5.0  # seconds: the deadline torch gives the group in the fault scenario
STEPS = 84  # DDP: 3 epochs of digits over 4 ranks, 16 samples a rank a step


def run(
    scenario: str, size: int, store_path: str, timeout: float = 120, lost: int | None = None
) -> list[Any]:
    """Run ``scenario`` on ``size`` rank processes; every rank's report, by rank (None for
    a rank that ended without one). Rank ``lost`` is not waited for, and is killed once
    the others have reported."""
    ctx = multiprocessing.get_context("spawn")
    reports: multiprocessing.Queue[tuple[int, Any]] = ctx.Queue()
    procs = [
        ctx.Process(target=rank_main, args=(scenario, r, size, store_path, reports))
        for r in range(size)
    ]
    for proc in procs:
        proc.start()
    got: dict[int, Any] = {}
    wanted = size - (lost is not None)
    deadline = time.monotonic() + timeout
    try:
        while len(got) < wanted and time.monotonic() < deadline:
            try:
                rank, report = reports.get(timeout=0.5)
            except queue.Empty:
                if all(not p.is_alive() for p in procs) and reports.empty():
                    break
                continue
            got[rank] = report
    finally:
        if lost is not None and procs[lost].is_alive():
            procs[lost].kill()
        for proc in procs:
            proc.join(10)
            if proc.is_alive():
                proc.kill()
                proc.join()
    return [got.get(r) for r in range(size)]


def rank_main(
    scenario: str, rank: int, size: int, store_path: str, reports: multiprocessing.Queue
) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", GLOO_SOCKET_IFNAME="lo")
    import torch
    import torch.distributed as dist

    import tensorwire.collective.torch_backend  # noqa: F401  (registers "tensorwire")

    torch.set_num_threads(1)
    timeout = timedelta(seconds=FAULT_TIMEOUT if scenario in ("fault", "hang") else 60)
    try:
        store = dist.FileStore(store_path, size)
        dist.init_process_group(
            "tensorwire", store=store, rank=rank, world_size=size, timeout=timeout
        )
        gloo = dist.new_group(backend="gloo")
        report = SCENARIOS[scenario](rank, size, gloo)
    except BaseException:
        report = {"error": traceback.format_exc()}
    reports.put((rank, report))
    if scenario not in ("fault", "hang"):
        dist.destroy_process_group()


def operations(rank: int, size: int, gloo: Any) -> dict[str, Any]:
    """Every supported operation on the tensorwire group and on gloo: what differs."""
    import torch
    import torch.distributed as dist

    def both(call: Callable[[Any], Any]) -> tuple[Any, Any]:
        return call(None), call(gloo)

    def mine(n: int, dtype: Any = torch.float32) -> Any:
        gen = torch.Generator().manual_seed(1000 * rank + n)
        return (torch.randn(n, generator=gen) * 100).to(dtype)

    # torch 2.13's names, and those of the torch before them
    gather_single = getattr(dist, "all_gather_single", dist.all_gather_into_tensor)
    scatter_single = getattr(dist, "reduce_scatter_single", dist.reduce_scatter_tensor)
    differs: dict[str, str] = {}

    def check(name: str, ours: Any, theirs: Any, exact: bool = False) -> None:
        same = torch.equal(ours, theirs) if exact else torch.allclose(ours, theirs, 1e-6, 1e-4)
        if not same:
            differs[name] = f"max |diff| {float((ours - theirs).abs().max())}"

    for n in (5, 1 << 18):  # recursive doubling / ring
        for op in (dist.ReduceOp.SUM, dist.ReduceOp.MIN, dist.ReduceOp.MAX):
            for dtype in (torch.float32, torch.float64, torch.int64):

                def reduce(group: Any, op: Any = op, dtype: Any = dtype, n: int = n) -> Any:
                    t = mine(n, dtype)
                    dist.all_reduce(t, op, group=group)
                    return t

                check(f"all_reduce {op} {dtype} {n}", *both(reduce), exact=dtype == torch.int64)

        avg = mine(n)
        dist.all_reduce(avg, dist.ReduceOp.AVG)  # gloo has no AVG: its SUM / size
        total = mine(n)
        dist.all_reduce(total, group=gloo)
        check(f"all_reduce AVG {n}", avg, total / size)

        def broadcast(group: Any, n: int = n) -> Any:
            t = mine(n)
            dist.broadcast(t, src=size - 1, group=group)
            return t

        check(f"broadcast {n}", *both(broadcast), exact=True)

        for dtype in (torch.float32, torch.bfloat16):

            def gather(group: Any, n: int = n, dtype: Any = dtype) -> Any:
                outs = [torch.empty(n, dtype=dtype) for _ in range(size)]
                dist.all_gather(outs, mine(n, dtype), group=group)
                return torch.stack(outs)

            check(f"all_gather {dtype} {n}", *both(gather), exact=True)

        def gather_into(group: Any, n: int = n) -> Any:
            out = torch.empty(size * n)
            gather_single(out, mine(n), group=group)
            return out

        check(f"all_gather_into_tensor {n}", *both(gather_into), exact=True)

        def scatter(group: Any, n: int = n) -> Any:
            out = torch.empty(n)
            scatter_single(out, mine(size * n), group=group)
            return out

        check(f"reduce_scatter_tensor {n}", *both(scatter))

    work = dist.all_reduce(torch.ones(3), async_op=True)
    work.wait()
    dist.barrier()
    dist.barrier(group=gloo)
    refused = {}
    for name, call in {
        "reduce": lambda: dist.reduce(torch.ones(2), dst=0),
        "gather": lambda: dist.gather(torch.ones(2), [torch.ones(2)] * size, dst=rank),
        "all_to_all_single": lambda: dist.all_to_all_single(torch.ones(size), torch.ones(size)),
        "all_reduce PRODUCT": lambda: dist.all_reduce(torch.ones(2), dist.ReduceOp.PRODUCT),
    }.items():
        try:
            call()
        except NotImplementedError as exc:
            refused[name] = str(exc)
    return {"differs": differs, "refused": refused, "backend": dist.get_backend()}


def ddp(rank: int, size: int, gloo: Any) -> dict[str, Any]:
    """The same model trained with DDP over tensorwire (plain, and through the comm hook in
    float32, bfloat16, float16 and int8) and over gloo: every step's loss and the final accuracy."""
    import torch
    from sklearn.datasets import load_digits
    from torch.nn.parallel import DistributedDataParallel

    from tensorwire.collective.ddp import CommHookState, allreduce_hook

    digits = load_digits()
    x = torch.tensor(digits.data / 16.0, dtype=torch.float32)
    y = torch.tensor(digits.target)
    shard = torch.arange(rank, len(y), size)
    batch = 16

    def train(group: Any, hook: CommHookState | None) -> dict[str, Any]:
        torch.manual_seed(0)
        net = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))
        model = DistributedDataParallel(net, process_group=group)
        if hook is not None:
            model.register_comm_hook(hook, allreduce_hook)
        sgd = torch.optim.SGD(model.parameters(), lr=0.1)
        losses = []
        start = time.perf_counter()
        per_epoch = len(shard) // batch
        for step in range(STEPS):
            at = shard[(step % per_epoch) * batch :][:batch]
            loss = torch.nn.functional.cross_entropy(model(x[at]), y[at])
            sgd.zero_grad()
            loss.backward()
            sgd.step()
            losses.append(loss.item())
        seconds = time.perf_counter() - start
        with torch.no_grad():
            accuracy = float((net(x).argmax(1) == y).float().mean())
        return {"losses": losses, "accuracy": accuracy, "seconds": seconds}

    return {
        "gloo": train(gloo, None),
        "tensorwire": train(None, None),
        "hook": train(None, CommHookState()),
        "hook_bf16": train(None, CommHookState(wire_dtype=torch.bfloat16)),
        "hook_fp16": train(None, CommHookState(wire_dtype=torch.float16)),
        "hook_int8": train(None, CommHookState(compress="int8")),
    }


def fault(rank: int, size: int, gloo: Any, stop: bool = False) -> dict[str, Any]:
    """Rank ``size - 1`` dies (or, with ``stop``, is stopped) as its allreduce (64 MiB)
    starts; the others wait on theirs."""
    import torch
    import torch.distributed as dist

    dist.barrier()
    work = dist.all_reduce(torch.ones(16 << 20), async_op=True)
    if rank == size - 1:
        if stop:
            os.kill(os.getpid(), signal.SIGSTOP)
        os._exit(1)
    start = time.monotonic()
    try:
        work.wait()
    except Exception as exc:
        return {"raised": f"{type(exc).__name__}: {exc}", "seconds": time.monotonic() - start}
    return {"raised": None, "seconds": time.monotonic() - start}


SCENARIOS: dict[str, Callable[[int, int, Any], dict[str, Any]]] = {
    "operations": operations,
    "ddp": ddp,
    "fault": fault,
    "hang": functools.partial(fault, stop=True),
}


def max_difference(a: list[float], b: list[float]) -> float:
    return float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
