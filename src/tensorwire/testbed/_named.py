"""Named network namespaces (``/run/netns/NAME``) for a testbed run as root, and the removal of
those a crashed run left behind.

Every name starts with the testbed's prefix (``twb-`` + run id + ``-``). A live testbed holds
an exclusive ``flock`` on ``/run/tensorwire-testbed/PREFIX.lock`` for as long as it runs; the
kernel drops the lock when the process dies, however it dies. A namespace, root-namespace veth
or nftables table whose prefix has no held lock is stale and is removed, processes and all:
by the next testbed that opens, and, when the owner was killed, at once by a process that
waits for its death (:func:`sweep_when_free`, started by ``create``).

A held lock must mean a live testbed, so sweeps run one at a time, under
``/run/tensorwire-testbed/sweep.lock``, and so does a testbed taking its own lock: a sweep
never sees another sweep's hold on a dead testbed's lock (which it would take for a live
testbed's, and leave that testbed's leftovers and lock file for later), nor a new testbed's
lock file before it is locked (which it would take for a dead one's and remove). A sweep
never creates a lock file: one that is gone was removed by its owner or an earlier sweep.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from pyroute2 import IPRoute, netns

from tensorwire._lifeline import AfterDeath
from tensorwire.testbed._netns import BASE_PREFIX, Netns, kill, pids_in
from tensorwire.testbed._tools import find_tool, require_tool
from tensorwire.testbed.errors import TestbedError

LOCK_DIR = Path("/run/tensorwire-testbed")
SWEEP_LOCK = LOCK_DIR / "sweep.lock"  # never removed; not a testbed's (no BASE_PREFIX)
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
        with _sweeping():
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
    testbed is gone (its lock is not held); return the names removed. Waits for a sweep in
    progress in another process."""
    with _sweeping():
        return _remove_stale_now()


def _remove_stale_now() -> list[str]:
    """:func:`remove_stale`'s work, for a caller that holds the sweep lock."""
    removed: list[str] = []
    stale: dict[str, tuple[bool, int | None]] = {}  # prefix -> gone?, its lock fd if we hold it

    def is_stale(name: str) -> bool:
        prefix = prefix_of(name)
        if prefix is None:
            return False
        if prefix not in stale:
            stale[prefix] = _lock_of_dead(prefix)
        return stale[prefix][0]

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
        for prefix, (_, fd) in stale.items():
            if fd is not None:
                _remove_lock(prefix, fd)
    if LOCK_DIR.is_dir():
        for lock in LOCK_DIR.glob(f"{BASE_PREFIX}*.lock"):
            prefix = lock.name.removesuffix(".lock")
            if (fd := _lock_of_dead(prefix)[1]) is not None:
                _remove_lock(prefix, fd)
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


@contextlib.contextmanager
def _sweeping() -> Iterator[None]:
    """Hold the sweep lock: one sweep (or one testbed taking its lock) at a time, machine-wide."""
    LOCK_DIR.mkdir(parents=True, exist_ok=True)
    fd = os.open(SWEEP_LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # a sweep's steps are bounded: nft and ip time out
        yield
    finally:
        os.close(fd)


def _take_lock(prefix: str) -> int | None:
    """The fd of ``prefix``'s lock file, made and exclusively locked, with this process's pid
    in it; None if a live process holds it. Called with the sweep lock held."""
    fd = os.open(_lock_path(prefix), os.O_RDWR | os.O_CREAT, 0o644)
    if not _flock(fd):
        os.close(fd)
        return None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd


def _lock_of_dead(prefix: str) -> tuple[bool, int | None]:
    """Whether ``prefix``'s testbed is gone, and the fd of its lock file, locked, if the file
    is still there. Never creates the file: with none, or one unlinked while we locked it,
    its owner or an earlier sweep removed it. Called with the sweep lock held."""
    path = _lock_path(prefix)
    try:
        fd = os.open(path, os.O_RDWR)
    except FileNotFoundError:
        return True, None
    if not _flock(fd):
        os.close(fd)
        return False, None
    try:
        here = os.stat(path).st_ino == os.fstat(fd).st_ino
    except FileNotFoundError:
        here = False
    if not here:
        os.close(fd)
        return True, None
    return True, fd


def _flock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _remove_lock(prefix: str, fd: int) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(_lock_path(prefix))
    os.close(fd)


def sweep_when_free(prefix: str, wait: float = 10.0) -> list[str]:
    """:func:`remove_stale`, once ``prefix``'s lock is free: what runs after a testbed's owner
    was killed (the end of file that starts it may come while the dying owner still closes
    its files, the lock's among them)."""
    deadline = time.monotonic() + wait
    while True:
        with _sweeping():
            gone, fd = _lock_of_dead(prefix)
            if fd is not None:
                os.close(fd)  # the sweep takes it again, under the same sweep lock
            if gone or time.monotonic() >= deadline:
                return _remove_stale_now()
        time.sleep(0.05)
