"""Stressors bounded in time: CPU load (stress-ng) and network load (iperf3) in testbed nodes.

Every stressor process runs under coreutils ``timeout``, so it ends by itself at its limit
even if this process dies; the handle also stops it at the limit (plus a grace) and on
:meth:`Stressor.stop`, and the testbed stops it when it closes.
"""

from __future__ import annotations

import contextlib
import json
import math
import subprocess
import tempfile
import threading
import time
from collections.abc import Sequence
from typing import IO, Any

from tensorwire.testbed._tools import require_tool
from tensorwire.testbed.base import SERVER, BaseTestbed, stop_all

GRACE = 3.0  # seconds past the limit before a stressor is killed
IPERF3_PORT = 5201  # device i's flows go to port IPERF3_PORT + i


class Stressor:
    """Running stressor processes that end by ``deadline`` (time.monotonic seconds); a context
    manager that stops them on exit."""

    def __init__(
        self,
        kind: str,
        processes: list[subprocess.Popen[Any]],
        seconds: float,
        outputs: dict[str, IO[bytes]] | None = None,
    ) -> None:
        self.kind = kind
        self.processes = processes
        self.seconds = seconds
        self.deadline = time.monotonic() + seconds
        self._outputs = outputs or {}
        self._texts: dict[str, bytes] = {}  # outputs, read when stopped
        self._stopping = threading.Lock()
        self._timer = threading.Timer(seconds + GRACE, self.stop)
        self._timer.daemon = True
        self._timer.start()

    @property
    def running(self) -> bool:
        """Whether any of the processes still runs."""
        return any(p.poll() is None for p in self.processes)

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until all processes end (at most ``timeout`` s, default until the limit plus
        grace); return whether they did."""
        if timeout is None:
            timeout = max(0.0, self.deadline + GRACE - time.monotonic())
        end = time.monotonic() + timeout
        for proc in self.processes:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.0, end - time.monotonic()))
        return not self.running

    def stop(self) -> None:
        """Stop every process now (SIGTERM to its session, SIGKILL after a grace)."""
        self._timer.cancel()
        with self._stopping:  # the timer thread may be stopping it too
            stop_all(self.processes, grace=GRACE)
            for node, output in self._outputs.items():
                if not output.closed:
                    output.seek(0)
                    self._texts[node] = output.read()
                    output.close()

    def __enter__(self) -> Stressor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def results(self) -> dict[str, dict[str, Any]]:
        """For network stress, after the clients ended: per device node, the iperf3 client's
        ``end`` summary (``sum_received.bits_per_second`` ...); {} for CPU stress."""
        self.wait()
        self.stop()
        results = {}
        for node, text in self._texts.items():
            with contextlib.suppress(ValueError):
                results[node] = json.loads(text or b"{}").get("end", {})
        return results


def _bounded(seconds: float, argv: Sequence[str]) -> list[str]:
    """``argv`` under coreutils timeout: SIGTERM at ``seconds`` (rounded up), SIGKILL 2 s on."""
    limit = max(1, math.ceil(seconds))
    return [require_tool("timeout"), "--kill-after=2", str(limit), *argv]


def cpu_stress(
    testbed: BaseTestbed,
    nodes: Sequence[str] | None = None,
    workers: int = 1,
    seconds: float = 10.0,
) -> Stressor:
    """``workers`` stress-ng CPU workers in each of ``nodes`` (default: every device) for
    ``seconds``. :class:`MissingTool` if stress-ng is not installed."""
    if workers < 1 or seconds <= 0:  # stress-ng reads --cpu 0 as "every CPU"
        raise ValueError(f"workers must be >= 1 and seconds > 0, not {workers}, {seconds}")
    stress_ng = require_tool("stress-ng")
    limit = max(1, math.ceil(seconds))
    processes = [
        testbed.popen(
            node,
            _bounded(
                seconds + GRACE,
                [stress_ng, "--cpu", str(workers), "--timeout", f"{limit}s", "--quiet"],
            ),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for node in (nodes if nodes is not None else testbed.device_nodes)
    ]
    return Stressor("cpu", processes, seconds)


def network_stress(
    testbed: BaseTestbed,
    mbit: float = 250.0,
    seconds: float = 10.0,
    flows: int = 1,
    nodes: Sequence[str] | None = None,
    reverse: bool = False,
    udp: bool = False,
) -> Stressor:
    """iperf3 load on the links of ``nodes`` (default: every device) for ``seconds``: each
    device offers ``mbit`` Mbit/s in total over ``flows`` parallel streams (TCP, or UDP if
    ``udp``) to an iperf3 server in the server node; ``reverse``: server to device.
    :class:`MissingTool` if iperf3 is not installed."""
    if mbit <= 0 or seconds <= 0 or flows < 1:
        raise ValueError(f"mbit and seconds must be > 0, flows >= 1: {mbit}, {seconds}, {flows}")
    iperf3 = require_tool("iperf3")
    nodes = list(nodes if nodes is not None else testbed.device_nodes)
    limit = max(1, math.ceil(seconds))
    servers = []
    processes: list[subprocess.Popen[Any]] = []
    outputs: dict[str, IO[bytes]] = {}
    try:
        for node in nodes:
            port = IPERF3_PORT + testbed.device_nodes.index(testbed.node(node)) + 1
            servers.append(port)
            processes.append(
                testbed.popen(
                    SERVER,
                    _bounded(
                        seconds + 2 * GRACE, [iperf3, "--server", "--one-off", "--port", str(port)]
                    ),
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
        for port in servers:
            testbed.wait_listening(SERVER, port, timeout=10)
        for node, port in zip(nodes, servers, strict=True):
            outputs[node] = tempfile.TemporaryFile()  # noqa: SIM115 (closed by the Stressor)
            argv = [
                iperf3,
                "--client",
                testbed.server_address,
                "--port",
                str(port),
                "--time",
                str(limit),
                "--bitrate",
                f"{mbit / flows:g}M",
                "--parallel",
                str(flows),
                "--json",
                "--connect-timeout",
                "5000",
            ]
            processes.append(
                testbed.popen(
                    node,
                    _bounded(
                        seconds + GRACE,
                        argv + (["--reverse"] if reverse else []) + (["--udp"] if udp else []),
                    ),
                    stdout=outputs[node],
                    stderr=subprocess.DEVNULL,
                )
            )
    except BaseException:
        stop_all(processes)
        for output in outputs.values():
            output.close()
        raise
    return Stressor("network", processes, seconds, outputs)
