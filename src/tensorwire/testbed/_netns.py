"""A reference to one network namespace, and running a function inside one.

A function runs inside a namespace in a fresh thread that joins it with ``setns(2)``: a network
namespace is per thread, so the rest of the process stays where it is, and files under
``/proc/thread-self/net`` and ``/proc/sys/net`` then show that namespace's view.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import os
import signal
import threading
import time
from collections.abc import Callable, Iterable
from typing import TypeVar

BASE_PREFIX = "twb-"  # every namespace, link and table of a testbed starts with it
CLONE_NEWNET = 0x40000000
T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class Netns:
    """A network namespace: its ``name`` (carrying the testbed prefix), the ``path`` of a file
    that refers to it (``/run/netns/NAME`` or ``/proc/PID/ns/net``) and ``enter``, the argv
    prefix that runs a program inside it."""

    name: str
    path: str
    enter: tuple[str, ...]


def call_in_netns(path: str, fn: Callable[[], T]) -> T:
    """``fn()`` run in a new thread inside the namespace that ``path`` refers to."""
    result: list[T] = []
    error: list[BaseException] = []

    def run() -> None:
        try:
            fd = os.open(path, os.O_RDONLY)
            try:
                if _libc().setns(fd, CLONE_NEWNET) != 0:
                    err = ctypes.get_errno()
                    raise OSError(err, f"setns into {path}: {os.strerror(err)}")
            finally:
                os.close(fd)
            result.append(fn())
        except BaseException as exc:  # handed to the caller's thread
            error.append(exc)

    thread = threading.Thread(target=run, name="tensorwire-netns", daemon=True)
    thread.start()
    thread.join()
    if error:
        raise error[0]
    return result[0]


def read_proc_net(path: str, name: str) -> str:
    """The text of ``/proc/net/<name>`` (e.g. ``snmp``, ``tcp``) as namespace ``path`` sees it."""

    def read() -> str:
        with open(f"/proc/thread-self/net/{name}") as f:
            return f.read()

    return call_in_netns(path, read)


def write_sysctls(path: str, values: dict[str, str]) -> None:
    """Write ``/proc/sys`` entries (``net.ipv6.conf.all.disable_ipv6`` style) in a namespace."""

    def write() -> None:
        for key, value in values.items():
            with open("/proc/sys/" + key.replace(".", "/"), "w") as f:
                f.write(value)

    call_in_netns(path, write)


def pids_in(paths: Iterable[str]) -> list[int]:
    """The processes (not this one) whose network namespace is one of those ``paths`` name."""
    wanted = set()
    for path in paths:
        with contextlib.suppress(OSError):
            st = os.stat(path)
            wanted.add((st.st_dev, st.st_ino))
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            st = os.stat(f"/proc/{entry.name}/ns/net")
        except OSError:  # gone, or not ours to look at
            continue
        if (st.st_dev, st.st_ino) in wanted:
            found.append(int(entry.name))
    return found


def kill(pids: list[int], grace: float = 1.0) -> None:
    """SIGTERM ``pids``, then SIGKILL those still alive after ``grace`` seconds."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        deadline = time.monotonic() + grace
        while pids and time.monotonic() < deadline:
            pids = [pid for pid in pids if _alive(pid)]
            time.sleep(0.02)
        if not pids:
            return


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


_LIBC: ctypes.CDLL | None = None


def _libc() -> ctypes.CDLL:
    global _LIBC
    if _LIBC is None:
        _LIBC = ctypes.CDLL(None, use_errno=True)
    return _LIBC
