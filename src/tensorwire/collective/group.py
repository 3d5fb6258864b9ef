"""A group of ranks that exchange directly, and the collective operations on it."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any, Literal

import numpy as np

from tensorwire.collective import broadcast as broadcasts
from tensorwire.collective import compressed_allreduce, doubling, ring
from tensorwire.collective.arrays import WorkArray, as_array
from tensorwire.collective.compression import Compression, CompressionMethod, compression_for
from tensorwire.collective.credentials import rank_credentials
from tensorwire.collective.link import LinkSecurity
from tensorwire.collective.mesh import Mesh, listen
from tensorwire.collective.operation import Operation
from tensorwire.collective.options import GroupOptions
from tensorwire.collective.reduce import ReduceOp, check_reduction, finish
from tensorwire.collective.rendezvous import (
    Address,
    Meeting,
    address_toward,
    announce,
    serve_if_asked,
)
from tensorwire.collective.state import GroupState
from tensorwire.wire import Limits

AllreduceAlgorithm = Literal["ring", "recursive_doubling"]

ENV_RENDEZVOUS = "TENSORWIRE_RENDEZVOUS"
"""A hub URL for :meth:`Group.from_env` to meet at, in place of ``MASTER_ADDR``'s."""

ENV_CERTS = "TENSORWIRE_CERTS"
"""A directory ``tensorwire certs`` wrote: :meth:`Group.from_env`'s ``credentials``."""

TORCHRUN_PORT_OFFSET = 1
""":meth:`Group.from_env`'s hub listens on ``MASTER_PORT + 1``: torchrun's own store may
hold ``MASTER_PORT`` itself."""

CLOSE_S = 5.0  # seconds a closing rank waits for its last words to go out


def _describe(arr: np.ndarray) -> str:
    return f"{arr.dtype}{list(arr.shape)}"


