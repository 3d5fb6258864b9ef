"""Elastic mode: a group that goes on past a failed rank, and that a restarted rank rejoins.

Every rank keeps its channel to the coordinator (:mod:`.coordinator`, on the rendezvous
hub) for the group's life. An operation runs over the current *view* (the ranks left, in
order: the algorithms run unchanged on positions in it); then each rank reports how it
ended and waits for the verdict. On **commit** it returns, and ranks that rejoin enter the
view (the members dial them). On **redo** every rank left puts its input back as it was,
fences its links (a fence on a link says: all sent before it is stale; the receiver drops
what it holds of it) and runs the operation again over the smaller view, so a sum or mean
is over the ranks left. A rank out of the view raises :class:`~tensorwire.errors.RankDropped`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Literal, TypeVar

import numpy as np

from tensorwire.collective import messages
from tensorwire.collective.arrays import as_array
from tensorwire.collective.compression import Compression, CompressionMethod
from tensorwire.collective.coordination import Coordination, Verdict, Welcome
from tensorwire.collective.credentials import rank_credentials
from tensorwire.collective.group import AllreduceAlgorithm, Group
from tensorwire.collective.link import LinkSecurity
from tensorwire.collective.mesh import Mesh, listen
from tensorwire.collective.operation import Operation
from tensorwire.collective.options import GroupOptions
from tensorwire.collective.reduce import ReduceOp
from tensorwire.collective.rendezvous import Address, Rendezvous, address_toward, serve_if_asked
from tensorwire.collective.state import GroupState
from tensorwire.errors import CollectiveError, RankFailed
from tensorwire.wire import Limits

T = TypeVar("T")
DROP_CLOSE_S = 0.1  # seconds a link to a dropped rank may take to close


class ViewOperation(Operation):
    """An operation over ``members`` (real ranks): the algorithms' ranks are positions."""

    def __init__(
        self,
        state: GroupState,
        sig: str,
        timeout: float,
        checksum: bool | str,
        members: tuple[int, ...],
    ) -> None:
        super().__init__(state, sig, timeout, checksum)
        self._members = members

    def _connection(self, peer: int) -> Any:
        return self._state.connections[self._members[peer]]

    def _wait(self, peer: int, conn: Any, what: str) -> None:
        super()._wait(self._members[peer], conn, what)

    def _mismatch(self, peer: int, theirs: str) -> Any:
        super()._mismatch(self._members[peer], theirs)


