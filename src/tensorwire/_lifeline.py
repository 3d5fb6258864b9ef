"""A lifeline from a process to the programs it starts: they end when it dies, however it dies.

A testbed stops what it started when it closes, and on SIGTERM or SIGHUP; a SIGKILL (the OOM
killer, a CI job's time limit, ``kill -9``) gives it no chance, and an FL server and its
devices would go on training in their namespaces until their own timeouts. So the starting
process holds the write end of a pipe that nobody else inherits, and passes the read end to
each child (:func:`child_options`); a child that calls :func:`watch_parent` (every
``tensorwire`` command does) reads it on a daemon thread. The parent never writes: the read
returns end-of-file when the last write end closes, which the kernel does when the parent
dies, and the child then sends itself SIGTERM (its own clean-up runs, as for any SIGTERM).

Programs that cannot watch it (a private broker) get a :class:`Reaper`: a small process that
watches it for them and ends them. What no process of ours holds (a testbed's named network
namespaces) gets an :class:`AfterDeath`: a small process that runs a clean-up command once
this process is gone.

Standard library only: every ``tensorwire`` command imports it, and a testbed.
"""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import threading
from collections.abc import Mapping
from typing import Any

ENV = "TENSORWIRE_LIFELINE_FD"

_lock = threading.Lock()
_ends: tuple[int, int] | None = None  # this process's lifeline for its children: read, write


def _read_end() -> int:
    """The read end of this process's lifeline, made on first use (both ends are
    non-inheritable: a child gets the read end only through ``pass_fds``)."""
    global _ends
    with _lock:
        if _ends is None:
            _ends = os.pipe()  # never closed: the write end closes when this process dies
        return _ends[0]


def child_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """``subprocess.Popen`` keywords ``options`` plus the lifeline: the read end passed to
    the child and its number in the child's environment (``env``, or this process's)."""
    fd = _read_end()
    env = dict(os.environ if options.get("env") is None else options["env"])
    env[ENV] = str(fd)
    return {**options, "env": env, "pass_fds": (*options.get("pass_fds", ()), fd)}


def watch_parent() -> bool:
    """If this process was started with a lifeline, end it (SIGTERM to itself) when the
    process that started it dies; True if it was. The variable is removed from the
    environment and the descriptor made non-inheritable: this process's own children do not
    hold it."""
    value = os.environ.pop(ENV, None)
    if value is None:
        return False
    try:
        fd = int(value)
        if not stat.S_ISFIFO(os.fstat(fd).st_mode):
            return False
        os.set_inheritable(fd, False)
    except (ValueError, OSError):  # not a descriptor we were given: nothing to watch
        return False

    def wait() -> None:
        try:
            while os.read(fd, 64):  # nobody writes: only end-of-file comes
                pass
        except OSError:
            pass
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=wait, name="tensorwire-lifeline", daemon=True).start()
    return True


# A reaper: the lifeline's other use, for programs that cannot watch it themselves (brokers).
# It holds a pidfd of its target, opened by the parent while the target could not have been
# reaped yet, so a signal can never reach another process that got the same pid later.
_REAPER = """
import os, select, shutil, signal, sys, time
lifeline, pidfd, pid, group = map(int, sys.argv[1:5])
remove = sys.argv[5:]
try:
    while os.read(lifeline, 64):
        pass
except OSError:
    pass
def alive():
    return not select.select([pidfd], [], [], 0)[0]
for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 0.0)):
    if not alive():
        break
    try:
        if group:
            os.killpg(pid, sig)
        else:
            signal.pidfd_send_signal(pidfd, sig)
    except OSError:
        break
    end = time.monotonic() + wait
    while alive() and time.monotonic() < end:
        time.sleep(0.05)
for path in remove:
    shutil.rmtree(path, ignore_errors=True)
"""


class _Watcher:
    """A small process (``python -I -S``: no site packages to import) running ``code`` with
    ``args``; it holds the lifeline and ``fds``, and acts when the lifeline ends."""

    _helper: subprocess.Popen[bytes] | None = None

    def _start(self, code: str, args: list[str], fds: tuple[int, ...] = ()) -> None:
        lifeline = _read_end()
        self._helper = subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", code, str(lifeline), *args],
            pass_fds=(lifeline, *fds),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # a Ctrl-C to our terminal leaves it be: we clean up
        )

    @property
    def active(self) -> bool:
        return self._helper is not None and self._helper.poll() is None

    def stop(self) -> None:
        """End the watcher without letting it act (this process cleaned up itself)."""
        if self._helper is not None:
            self._helper.kill()
            self._helper.wait()
            self._helper = None


class Reaper(_Watcher):
    """A small process that ends ``proc`` (SIGTERM, SIGKILL after 5 s) if this process dies
    without doing so, then removes the directory ``remove`` (its data): for programs that
    cannot watch a lifeline (a private broker). With ``group`` its whole process group
    (``proc`` must lead one: ``start_new_session``). :meth:`stop` it once ``proc`` is
    stopped. Where pidfds are missing (Linux < 5.3) there is no reaper, and :attr:`active` is
    False."""

    def __init__(
        self,
        proc: subprocess.Popen[Any],
        *,
        group: bool = False,
        remove: str | os.PathLike[str] | None = None,
    ) -> None:
        try:
            pidfd = os.pidfd_open(proc.pid)
        except (AttributeError, OSError):  # no pidfds here, or proc already reaped
            return
        try:
            args = [str(pidfd), str(proc.pid), "1" if group else "0"]
            self._start(_REAPER, args + ([] if remove is None else [os.fspath(remove)]), (pidfd,))
        finally:
            os.close(pidfd)


_AFTER_DEATH = """
import os, sys
try:
    while os.read(int(sys.argv[1]), 64):
        pass
except OSError:
    pass
os.execv(sys.argv[2], sys.argv[2:])
"""


class AfterDeath(_Watcher):
    """A small process that runs ``argv`` (``argv[0]`` a path) if this process dies before
    calling :meth:`stop`: the clean-up of what outlives a SIGKILLed owner and no process of
    its own holds (a testbed's named namespaces). It waits on the lifeline, so it costs
    nothing while this process lives."""

    def __init__(self, argv: list[str]) -> None:
        self._start(_AFTER_DEATH, argv)
