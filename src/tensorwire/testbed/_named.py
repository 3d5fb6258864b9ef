"""Named network namespaces (``/run/netns/NAME``) for a testbed run as root, and the removal of
those a crashed run left behind.

Every name starts with the testbed's prefix (``twb-`` + run id + ``-``). A live testbed holds
an exclusive ``flock`` on ``/run/tensorwire-testbed/PREFIX.lock`` for as long as it runs; the
kernel drops the lock when the process dies, however it dies. A namespace, root-namespace veth
or nftables table whose prefix has no held lock is stale and is removed, processes and all:
by the next testbed that opens, and, when the owner was killed, at once by a process that
waits for its death (:func:`sweep_when_free`, started by ``create``).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from pyroute2 import IPRoute, netns

from tensorwire._lifeline import AfterDeath
from tensorwire.testbed._netns import BASE_PREFIX, Netns, kill, pids_in
from tensorwire.testbed._tools import find_tool, require_tool
from tensorwire.testbed.errors import TestbedError

LOCK_DIR = Path("/run/tensorwire-testbed")
NETNS_DIR = "/run/netns"


def prefix_of(name: str) -> str | None:
    """The testbed prefix of an object name (up to its last ``-``), if it has the base prefix."""
    if not name.startswith(BASE_PREFIX) or "-" not in name[len(BASE_PREFIX) :]:
        return None
    return name[: name.rindex("-") + 1]


class NamedNamespaces:
    """The named namespaces ``PREFIXnode`` of one testbed; ``create`` takes the prefix's lock
    first, ``destroy`` kills what runs inside, removes them and releases the lock."""

    def __init__(self, prefix: str, nodes: list[str]) -> None:
        self.prefix = prefix
        self.nodes = nodes
        self._lock: int | None = None
        self._created: list[str] = []
        self._sweeper: AfterDeath | None = None

    def create(self) -> dict[str, Netns]:
        """Create the namespaces; :class:`TestbedError` if the prefix belongs to a live testbed."""
        ip = require_tool("ip")
        self._lock = _take_lock(self.prefix)
        if self._lock is None:
            raise TestbedError(f"prefix {self.prefix!r} is in use by a running testbed")
        # killed before destroy: the lock drops, and this sweeps what it made (and any stale)
        sweep = f"import tensorwire.testbed._named as n; n.sweep_when_free({self.prefix!r})"
        self._sweeper = AfterDeath([sys.executable, "-c", sweep])
        result = {}
        for node in self.nodes:
            name = f"{self.prefix}{node}"
            if name in netns.listnetns():
                raise TestbedError(f"namespace {name} exists already")
            netns.create(name)
            self._created.append(name)
            result[node] = Netns(name, f"{NETNS_DIR}/{name}", (ip, "netns", "exec", name))
        return result

    def destroy(self) -> None:
        """Kill every process left in the namespaces, remove them, release the lock."""
        _remove_namespaces(self._created)
        self._created.clear()
        if self._lock is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(_lock_path(self.prefix))
            os.close(self._lock)
            self._lock = None
        if self._sweeper is not None:
            self._sweeper.stop()
            self._sweeper = None


def remove_stale() -> list[str]:
    """Remove namespaces, root-namespace links and nftables tables with the base prefix whose
    testbed is gone (its lock is not held); return the names removed."""
    removed: list[str] = []
    stale: dict[str, int | None] = {}  # prefix -> its lock fd while we hold it

    def is_stale(name: str) -> bool:
        prefix = prefix_of(name)
        if prefix is None:
            return False
        if prefix not in stale:
            stale[prefix] = _take_lock(prefix)
        return stale[prefix] is not None

    try:
        names = [n for n in netns.listnetns() if is_stale(n)]
        _remove_namespaces(names)
        removed += names
        with IPRoute() as ipr:
            for link in ipr.get_links():
                ifname = link.get_attr("IFLA_IFNAME")
                if is_stale(ifname):
                    with contextlib.suppress(Exception):
                        ipr.link("del", index=link["index"])
                        removed.append(ifname)
        removed += _remove_stale_tables(is_stale)
    finally:
        for prefix, fd in stale.items():
            if fd is not None:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(_lock_path(prefix))
                os.close(fd)
    if LOCK_DIR.is_dir():
        for lock in LOCK_DIR.glob(f"{BASE_PREFIX}*.lock"):
            fd = _take_lock(lock.name.removesuffix(".lock"))
            if fd is not None:
                lock.unlink(missing_ok=True)
                os.close(fd)
    return removed


def _remove_stale_tables(is_stale: Callable[[str], bool]) -> list[str]:
    nft = find_tool("nft")
    if nft is None:
        return []
    listing = subprocess.run(
        [nft, "-j", "list", "tables"], capture_output=True, text=True, timeout=30, check=False
    )
    if listing.returncode != 0:
        return []
    removed = []
    for item in json.loads(listing.stdout).get("nftables", []):
        table = item.get("table")
        if table and is_stale(table["name"]):
            subprocess.run(
                [nft, "delete", "table", table["family"], table["name"]],
                capture_output=True,
                timeout=30,
                check=False,
            )
            removed.append(table["name"])
    return removed


def _remove_namespaces(names: list[str]) -> None:
    if not names:
        return
    kill(pids_in(f"{NETNS_DIR}/{name}" for name in names))
    for name in names:
        with contextlib.suppress(FileNotFoundError):
            netns.remove(name)


def _lock_path(prefix: str) -> Path:
    return LOCK_DIR / f"{prefix}.lock"


def _take_lock(prefix: str) -> int | None:
    """The fd of ``prefix``'s lock file, exclusively locked; None if a live process holds it."""
    LOCK_DIR.mkdir(parents=True, exist_ok=True)
    fd = os.open(_lock_path(prefix), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd


def sweep_when_free(prefix: str, wait: float = 10.0) -> list[str]:
    """:func:`remove_stale`, once ``prefix``'s lock is free: what runs after a testbed's owner
    was killed (the end of file that starts it may come while the dying owner still closes
    its files, the lock's among them)."""
    deadline = time.monotonic() + wait
    while (fd := _take_lock(prefix)) is None and time.monotonic() < deadline:
        time.sleep(0.05)
    if fd is not None:
        os.close(fd)
    return remove_stale()
