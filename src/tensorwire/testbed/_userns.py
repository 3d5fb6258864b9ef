"""The testbed without privileges: an agent inside an unprivileged user namespace.

``AgentBackend`` starts ``unshare --user --map-root-user`` and in it this module's ``main``.
The agent is root in that user namespace, so it may create network namespaces and configure
them; each namespace is held by a ``cat`` reading the agent's pipe (no names in /run/netns,
which an unprivileged user cannot write). The agent answers JSON requests, one per line, on
its stdin/stdout. When the agent ends, for any reason, the holders read EOF and end, and the
kernel removes the namespaces with everything in them: nothing can be left behind except
processes started inside, which :class:`~tensorwire.testbed.Testbed` stops.
Programs run inside a node with ``nsenter --target HOLDER --user --net``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from typing import IO, Any

from tensorwire._children import close_and_reap
from tensorwire.testbed import errors
from tensorwire.testbed._backend import LocalBackend
from tensorwire.testbed._netns import Netns, kill, pids_in
from tensorwire.testbed._tools import helper_command, require_tool
from tensorwire.testbed.errors import TestbedError
from tensorwire.testbed.profile import LinkProfile
from tensorwire.testbed.shaping import AppliedShaping

STARTUP_TIMEOUT = 60.0  # seconds for the agent to build the namespaces and links


class HolderNamespaces:
    """Unnamed namespaces, one per node, each kept alive by a holder process (used inside the
    agent, where ``nsenter`` needs no ``--user``)."""

    def __init__(self, prefix: str, nodes: list[str]) -> None:
        self.prefix = prefix
        self.nodes = nodes
        self.holders: dict[str, subprocess.Popen[bytes]] = {}

    def create(self) -> dict[str, Netns]:
        unshare, nsenter = require_tool("unshare"), require_tool("nsenter")
        result = {}
        for node in self.nodes:
            holder = subprocess.Popen(
                [unshare, "--net", "--", "sh", "-c", "echo ready; exec cat"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
            )
            self.holders[node] = holder
            assert holder.stdout is not None
            # After "ready" the holder is in its own namespace (unshare execs in place).
            if holder.stdout.readline() != b"ready\n":
                raise TestbedError(f"could not create a network namespace for {node}")
            result[node] = Netns(
                f"{self.prefix}{node}",
                f"/proc/{holder.pid}/ns/net",
                (nsenter, "--target", str(holder.pid), "--net", "--"),
            )
        return result

    def destroy(self) -> None:
        holders = {h.pid for h in self.holders.values()}
        paths = [f"/proc/{pid}/ns/net" for pid in holders]
        kill([pid for pid in pids_in(paths) if pid not in holders])
        for holder in self.holders.values():
            close_and_reap(holder, 5)
        self.holders.clear()


def main() -> None:
    """The agent: build from the first request, then answer until ``close`` or EOF."""
    backend: LocalBackend | None = None
    holders: HolderNamespaces | None = None
    # Replies get a private copy of stdout; anything else printed goes to stderr (the log).
    replies = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    try:
        for line in sys.stdin:
            request = json.loads(line)
            op = request.pop("op")
            try:
                if op == "setup":
                    holders = HolderNamespaces(request["prefix"], request["nodes"])
                    backend = LocalBackend(
                        holders,
                        request["prefix"],
                        request["subnet"],
                        netem=request["netem"],
                        nft=request["nft"],
                        topology=request.get("topology", "star"),
                    )
                    result: Any = {
                        "holders": {node: h.pid for node, h in holders.holders.items()},
                        "addresses": {node: backend.address(node) for node in request["nodes"]},
                    }
                elif backend is None:
                    raise TestbedError(f"{op!r} before setup")
                elif op == "shape":
                    profile = LinkProfile.from_config(request["profile"])
                    devices = request.get("devices")
                    each = (
                        None if devices is None else [LinkProfile.from_config(d) for d in devices]
                    )
                    result = backend.shape(profile, request["direction"], each).to_config()
                elif op == "counters":
                    result = backend.counters()
                elif op == "proc_net":
                    result = backend.proc_net(request["node"], request["name"])
                elif op == "link":
                    backend.set_link_state(int(request["device"]), bool(request["up"]))
                    result = None
                elif op == "close":
                    break
                else:
                    raise TestbedError(f"unknown agent request {op!r}")
                reply = {"ok": True, "result": result}
            except Exception as exc:
                reply = {"ok": False, "type": type(exc).__name__, "message": str(exc)}
            replies.write(json.dumps(reply) + "\n")
            replies.flush()
    finally:
        if backend is not None:
            backend.close()
        elif holders is not None:
            holders.destroy()


class AgentBackend:
    """A testbed backend whose namespaces live in an agent's unprivileged user namespace."""

    def __init__(
        self,
        prefix: str,
        nodes: list[str],
        subnet: str,
        netem: bool,
        nft: str | None,
        topology: str = "star",
    ) -> None:
        unshare, nsenter = require_tool("unshare"), require_tool("nsenter")
        self._log: IO[bytes] = tempfile.TemporaryFile()  # noqa: SIM115 (lives as long as the agent)
        self._agent = subprocess.Popen(
            [unshare, "--user", "--map-root-user", "--", *helper_command(__name__)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
        )
        try:
            setup = self._call(
                "setup",
                prefix=prefix,
                nodes=nodes,
                subnet=subnet,
                netem=netem,
                nft=nft,
                topology=topology,
            )
        except BaseException:
            self.close()
            raise
        self._addresses: dict[str, str] = setup["addresses"]
        self.namespaces = {
            node: Netns(
                f"{prefix}{node}",
                f"/proc/{pid}/ns/net",
                (nsenter, "--target", str(pid), "--user", "--net", "--preserve-credentials", "--"),
            )
            for node, pid in setup["holders"].items()
        }

    def _call(self, op: str, **args: Any) -> Any:
        assert self._agent.stdin is not None and self._agent.stdout is not None
        try:
            self._agent.stdin.write(json.dumps({"op": op, **args}) + "\n")
            self._agent.stdin.flush()
            line = self._agent.stdout.readline()
        except BrokenPipeError:
            line = ""
        if not line:
            self._log.seek(0)
            log = self._log.read().decode(errors="replace")[-2000:]
            raise TestbedError(f"the user-namespace agent ended unexpectedly; its log:\n{log}")
        reply = json.loads(line)
        if not reply["ok"]:
            error = getattr(errors, reply["type"], None)
            if not (isinstance(error, type) and issubclass(error, TestbedError)):
                error = TestbedError
            raise error(f"{reply['message']} (in the user-namespace agent: {reply['type']})")
        return reply["result"]

    def address(self, node: str) -> str:
        return self._addresses[node]

    def shape(
        self, profile: LinkProfile, direction: str, devices: list[LinkProfile] | None = None
    ) -> AppliedShaping:
        each = None if devices is None else [d.to_config() for d in devices]
        config = self._call("shape", profile=profile.to_config(), direction=direction, devices=each)
        return AppliedShaping.from_config(config)

    def counters(self) -> dict[str, Any]:
        return self._call("counters")

    def proc_net(self, node: str, name: str) -> str:
        return self._call("proc_net", node=node, name=name)

    def set_link_state(self, device: int, up: bool) -> None:
        self._call("link", device=device, up=up)

    def close(self) -> None:
        if self._agent.poll() is None:
            assert self._agent.stdin is not None
            try:
                self._agent.stdin.write(json.dumps({"op": "close"}) + "\n")
                self._agent.stdin.close()
            except BrokenPipeError:
                pass
            try:
                self._agent.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self._agent.kill()
                self._agent.wait()
        if self._agent.stdout is not None:
            self._agent.stdout.close()
        self._log.close()
