"""torch.distributed's backend ``"tensorwire"``: a ProcessGroup whose collectives run on a
tensorwire :class:`~tensorwire.collective.Group`, so DDP code runs unchanged on it.

Importing this module registers the backend::

    import tensorwire.collective.torch_backend  # noqa: F401  (registers "tensorwire")

    torch.distributed.init_process_group("tensorwire", rank=r, world_size=n, store=...)

The ranks meet through the store torch gives the backend (each rank puts its listener's
address there, rank 0 the group's token); then they connect to each other over TCP.
Operations run in the order they are called, on one thread of their own, so a call returns
a ``Work`` at once and ``Work.wait()`` blocks until the operation is done, raising the
group's error (:class:`~tensorwire.errors.RankFailed`, ...) if it failed.
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch.futures import Future

from tensorwire.collective.group import ENV_CERTS, Group
from tensorwire.collective.options import GroupOptions
from tensorwire.collective.reduce import ReduceOp
from tensorwire.collective.rendezvous import Address, address_toward
from tensorwire.errors import CollectiveError

BACKEND = "tensorwire"
"""The name to give ``init_process_group``."""

ADDRESS_KEY = "tensorwire/address/"  # + rank: where that rank listens, as JSON [host, port]
TOKEN_KEY = "tensorwire/token"  # the group's token, chosen by rank 0

REDUCTIONS: dict[Any, ReduceOp] = {
    dist.ReduceOp.SUM: "sum",
    dist.ReduceOp.AVG: "mean",
    dist.ReduceOp.MIN: "min",
    dist.ReduceOp.MAX: "max",
}
"""torch's reductions the group runs, and its names for them."""

UNSUPPORTED = (
    "reduce",
    "scatter",
    "gather",
    "alltoall",
    "alltoall_base",
    "all_to_all_single",
    "send",
    "recv",
    "recv_anysource",
    "allreduce_coalesced",
    "allgather_coalesced",
    "allgather_into_tensor_coalesced",
    "all_gather_single_coalesced",
    "reduce_scatter",
    "reduce_scatter_tensor_coalesced",
    "reduce_scatter_single_coalesced",
)
"""torch.distributed operations this backend does not run (yet): each raises
NotImplementedError naming itself."""


def store_exchange(
    store: dist.Store, rank: int, size: int, timeout: float
) -> Callable[[Address], tuple[list[Address], str]]:
    """The rendezvous through torch's ``store``: given this rank's listener address, put
    it in the store and return every rank's, with the token rank 0 put there."""

    def exchange(address: Address) -> tuple[list[Address], str]:
        if rank == 0:
            store.set(TOKEN_KEY, secrets.token_hex(16))
        store.set(f"{ADDRESS_KEY}{rank}", json.dumps(list(address)))
        keys = [f"{ADDRESS_KEY}{r}" for r in range(size)]
        try:
            store.wait([*keys, TOKEN_KEY], timedelta(seconds=timeout))
        except RuntimeError as exc:  # DistStoreError: some rank never came
            problem = f"rank {rank}: the rendezvous in torch's store failed: {exc}"
            raise CollectiveError(problem) from exc
        addresses = [json.loads(store.get(key)) for key in keys]
        return [(str(h), int(p)) for h, p in addresses], store.get(TOKEN_KEY).decode()

    return exchange


def listen_host(store: dist.Store) -> str:
    """The address this rank listens on: the one it reaches the TCPStore's host (or
    ``MASTER_ADDR``) from; loopback when neither is known (a FileStore on one host)."""
    while isinstance(store, dist.PrefixStore):
        store = store.underlying_store
    host = getattr(store, "host", None) or os.environ.get("MASTER_ADDR")
    return address_toward(f"tcp://{host}:0") if host else "127.0.0.1"


class TensorwireWork(dist.Work):
    """An operation queued on the group's thread: ``wait()`` blocks until it is done and
    raises what it raised (torch's own future-backed Work would only log it)."""

    def __init__(self, future: Future[Any]) -> None:
        super().__init__()
        self._future = future

    def wait(self, timeout: timedelta | None = None) -> bool:
        """Block until the operation is done; the group's deadline bounds it, not
        ``timeout`` (a group that missed one is of no more use)."""
        self._future.wait()
        return True

    def is_completed(self) -> bool:
        return self._future.done()

    def get_future(self) -> Future[Any]:
        return self._future


