"""``tensorwire bench collective --profiles``: the jobs' ranks on the testbed, each in a
network namespace of its own behind its own shaped link.

The topology is the testbed's star (:class:`~tensorwire.testbed.Testbed`): rank ``r`` runs
in device node ``dev{r+1}``, whose veth to the server's bridge is shaped at the profile's
rate in both directions (tbf where a packet leaves: the device's end up, the bridge's end
down). Rank to rank, a packet leaves its sender by the sender's uplink and reaches its
receiver by the receiver's downlink: every hop of a ring crosses two shaped links, and in a
ring each link carries exactly one flow (rank ``r``'s uplink its sends to ``r + 1``, its
downlink what ``r - 1`` sends). So no rank sends or receives faster than the link rate
``R``, and none has to share it: the least time of an allreduce is what each rank must
send, ``2 (N - 1) / N x bytes``, at ``R`` (tbf counts the Ethernet, IP and TCP headers too,
so TCP's payload gets at most 1448/1514 of ``R``: the bound is not quite reachable).

- tensorwire: a rendezvous in the server node (``srv``), the ranks in the devices; each
  listens on its device's address (the one it reaches the rendezvous from).
- gloo: a FileStore in a temporary directory (the namespaces share the file system), each
  rank's ``GLOO_SOCKET_IFNAME`` its device's interface.
- MPI: ``mpirun`` in the server node, one "host" per device, named by its address; Open
  MPI starts its daemon on each through a launch agent script that enters the device's
  namespace (instead of ssh) and gives the daemon a UTS namespace with the node's name as
  hostname (Open MPI takes processes with the same hostname for one node, and two ranks in
  different network namespaces that it believes share one crash it). Its traffic is pinned
  to the testbed's subnet (``btl_tcp_if_include``, ``oob_tcp_if_include``). Where that cannot
  be done (a testbed in a user namespace, without ``ip netns``; no ``unshare``/``hostname``),
  MPI runs on loopback and its rows say so (``placed``).
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import subprocess
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from tensorwire.bench.collective import Job, Link, Loopback, rank_argv
from tensorwire.collective.mpirun import find_mpirun, mpirun_env
from tensorwire.testbed import NamespacesUnavailable, Testbed, as_profile, probe_capabilities

PLACED = "netns"
"""How the rows of jobs on the testbed say where their ranks ran."""


@contextlib.contextmanager
def open_testbed(
    ranks: int, profiles: Sequence[str], say: Callable[[str], None]
) -> Iterator[tuple[Testbed, TestbedPlacement, list[Link]]]:
    """A testbed of ``ranks`` devices on a star, its links shaped with the first of
    ``profiles``; the placement that starts jobs in it; a :class:`Link` per profile.
    :class:`NamespacesUnavailable` (with why) where namespaces cannot be made."""
    if not profiles:
        raise ValueError("give at least one link profile (4g, wifi, 100mbit, 1gbit, ...)")
    links = [Link(p, as_profile(p).rate) for p in profiles]
    for link in links:
        if link.rate is None:
            raise ValueError(f"profile {link.name!r} has no rate: the ring bound needs one")
    caps = probe_capabilities()
    if caps.mode is None:
        why = "; ".join(caps[n].reason for n in ("root", "userns", "netns") if n in caps.items)
        raise NamespacesUnavailable(
            f"no network namespaces here ({why}): run without --profiles for loopback"
        )
    with Testbed(devices=ranks, profile=profiles[0]) as tb:
        say(f"testbed: {ranks} ranks, each in its own namespace ({tb.mode}), star, {tb.label}")
        yield tb, TestbedPlacement(tb), links


class TestbedPlacement:
    """Starts a job's rank ``r`` in device node ``dev{r+1}`` of the open testbed ``tb``."""

    placed = PLACED

    def __init__(self, tb: Testbed) -> None:
        self.tb = tb

    def _spawn(
        self, node: str, argv: Sequence[str], first: bool, env: dict[str, str]
    ) -> subprocess.Popen[str]:
        pipe = subprocess.PIPE if first else subprocess.DEVNULL
        proc: subprocess.Popen[str] = self.tb.popen(
            node, list(argv), stdin=pipe, stdout=pipe, env=env, text=True
        )
        return proc

    def _node(self, rank: int) -> str:
        return self.tb.device_nodes[rank]

    def tensorwire_job(self, ranks: int, variants: list[dict[str, Any]]) -> Job:
        env = dict(os.environ)
        url = f"tcp://{self.tb.server_address}:0"
        serving = self._spawn("srv", rank_argv("rendezvous", url, str(ranks)), True, env)
        url = str(Job("rendezvous", [serving]).answer()["url"])  # it ends once all came
        spec = json.dumps(variants)
        procs = [
            self._spawn(
                self._node(r), rank_argv("tensorwire", url, str(r), str(ranks), spec), r == 0, env
            )
            for r in range(ranks)
        ]
        return Job("tensorwire", procs)

    def gloo_job(self, ranks: int, store: Path) -> Job:
        procs = []
        for r in range(ranks):
            env = {**os.environ, "GLOO_SOCKET_IFNAME": self.tb.interface(self._node(r))}
            argv = rank_argv("gloo", str(store), str(r), str(ranks))
            procs.append(self._spawn(self._node(r), argv, r == 0, env))
        return Job("gloo", procs)

    def mpi_job(self, ranks: int, btl: str, tmp: Path) -> tuple[Job, str]:
        missing = self._mpi_in_namespaces_missing(btl)
        if missing:
            job, _ = Loopback().mpi_job(ranks, btl, tmp)
            return job, f"loopback ({missing})"
        mpirun = find_mpirun()
        assert mpirun is not None  # mpi_missing() said there is one
        hosts = {self.tb.address(self._node(r)): self._node(r) for r in range(ranks)}
        agent = tmp / "launch-agent.sh"
        agent.write_text(self._agent_script(hosts))
        agent.chmod(0o700)
        subnet = self.tb.subnet
        command = [
            mpirun,
            "--host",
            ",".join(f"{address}:1" for address in hosts),
            "-np",
            str(ranks),
            "--bind-to",
            "none",  # each "host" has 1 slot: bound, every rank would be on core 0
            "--mca",
            "plm_rsh_agent",
            str(agent),
            "--mca",
            "btl",
            "self,tcp",
            "--mca",
            "btl_tcp_if_include",
            subnet,
            "--mca",
            "oob_tcp_if_include",
            subnet,
            *rank_argv("mpi"),
        ]
        return Job(f"mpi-{btl}", [self._spawn("srv", command, True, mpirun_env())]), PLACED

    def _mpi_in_namespaces_missing(self, btl: str) -> str | None:
        """Why MPI's ranks cannot go in the namespaces, or None."""
        if btl != "tcp":
            return f"btl {btl} cannot cross namespaces"
        if self.tb.mode != "root":
            return "the testbed is in a user namespace: no ip netns for Open MPI's launcher"
        for tool in ("unshare", "hostname"):
            if shutil.which(tool) is None:
                return f"no {tool} program"
        return None

    def _agent_script(self, hosts: dict[str, str]) -> str:
        """Open MPI's launch agent (in place of ssh): ``agent HOST COMMAND...`` runs
        COMMAND in HOST's node, in a UTS namespace whose hostname is the node's."""
        unshare = shutil.which("unshare")
        cases = [
            f"  {address}) exec {shlex.join(self.tb.command(node, []))} {unshare} --uts "
            f'sh -c "hostname {node} && $*" ;;'
            for address, node in hosts.items()
        ]
        return "\n".join(
            [
                "#!/bin/sh",
                'host="$1"; shift',
                'case "$host" in',
                *cases,
                '  *) echo "launch agent: no node at $host" >&2; exit 1 ;;',
                "esac",
                "",
            ]
        )