class ElasticGroup(Group):
    """A :class:`~tensorwire.collective.Group` in elastic mode (``Group.join(...,
    elastic=True)``). ``rank`` and ``size`` are this rank's position in the current view and
    the view's size (they change as ranks leave and rejoin); ``member`` is the rank this
    process joined as, ``members`` the ranks in the view."""

    def __init__(
        self,
        state: GroupState,
        mesh: Mesh,
        options: GroupOptions,
        address: Address,
        coordination: Coordination,
        welcome: Welcome,
        rendezvous: Rendezvous | None,
        security: LinkSecurity,
    ) -> None:
        super().__init__(state, mesh, options, address)
        self._security = security
        self.member = state.rank
        """The rank this process joined as (the view's ranks are these)."""
        self.members: tuple[int, ...] = ()
        """The ranks in the group now, in order; ``rank`` is this one's position in it."""
        self.last_members: tuple[int, ...] = ()
        """The ranks the last operation completed over (a mean is over as many)."""
        self._coordination = coordination
        self._rendezvous = rendezvous
        self._op = welcome.op
        self._over: CollectiveError | None = None  # dropped, or the coordinator gone
        self._fence: tuple[int, list[int]] | None = None  # due before the next operation
        self._spare = np.empty(0, np.uint8)  # where an operation's input is kept (see _save)
        mesh.dialers = frozenset()  # from now on only the coordinator's joiners are dialled
        self._set_view(welcome.view)
        with state.lock:
            state.seq = welcome.seq

    def _set_view(self, view: list[int]) -> None:
        self.members = tuple(view)
        self.rank = self.members.index(self.member)
        self.size = len(self.members)

    def _operation(self, sig: str, timeout: float | None) -> Operation:
        timeout = self.options.timeout if timeout is None else timeout
        return ViewOperation(self._state, sig, timeout, self.options.checksum, self.members)

    # -- the operations, each run until the coordinator commits it ------------------------

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
        base = super().allreduce
        compressing = compress not in (None, "none") or self.options.compress is not None

        def attempt() -> Any:
            return base(
                x, op, out=out, algorithm=algorithm, compress=compress, key=key, timeout=timeout
            )

        return self._elastic(attempt, x if out is None else None, timeout, compressing)

    def reduce_scatter(
        self, x: Any, op: ReduceOp = "sum", *, out: Any = None, timeout: float | None = None
    ) -> Any:
        base = super().reduce_scatter
        return self._elastic(lambda: base(x, op, out=out, timeout=timeout), None, timeout)

    def allgather(self, x: Any, *, out: Any = None, timeout: float | None = None) -> Any:
        base = super().allgather
        return self._elastic(lambda: base(x, out=out, timeout=timeout), None, timeout)

    def broadcast(
        self,
        x: Any,
        root: int = 0,
        *,
        algorithm: Literal["ring", "tree"] | None = None,
        timeout: float | None = None,
    ) -> Any:
        base = super().broadcast
        return self._elastic(
            lambda: base(x, root, algorithm=algorithm, timeout=timeout), x, timeout
        )

    def barrier(self, timeout: float | None = None) -> None:
        base = super().barrier
        self._elastic(lambda: base(timeout), None, timeout)

    def _elastic(
        self, attempt: Callable[[], T], keep: Any, timeout: float | None, feedback: bool = False
    ) -> T:
        """Run ``attempt`` until the coordinator commits it; ``keep`` (the tensor the
        operation works in place on) is put back as it was before each redo."""
        if self._over is not None:
            raise self._over
        timeout = self.options.timeout if timeout is None else timeout
        saved = self._save(keep)
        memory = self._feedback.snapshot() if feedback else None
        redo = False
        while True:
            error: CollectiveError | None = None
            result: Any = None
            over = self.members
            try:
                if self._fence is not None:
                    self._fence_links(*self._fence, timeout)
                if redo and saved is not None:
                    as_array(keep, "x")[...] = saved
                if redo and memory is not None:
                    self._feedback.restore(memory)
                result = attempt()
            except CollectiveError as exc:
                error = exc
            try:
                verdict = self._coordination.report(self._op, self._state.seq, error, timeout)
            except CollectiveError as exc:  # dropped, the group over, the coordinator gone
                self._over = exc
                self._state.fail(exc, tell=False)
                raise
            self._apply(verdict, timeout)
            if verdict.kind == "commit":
                self._op += 1
                self.last_members = over
                return result
            redo = True

    def _save(self, keep: Any) -> np.ndarray | None:
        """A copy of ``keep`` (None: nothing to keep), in a buffer kept across operations:
        a fresh one each time would cost its page faults too."""
        if keep is None:
            return None
        arr = as_array(keep, "x")
        if self._spare.nbytes < arr.nbytes:
            self._spare = np.empty(arr.nbytes, np.uint8)
        saved = self._spare[: arr.nbytes].view(arr.dtype).reshape(arr.shape)
        saved[...] = arr
        return saved

    # -- verdicts -----------------------------------------------------------------------

    def _apply(self, verdict: Verdict, timeout: float) -> None:
        """Take the verdict's view: close the links to ranks out of it, dial the ranks that
        rejoin; fence the links before the next attempt when the coordinator says (a redo,
        or a rank left: an abort notice about it may be on its way)."""
        state = self._state
        with state.lock:
            gone = [state.connections.pop(p) for p in list(state.connections)]
            kept = [c for c in gone if c.peer in verdict.view]
            for conn in kept:
                state.connections[conn.peer] = conn
            state.seq = verdict.seq
        for conn in gone:
            if conn.peer not in verdict.view:
                conn.close(DROP_CLOSE_S)
        if verdict.fence:
            self._fence = (verdict.seq, [c.peer for c in kept])
        deadline = time.monotonic() + timeout
        self._security.rekey(verdict.link_keys or {})
        for joiner, address in sorted(verdict.joiners.items()):
            try:
                self._mesh.dial(joiner, address, deadline)
            except RankFailed as exc:  # the next operation fails, naming it
                state.fail(exc, tell=True)
        self._set_view(verdict.view)

    def _fence_links(self, seq: int, peers: list[int], timeout: float) -> None:
        """Fence the links to ``peers``: send a fence, wait for theirs; then the group's
        failure is forgotten (every peer has dropped what it held of the failed attempt)."""
        state = self._state
        deadline = time.monotonic() + timeout
        with state.lock:
            conns = [state.connections[p] for p in peers]
            for conn in conns:
                conn.post(messages.fence(seq), deadline, control=True)
            for conn in conns:
                while conn.fenced < seq:
                    if conn.gone is not None:
                        raise RankFailed(conn.peer, conn.gone)
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise RankFailed(conn.peer, f"sent rank {state.rank} no fence in time")
                    state.changed.wait(left)
            state.failure = None
            state.changed.notify_all()
        self._fence = None

    # -- leaving ------------------------------------------------------------------------

    def close(self) -> None:
        """Leave the group: close the links, the channel to the coordinator, and the
        coordinator itself when this rank serves it (the group ends with it)."""
        super().close()
        self._coordination.close()
        if self._rendezvous is not None:
            self._rendezvous.close()
            self._rendezvous = None

    def __repr__(self) -> str:
        return f"<ElasticGroup rank {self.member}, position {self.rank} of {list(self.members)}>"


