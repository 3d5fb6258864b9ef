"""What this kernel and this user allow a testbed to do, each with a human-readable reason.

The kernel parts are probed, not guessed: a throw-away process in a fresh network namespace
(``unshare --net``, or ``unshare --user --map-root-user --net`` without privileges) tries a
veth, a bridge, tbf, htb, netem and nftables, and the namespace vanishes when it exits.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import subprocess
from pathlib import Path
from typing import Any

from tensorwire.testbed._tools import PACKAGES, find_tool, helper_command

CAP_NET_ADMIN = 12
CAP_SYS_ADMIN = 21
_PROBES = ("veth", "bridge", "tbf", "htb", "netem", "nft", "nft_netdev")
_USERNS_SYSCTLS = (  # any of these at 0 (1 for apparmor) stops unprivileged user namespaces
    "/proc/sys/kernel/unprivileged_userns_clone",
    "/proc/sys/user/max_user_namespaces",
    "/proc/sys/kernel/apparmor_restrict_unprivileged_userns",
)


@dataclasses.dataclass(frozen=True)
class Capability:
    """Whether one thing is ``available`` here, and why (or why not)."""

    available: bool
    reason: str


@dataclasses.dataclass(frozen=True)
class Capabilities:
    """What a testbed can do here: ``items`` maps root, userns, netns, veth, bridge, tbf, htb,
    netem, nft, nft_netdev and ``tool:NAME`` to a :class:`Capability`."""

    items: dict[str, Capability]

    def __getitem__(self, name: str) -> Capability:
        return self.items[name]

    def has(self, name: str) -> bool:
        """Whether ``name`` is available (False for names never probed)."""
        item = self.items.get(name)
        return item is not None and item.available

    @property
    def mode(self) -> str | None:
        """How a :class:`Testbed` would be built: ``root`` (named namespaces), ``userns`` (an
        unprivileged user namespace) or None (only :class:`LoopbackTestbed` works)."""
        if not self.has("netns"):
            return None
        return "root" if self.has("root") else "userns"

    @property
    def loss_by(self) -> str | None:
        """How loss is made: ``netem``, ``nftables`` or None (not possible)."""
        if self.has("netem"):
            return "netem"
        return "nftables" if self.has("nft_netdev") else None

    def report(self) -> str:
        """One line per item: ``yes``/``no``, the name and the reason."""
        return "\n".join(
            f"{'yes' if c.available else 'no ':3}  {name:12} {c.reason}"
            for name, c in self.items.items()
        )

    def to_config(self) -> dict[str, Any]:
        """A JSON-serialisable dict: name -> {available, reason}."""
        return {name: dataclasses.asdict(c) for name, c in self.items.items()}


_CACHE: Capabilities | None = None


def probe_capabilities(refresh: bool = False) -> Capabilities:
    """Probe (once per process unless ``refresh``) what this kernel and user allow."""
    global _CACHE
    if _CACHE is None or refresh:
        _CACHE = _probe()
    return _CACHE


def is_privileged() -> bool:
    """Whether this process has CAP_NET_ADMIN and CAP_SYS_ADMIN in the initial namespaces."""
    status = Path("/proc/self/status").read_text()
    effective = int(
        next(line.split()[1] for line in status.splitlines() if line.startswith("CapEff:")), 16
    )
    wanted = (1 << CAP_NET_ADMIN) | (1 << CAP_SYS_ADMIN)
    return effective & wanted == wanted and _in_initial_user_namespace()


def _in_initial_user_namespace() -> bool:
    try:
        return Path("/proc/self/uid_map").read_text().split() == ["0", "0", "4294967295"]
    except OSError:
        return False


def _probe() -> Capabilities:
    items: dict[str, Capability] = {}
    for tool, package in PACKAGES.items():
        path = find_tool(tool)
        items[f"tool:{tool}"] = Capability(
            path is not None,
            f"found at {path}" if path else f"missing: apt-get install -y {package}",
        )
    privileged = is_privileged()
    items["root"] = Capability(
        privileged,
        "running with CAP_NET_ADMIN and CAP_SYS_ADMIN: named namespaces in /run/netns"
        if privileged
        else f"running as uid {os.geteuid()} without CAP_NET_ADMIN/CAP_SYS_ADMIN: "
        "an unprivileged user namespace is needed",
    )
    if importlib.util.find_spec("pyroute2") is None:
        items["netns"] = Capability(
            False, "pyroute2 is not installed: pip install 'tensorwire[bench]'"
        )
        return Capabilities(items)
    unshare = find_tool("unshare")
    if unshare is None:
        items["netns"] = Capability(
            False, "the unshare program is missing: apt-get install -y util-linux"
        )
        return Capabilities(items)
    flags = ["--net"] if privileged else ["--user", "--map-root-user", "--net"]
    probe = subprocess.run(
        [unshare, *flags, "--", *helper_command("tensorwire.testbed._probe")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if not privileged:
        items["userns"] = Capability(
            probe.returncode == 0,
            "unprivileged user namespaces work: the testbed runs in one"
            if probe.returncode == 0
            else f"unprivileged user namespaces are not allowed ({probe.stderr.strip()}"
            f"{_userns_settings()})",
        )
    if probe.returncode != 0:
        items["netns"] = Capability(
            False,
            f"cannot create a network namespace: {probe.stderr.strip() or probe.returncode}; "
            "run as root, or allow user namespaces, or use LoopbackTestbed (unshaped loopback)",
        )
        return Capabilities(items)
    items["netns"] = Capability(True, "network namespaces can be created")
    for name, (available, reason) in json.loads(probe.stdout).items():
        items[name] = Capability(available, reason)
    for name in _PROBES:
        items.setdefault(name, Capability(False, "not probed: needs a veth pair"))
    return Capabilities(items)


def _userns_settings() -> str:
    settings = []
    for path in _USERNS_SYSCTLS:
        try:
            settings.append(f"{path.removeprefix('/proc/sys/')}={Path(path).read_text().strip()}")
        except OSError:
            continue
    return "; " + ", ".join(settings) if settings else ""
