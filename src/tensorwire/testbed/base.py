"""What every testbed kind shares: nodes, processes started in them, and stopping those."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Sequence
from typing import Any

from tensorwire._lifeline import child_options
from tensorwire.testbed import _cleanup
from tensorwire.testbed.capabilities import Capabilities, probe_capabilities
from tensorwire.testbed.counters import Counters
from tensorwire.testbed.errors import TestbedError
from tensorwire.testbed.profile import LinkProfile
from tensorwire.testbed.shaping import AppliedShaping

SERVER = "srv"
STOP_GRACE = 3.0  # seconds a process gets to end after SIGTERM before SIGKILL


class BaseTestbed:
    """A server node ``srv`` and device nodes ``dev1`` ... ``devN``; a context manager.

    Subclasses say where a node's processes run (:meth:`_enter`), what its address is, and
    how links are shaped and counted."""

    shaped: bool = False  # whether the links are really shaped
    __test__ = False  # not a pytest test class, despite the name

    def __init__(self, devices: int) -> None:
        if not 1 <= devices <= 999:
            raise ValueError(f"devices must be 1..999, not {devices}")
        self.devices = devices
        self._processes: list[subprocess.Popen[Any]] = []
        self._open = False

    # --- lifetime -------------------------------------------------------------------------

    def open(self) -> BaseTestbed:
        """Build the testbed (the ``with`` statement calls this)."""
        if self._open:
            raise TestbedError("the testbed is open already")
        _cleanup.register(self)
        self._open = True
        return self

    def close(self) -> None:
        """Stop every process started with :meth:`popen` and remove what was built."""
        self.stop_processes()
        self._open = False
        _cleanup.unregister(self)

    def __enter__(self) -> Any:
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- nodes ----------------------------------------------------------------------------

    @property
    def nodes(self) -> list[str]:
        """``["srv", "dev1", ..., "devN"]``."""
        return [SERVER, *self.device_nodes]

    @property
    def device_nodes(self) -> list[str]:
        """``["dev1", ..., "devN"]``."""
        return [f"dev{i}" for i in range(1, self.devices + 1)]

    def node(self, name: str) -> str:
        """The node called ``name`` (``srv``, ``devI``, or a namespace name ending in one)."""
        for node in self.nodes:
            if name in (node, self._namespace_name(node)):
                return node
        raise TestbedError(f"no node {name!r}; nodes are {', '.join(self.nodes)}")

    @property
    def server_address(self) -> str:
        """The address every device reaches the server at."""
        return self.address(SERVER)

    def url(self, scheme: str, port: int, path: str = "") -> str:
        """``scheme://server_address:port/path``, the URL a device connects to."""
        return f"{scheme}://{self.server_address}:{port}/{path.lstrip('/')}".rstrip("/")

    def address(self, node: str) -> str:
        """The IPv4 address of ``node``."""
        raise NotImplementedError

    def _namespace_name(self, node: str) -> str | None:
        return None

    def _enter(self, node: str) -> tuple[str, ...]:
        """The argv prefix that runs a program inside ``node``."""
        raise NotImplementedError

    # --- processes ------------------------------------------------------------------------

    def command(self, node: str, argv: Sequence[str]) -> list[str]:
        """The argv that runs ``argv`` inside ``node``, for code that starts its own process
        (it must then stop it itself; :meth:`popen` does that for you)."""
        if not self._open:
            raise TestbedError("the testbed is not open; use it in a with block")
        return [*self._enter(self.node(node)), *argv]

    def popen(self, node: str, argv: Sequence[str], **kw: Any) -> subprocess.Popen[Any]:
        """Start ``argv`` as a separate process inside ``node`` (keywords go to Popen).

        The process gets its own session (so its children can be signalled together) and is
        stopped when the testbed closes, if it has not ended by then. It also gets this
        process's lifeline (:mod:`tensorwire._lifeline`): a ``tensorwire`` command ends by
        itself if this process dies without closing the testbed (SIGKILL)."""
        kw.setdefault("start_new_session", True)
        proc = subprocess.Popen(self.command(node, argv), **child_options(kw))
        self._processes.append(proc)
        return proc

    def stop_processes(self) -> None:
        """Stop every process started with :meth:`popen` that still runs."""
        stop_all(self._processes)
        self._processes.clear()

    def wait_listening(
        self, node: str, port: int, timeout: float = 10.0, protocol: str = "tcp"
    ) -> None:
        """Wait until a socket in ``node`` listens on TCP ``port`` (or is bound to UDP ``port``
        if ``protocol`` is ``"udp"``); :class:`TestbedError` after ``timeout`` seconds."""
        if protocol not in ("tcp", "udp"):
            raise ValueError(f"protocol must be tcp or udp, not {protocol!r}")
        deadline = time.monotonic() + timeout
        # Polled: a starting server gives no other signal than its listening socket.
        while not self._listening(self.node(node), port, protocol):
            if time.monotonic() > deadline:
                raise TestbedError(f"nothing listens on {protocol} port {port} in {node}")
            time.sleep(0.05)

    def _listening(self, node: str, port: int, protocol: str) -> bool:
        text = self._proc_net(node, protocol) + self._proc_net(node, protocol + "6")
        state = "0A" if protocol == "tcp" else "07"  # TCP_LISTEN; TCP_CLOSE, a bound UDP socket
        return any(
            len(fields) > 3 and fields[3] == state and int(fields[1].rsplit(":", 1)[1], 16) == port
            for fields in (line.split() for line in text.splitlines()[1:])
        )

    def _proc_net(self, node: str, name: str) -> str:
        raise NotImplementedError

    # --- links ----------------------------------------------------------------------------

    @property
    def label(self) -> str:
        """What every output of this testbed is labelled with."""
        raise NotImplementedError

    @property
    def shaping(self) -> AppliedShaping:
        """How the links are shaped now, with notes on what could not be applied."""
        raise NotImplementedError

    @property
    def profile(self) -> LinkProfile:
        """The profile the links have now."""
        return self.shaping.profile

    def set_profile(
        self,
        profile: LinkProfile | str,
        direction: str | None = None,
        *,
        links: Sequence[LinkProfile | str] | None = None,
    ) -> None:
        """Shape every device link with ``profile`` from now on (between experiments); each
        device's own link with its profile of ``links`` where given."""
        raise NotImplementedError

    def counters(self) -> Counters:
        """Read the TCP and link counters now; subtract two readings for a round's share."""
        raise NotImplementedError

    def set_link_state(self, device: int, up: bool) -> None:
        """Take device ``device``'s (1-based) link down (``up=False``) or bring it up: its
        packets go nowhere meanwhile, as when a phone loses its network. Where there are no
        links (loopback), :class:`TestbedError`."""
        raise TestbedError(f"{self.label}: no links to take down")

    @staticmethod
    def capabilities() -> Capabilities:
        """What this kernel and user allow (probed once per process)."""
        return probe_capabilities()


def stop_all(processes: list[subprocess.Popen[Any]], grace: float = STOP_GRACE) -> None:
    """SIGTERM each running process's session (or the process), SIGKILL after ``grace`` s."""
    running = [p for p in processes if p.poll() is None]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for proc in running:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                try:
                    os.killpg(proc.pid, sig)
                except ProcessLookupError:
                    proc.send_signal(sig)
        deadline = time.monotonic() + grace
        for proc in running:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        running = [p for p in running if p.poll() is None]
        if not running:
            return