def _unsupported(name: str) -> Callable[..., Any]:
    def refuse(self: ProcessGroupTensorwire, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(
            f"{name}: the tensorwire backend runs all_reduce, broadcast, all_gather, "
            "all_gather_single (all_gather_into_tensor), reduce_scatter_single "
            "(reduce_scatter_tensor) and barrier; use gloo for the rest"
        )

    refuse.__name__ = name
    return refuse


class ProcessGroupTensorwire(dist.ProcessGroup):
    """A torch ProcessGroup over a tensorwire :class:`Group` (CPU tensors, one per call).

    Every operation is queued on one thread of the group's own, in call order (the group
    runs one operation at a time), and returns a ``Work`` whose ``wait()`` blocks until it
    is done and whose future holds the tensors it wrote.
    """

    def __init__(self, group: Group) -> None:
        # the store overload cannot make a Python subclass; torch's stubs know only that one
        super().__init__(group.rank, group.size)  # type: ignore[call-arg]
        self.group = group
        """The tensorwire group the operations run on."""
        self._runner = ThreadPoolExecutor(1, thread_name_prefix=f"tensorwire-rank{group.rank}")

    def submit(self, run: Callable[[], Any]) -> Future[Any]:
        """Queue ``run`` (a call on :attr:`group`) after every operation queued before;
        the future holds what it returns, or raises what it raised."""
        future: Future[Any] = Future()

        def job() -> None:
            try:
                result = run()
            except BaseException as exc:  # the caller's wait() raises it
                future.set_exception(exc)
            else:
                future.set_result(result)

        self._runner.submit(job)
        return future

    def _work(self, run: Callable[[], Any], result: Any) -> dist.Work:
        def done() -> Any:
            run()
            return result

        return TensorwireWork(self.submit(done))

    # -- operations torch calls (its stubs type the user-facing overloads: ignore[override])

    def allreduce(  # type: ignore[override]
        self, tensors: list[torch.Tensor], opts: Any
    ) -> dist.Work:
        tensor = _one(tensors, "allreduce")
        reduction = REDUCTIONS.get(opts.reduceOp.op)
        if reduction is None:
            raise NotImplementedError(
                f"allreduce with {opts.reduceOp.op}: the tensorwire backend runs SUM, AVG, "
                "MIN and MAX"
            )
        return self._work(lambda: self.group.allreduce(tensor, reduction), tensors)

    def broadcast(  # type: ignore[override]
        self, tensors: list[torch.Tensor], opts: Any
    ) -> dist.Work:
        tensor = _one(tensors, "broadcast")
        return self._work(lambda: self.group.broadcast(tensor, opts.rootRank), tensors)

    def allgather(  # type: ignore[override]
        self, output_tensors: list[list[torch.Tensor]], input_tensors: list[torch.Tensor], opts: Any
    ) -> dist.Work:
        tensor = _one(input_tensors, "allgather")
        outputs = _one(output_tensors, "allgather")

        def gather() -> None:
            stacked = tensor.new_empty((self.group.size, *tensor.shape))
            self.group.allgather(tensor, out=stacked)
            for out, got in zip(outputs, stacked, strict=True):
                out.copy_(got)

        return self._work(gather, output_tensors)

    def all_gather_single(  # type: ignore[override]
        self, output: torch.Tensor, input: torch.Tensor, opts: Any
    ) -> dist.Work:
        return self._work(lambda: self.group.allgather(input, out=output), [output])

    def reduce_scatter_single(
        self, output: torch.Tensor, input: torch.Tensor, opts: Any
    ) -> dist.Work:
        reduction = REDUCTIONS.get(opts.reduceOp.op)
        if reduction is None:
            raise NotImplementedError(f"reduce_scatter_tensor with {opts.reduceOp.op}")
        blocks = input.reshape(self.group.size, -1)
        return self._work(
            lambda: self.group.reduce_scatter(blocks, reduction, out=output.view(1, -1)),
            [output],
        )

    # the older names of the two, still bound by torch
    _allgather_base = all_gather_single  # type: ignore[assignment]
    _reduce_scatter_base = reduce_scatter_single  # type: ignore[assignment]

    def barrier(self, opts: Any = None) -> dist.Work:
        return self._work(self.group.barrier, [])

    def getBackendName(self) -> str:  # torch's name for it
        return BACKEND

    def shutdown(self) -> None:
        """Let queued operations end, then leave the group."""
        self._runner.shutdown(wait=True)
        self.group.close()

    abort = shutdown  # the operation under way ends by its deadline at the latest

    def __repr__(self) -> str:
        return f"<ProcessGroupTensorwire rank {self.group.rank} of {self.group.size}>"


for _name in UNSUPPORTED:
    setattr(ProcessGroupTensorwire, _name, _unsupported(_name))


def _one(tensors: list[Any], operation: str) -> Any:
    if len(tensors) != 1:
        raise ValueError(f"{operation}: the tensorwire backend takes one tensor per call")
    return tensors[0]


def create(options: Any, group_options: GroupOptions | None) -> ProcessGroupTensorwire:
    """torch's constructor for the backend (``extended_api``): ``group_options`` is what
    ``init_process_group(pg_options=...)`` was given; by default the group's deadlines
    are torch's ``timeout``, and its credentials the directory ``TENSORWIRE_CERTS`` names
    (certificates: torch's store gives out no link keys)."""
    timeout = options.timeout.total_seconds()
    certs = os.environ.get(ENV_CERTS) or None
    opts = group_options or GroupOptions(
        timeout=timeout, connect_timeout=timeout, credentials=certs
    )
    rank, size, store = options.group_rank, options.group_size, options.store
    exchange = store_exchange(store, rank, size, opts.connect_timeout)
    group = Group._connect(rank, size, listen_host(store), opts, exchange)
    return ProcessGroupTensorwire(group)


dist.Backend.register_backend(BACKEND, create, extended_api=True, devices=["cpu"])