def join(
    url: str, rank: int, size: int, serve: bool | None, host: str | None, opts: GroupOptions
) -> ElasticGroup:
    """:meth:`Group.join` with ``elastic=True``: meet at the coordinator at ``url`` (rank 0
    serves it unless ``serve`` says otherwise; it then lives as long as rank 0's group) and
    keep the channel to it. A rank that comes to a running group (restarted) waits for the
    next operation the group completes, then the members dial it. With credentials the
    coordinator is served and joined with them, and every link, a rejoining rank's too, is
    sealed with the link keys it gives out (``docs/collective.md``)."""
    creds = rank_credentials(opts.credentials, rank)
    rendezvous = serve_if_asked(url, rank, size, serve, opts, creds, elastic=True)
    if rendezvous is not None:
        url = rendezvous.url
    try:
        sock = listen(host or address_toward(url))
        address = sock.getsockname()[:2]
        try:
            coordination = Coordination(url, rank, size, opts.connect_timeout, creds)
            try:
                welcome = coordination.hello(address, opts.connect_timeout)
                state = GroupState(rank, size, opts.silence)
                security = LinkSecurity(rank, welcome.token, creds, welcome.link_keys)
                mesh = Mesh(state, welcome.token, opts.heartbeat, Limits(), security)
                others = [r for r in welcome.view if r != rank]
                deadline = time.monotonic() + opts.connect_timeout
                try:
                    if welcome.late:
                        mesh.open(sock, welcome.addresses, deadline, peers=others, dialers=others)
                    else:
                        mesh.open(sock, welcome.addresses, deadline)
                except BaseException:
                    mesh.close(0.1)
                    raise
            except BaseException:
                coordination.close()
                raise
        except BaseException:
            sock.close()
            raise
    except BaseException:
        if rendezvous is not None:
            rendezvous.close()
        raise
    return ElasticGroup(state, mesh, opts, address, coordination, welcome, rendezvous, security)