class Group:
    """``size`` ranks, this one ``rank``, with a direct TCP link to each other rank.

    Form one with :meth:`join` (a rendezvous at a tensorwire hub URL), :meth:`from_env`
    (torchrun's variables) or :meth:`from_mpi` (ranks placed by ``mpirun``). Every rank
    must call the same operations in the same order, with the same shapes and dtypes; a
    rank that does not, dies or hangs makes every rank raise
    (:class:`~tensorwire.errors.CollectiveMismatch`,
    :class:`~tensorwire.errors.RankFailed`), after which the group is closed for use.
    Operations take numpy arrays and torch CPU tensors, work in place (or into ``out=``) and
    return the array that holds the result. One operation at a time: a group is not for
    several threads to call at once.
    """

    def __init__(
        self, state: GroupState, mesh: Mesh, options: GroupOptions, address: Address
    ) -> None:
        self._state = state
        self._mesh = mesh
        self.address = address
        """Where this rank listens for the other ranks: (host, port)."""
        self.options = options
        self.rank = state.rank
        self.size = state.size
        self._feedback = compressed_allreduce.FeedbackMemory()

    # -- forming a group --------------------------------------------------------------

    @classmethod
    def join(
        cls,
        url: str,
        *,
        rank: int,
        size: int,
        serve: bool | None = None,
        host: str | None = None,
        options: GroupOptions | None = None,
        **settings: Any,
    ) -> Group:
        """Meet the other ranks at the tensorwire hub ``url`` (any transport) and connect.

        ``serve``: this rank serves the hub (default: rank 0 does; pass False when a
        :class:`~tensorwire.collective.Rendezvous` of its own serves it). ``host``: the
        address this rank listens on (default: the one it reaches the hub's host from).
        ``options`` and the keywords are :class:`GroupOptions`' fields; with ``credentials``
        the hub is served and joined with them and every link is sealed (``docs/collective.md``);
        with ``elastic=True`` the group is an :class:`~tensorwire.collective.elastic.ElasticGroup`.
        """
        if not 0 <= rank < size:
            raise ValueError(f"rank={rank} is not in 0..{size - 1} (size={size})")
        opts = replace(options or GroupOptions(), **settings)
        if opts.elastic:
            from tensorwire.collective import elastic

            return elastic.join(url, rank, size, serve, host, opts)
        creds = rank_credentials(opts.credentials, rank)
        rendezvous = serve_if_asked(url, rank, size, serve, opts, creds)
        if rendezvous is not None:
            url = rendezvous.url
        try:
            return cls._connect(
                rank,
                size,
                host or address_toward(url),
                opts,
                lambda address: announce(url, rank, size, address, opts.connect_timeout, creds),
            )
        finally:
            if rendezvous is not None:
                rendezvous.close()

    @classmethod
    def _connect(
        cls,
        rank: int,
        size: int,
        host: str,
        opts: GroupOptions,
        exchange: Callable[[Address], tuple[list[Address], str] | Meeting],
    ) -> Group:
        """Listen on ``host``, learn every rank's listener and the group's token (and any
        link keys) from ``exchange`` (given this rank's listener: a rendezvous at a hub URL;
        MPI's allgather and broadcast are the other way to come), and connect to every rank,
        securing the links with ``opts.credentials`` when given."""
        deadline = time.monotonic() + opts.connect_timeout
        sock = listen(host)
        address = sock.getsockname()[:2]
        state = GroupState(rank, size, opts.silence)
        try:
            addresses, token, link_keys = Meeting(*exchange(address))
            creds = rank_credentials(opts.credentials, rank)
            security = LinkSecurity(rank, token, creds, link_keys)
            mesh = Mesh(state, token, opts.heartbeat, Limits(), security)
            try:
                mesh.open(sock, addresses, deadline)
            except BaseException:
                mesh.close(0.1)
                raise
        except BaseException:
            sock.close()
            raise
        return cls(state, mesh, opts, address)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **kwargs: Any) -> Group:
        """A group from torchrun's variables: ``RANK``, ``WORLD_SIZE``, and the hub at
        ``tcp://MASTER_ADDR:MASTER_PORT+1`` (or the URL in ``TENSORWIRE_RENDEZVOUS``),
        served by rank 0, with the credentials in the directory ``TENSORWIRE_CERTS`` names,
        if set. The keywords go to :meth:`join`."""
        env = os.environ if env is None else env
        if env.get(ENV_CERTS) and "credentials" not in kwargs:
            kwargs["credentials"] = env[ENV_CERTS]
        missing = [k for k in ("RANK", "WORLD_SIZE") if k not in env]
        url = env.get(ENV_RENDEZVOUS)
        if url is None:
            missing += [k for k in ("MASTER_ADDR", "MASTER_PORT") if k not in env]
        if missing:
            raise ValueError(
                f"{', '.join(missing)} not set: start the ranks with torchrun, or set them"
            )
        if url is None:
            port = int(env["MASTER_PORT"]) + TORCHRUN_PORT_OFFSET
            url = f"tcp://{env['MASTER_ADDR']}:{port}"
        return cls.join(url, rank=int(env["RANK"]), size=int(env["WORLD_SIZE"]), **kwargs)

    @classmethod
    def from_mpi(
        cls,
        comm: Any = None,
        *,
        host: str | None = None,
        options: GroupOptions | None = None,
        **settings: Any,
    ) -> Group:
        """A group of the ranks of ``comm`` (default mpi4py's ``COMM_WORLD``), placed by
        ``mpirun``: listeners and token go round by MPI's allgather and broadcast, no hub.
        ``host``: the address this rank listens on (default loopback when every rank is on
        this host). ``options`` and the keywords are :class:`GroupOptions`' fields."""
        from tensorwire.collective import mpi

        comm = mpi.world(comm)
        opts = replace(options or GroupOptions(), **settings)
        if opts.elastic:
            raise ValueError("elastic mode needs a coordinator: use Group.join, not from_mpi")
        host = host or mpi.listen_host(comm)
        return cls._connect(comm.Get_rank(), comm.Get_size(), host, opts, mpi.exchange(comm))

    # -- operations ---------------------------------------------------------------------

    def _operation(self, sig: str, timeout: float | None) -> Operation:
        timeout = self.options.timeout if timeout is None else timeout
        return Operation(self._state, sig, timeout, self.options.checksum)

    def _pick(self, nbytes: int, algorithm: str | None, small: str) -> str:
        if algorithm is None:
            return "ring" if nbytes >= self.options.ring_min_bytes else small
        if algorithm not in ("ring", small):
            raise ValueError(f"algorithm={algorithm!r}: this operation runs 'ring' or {small!r}")
        return algorithm

    def allreduce(
        self,
        x: Any,
        op: ReduceOp = "sum",
        *,
        out: Any = None,
        algorithm: AllreduceAlgorithm | None = None,
        compress: CompressionMethod | Compression | None = None,
        key: str | None = None,
        timeout: float | None = None,
    ) -> Any:
        """Combine ``x`` element-wise over every rank (``op``: sum, mean, min, max), in
        place, or into ``out`` (same shape and dtype) leaving ``x`` as it was.

        ``algorithm``: "ring" or "recursive_doubling" (default by size: ring from
        ``options.ring_min_bytes``). float16/bfloat16 sums accumulate in float32 per step.

        ``compress`` (default ``options.compress``; ``"none"`` for exact): ``"fp16"``,
        ``"bf16"``, ``"int8"``, ``"topk"``, ``"randomk"`` or a
        :class:`~tensorwire.collective.Compression`, for sum and mean of float tensors
        that go round the ring; smaller ones (recursive doubling) are sent exact.
        ``key`` names the tensor whose error-feedback residual top-k and random-k keep
        across calls (default: its dtype and shape; give distinct tensors distinct keys).
        """
        src = as_array(x, "x")
        check_reduction(op, src.dtype)
        compression = compression_for(compress, self.options.compress, op, src.dtype, algorithm)
        work = WorkArray(x if out is None else out, "x" if out is None else "out")
        if out is not None:
            self._check_out(work.array, src.shape, src.dtype)
            work.flat[...] = src.reshape(-1)
        flat = work.flat
        chosen = self._pick(flat.nbytes, algorithm, "recursive_doubling")
        if chosen != "ring":
            compression = None
        how = chosen if compression is None else f"{chosen}, {compression.label}"
        opn = self._operation(f"allreduce({op}, {_describe(src)}, {how})", timeout)
        if compression is not None:
            compressed_allreduce.allreduce(
                opn,
                flat,
                compression,
                self._feedback,
                _describe(src) if key is None else key,
                self.rank,
                self.size,
                self.options.piece_bytes,
            )
        elif chosen == "ring":
            ring.allreduce(opn, flat, op, self.rank, self.size, self.options.piece_bytes)
        else:
            doubling.allreduce(opn, flat, op, self.rank, self.size)
        finish(op, flat, self.size)
        return work.result()

    def reduce_scatter(
        self, x: Any, op: ReduceOp = "sum", *, out: Any = None, timeout: float | None = None
    ) -> Any:
        """Combine ``x`` over every rank and keep this rank's share: ``x``'s first
        dimension is cut into ``size`` equal blocks; rank ``r`` gets block ``r`` combined
        (ring algorithm), in ``out`` (default: a new array of the block's shape)."""
        src = as_array(x, "x")
        check_reduction(op, src.dtype)
        if src.ndim == 0 or src.shape[0] % self.size:
            raise ValueError(
                f"reduce_scatter of {_describe(src)}: the first dimension must be a "
                f"multiple of the group's size ({self.size})"
            )
        block = (src.shape[0] // self.size, *src.shape[1:])
        scratch = np.ascontiguousarray(src).reshape(-1).copy()  # x itself stays as it was
        target = np.empty(block, src.dtype) if out is None else out
        work = WorkArray(target, "out")
        self._check_out(work.array, block, src.dtype)
        opn = self._operation(f"reduce_scatter({op}, {_describe(src)}, ring)", timeout)
        bounds = ring.reduce_scatter(
            opn, scratch, op, self.rank, self.size, self.options.piece_bytes
        )
        work.flat[...] = scratch[bounds[self.rank] : bounds[self.rank + 1]]
        finish(op, work.flat, self.size)
        return work.result()

    def allgather(self, x: Any, *, out: Any = None, timeout: float | None = None) -> Any:
        """Every rank's ``x``, stacked: ``out`` of shape ``(size, *x.shape)`` (default a new
        array; any shape of ``size * x.size`` elements will do, such as the ranks' tensors
        concatenated along the first dimension), rank ``r``'s at block ``r`` (ring)."""
        src = as_array(x, "x")
        target = np.empty((self.size, *src.shape), src.dtype) if out is None else out
        work = WorkArray(target, "out")
        if work.array.dtype != src.dtype or work.array.size != self.size * src.size:
            raise ValueError(
                f"out is {_describe(work.array)}: allgather of {_describe(src)} over "
                f"{self.size} ranks needs {self.size * src.size} elements of {src.dtype}"
            )
        flat = work.flat
        bounds = ring.segment_bounds(flat.size, self.size)
        flat[bounds[self.rank] : bounds[self.rank + 1]] = src.reshape(-1)
        opn = self._operation(f"allgather({_describe(src)}, ring)", timeout)
        ring.allgather(opn, flat, self.rank, self.size, self.options.piece_bytes, bounds)
        return work.result()

    def broadcast(
        self,
        x: Any,
        root: int = 0,
        *,
        algorithm: Literal["ring", "tree"] | None = None,
        timeout: float | None = None,
    ) -> Any:
        """Fill ``x`` on every rank with rank ``root``'s, in place. ``algorithm``: "ring"
        (a pipelined chain) or "tree" (binomial; default below ``options.ring_min_bytes``)."""
        if not 0 <= root < self.size:
            raise ValueError(f"root={root} is not in 0..{self.size - 1}")
        work = WorkArray(x, "x")
        flat = work.flat
        chosen = self._pick(flat.nbytes, algorithm, "tree")
        opn = self._operation(f"broadcast(root {root}, {_describe(work.array)}, {chosen})", timeout)
        if chosen == "ring":
            broadcasts.chain(opn, flat, root, self.rank, self.size, self.options.piece_bytes)
        else:
            broadcasts.tree(opn, flat, root, self.rank, self.size)
        return work.result()

    def barrier(self, timeout: float | None = None) -> None:
        """Return once every rank has called it (recursive doubling on one byte)."""
        opn = self._operation("barrier()", timeout)
        doubling.allreduce(opn, np.zeros(1, np.uint8), "max", self.rank, self.size)

    @staticmethod
    def _check_out(out: np.ndarray, shape: tuple[int, ...], dtype: np.dtype) -> None:
        if out.shape != tuple(shape) or out.dtype != dtype:
            raise ValueError(f"out is {_describe(out)}, the result is {dtype}{list(shape)}")

    # -- state --------------------------------------------------------------------------

    @property
    def refusals(self) -> list[tuple[str, str]]:
        """Connections this rank's listener refused (who, why): the most recent 100."""
        with self._state.lock:
            return list(self._state.refusals)

    @property
    def bytes_sent(self) -> int:
        """Bytes this rank's operations have sent to the other ranks (wire messages: pieces
        with their headers; not heartbeats or the handshake)."""
        return self._state.bytes_sent

    @property
    def failure(self) -> Exception | None:
        """The error that ended the group's usefulness, if one did."""
        return self._state.failure

    def close(self) -> None:
        """Leave the group: say bye on every link, close them and the listener."""
        with self._state.lock:
            if self._state.closing:
                return
            self._state.closing = True  # from here on, connections ending are no failure
        self._mesh.close(CLOSE_S)
        self._state.close()

    def __enter__(self) -> Group:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<Group rank {self.rank} of {self.size}>"
