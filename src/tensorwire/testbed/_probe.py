"""Run inside a fresh, throw-away network namespace: try what a testbed needs, print JSON.

``capabilities`` runs ``main`` under ``unshare --net`` (as root) or ``unshare --user
--map-root-user --net`` (unprivileged); the namespace and all it holds vanish when it exits.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from functools import partial

from pyroute2 import IPRoute

from tensorwire.testbed._tools import find_tool
from tensorwire.testbed.shaping import nft_loss_script

REASONS = {
    "veth": ("veth pairs can be created", "cannot create a veth pair"),
    "bridge": ("bridges can be created", "cannot create a bridge"),
    "tbf": ("tbf qdisc available: rate shaping works", "no tbf qdisc: rate cannot be shaped"),
    "htb": ("htb qdisc available", "no htb qdisc"),
    "netem": (
        "netem qdisc available: delay, jitter and loss via netem",
        "no netem qdisc (sch_netem): delay and jitter are not applied, loss uses nftables",
    ),
    "nft": ("nftables works in a namespace", "nftables does not work here"),
    "nft_netdev": (
        "nftables netdev ingress hook with numgen works: loss without netem",
        "nftables netdev ingress / numgen unavailable: no loss without netem",
    ),
}


def main() -> None:
    results: dict[str, tuple[bool, str]] = {}
    with IPRoute() as ipr:

        def attempt(name: str, action: Callable[[], object]) -> bool:
            ok_text, fail_text = REASONS[name]
            try:
                action()
            except Exception as exc:
                results[name] = (False, f"{fail_text} ({exc})")
                return False
            results[name] = (True, ok_text)
            return True

        veth = attempt(
            "veth",
            lambda: ipr.link("add", ifname="twprobe0", kind="veth", peer={"ifname": "twprobe1"}),
        )
        attempt("bridge", lambda: ipr.link("add", ifname="twprobebr", kind="bridge"))
        if veth:
            index = ipr.link_lookup(ifname="twprobe0")[0]
            ipr.link("set", index=index, state="up")
            for kind, params in (
                ("tbf", {"rate": 125000, "burst": 8192, "limit": 20000}),
                ("htb", {"default": 1}),
                ("netem", {"delay": 1000}),
            ):
                if attempt(kind, partial(ipr.tc, "add", kind, index=index, handle="1:", **params)):
                    ipr.tc("del", index=index, root=True)
            nft = find_tool("nft")
            if nft is None:
                results["nft"] = (False, "the nft program is missing: apt-get install -y nftables")
                results["nft_netdev"] = (False, "needs the nft program")
            else:
                attempt("nft", lambda: _nft(nft, "table inet twprobe\ndelete table inet twprobe\n"))
                attempt(
                    "nft_netdev", lambda: _nft(nft, nft_loss_script("twprobe", ["twprobe0"], 0.1))
                )
    json.dump(results, sys.stdout)


def _nft(nft: str, script: str) -> None:
    done = subprocess.run(
        [nft, "-f", "-"], input=script, capture_output=True, text=True, timeout=30, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(done.stderr.strip())
