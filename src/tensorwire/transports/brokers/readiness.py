"""Waiting until a starting broker answers, also when it runs in another network namespace.

A broker started behind a ``command_prefix`` (``ip netns exec NS``, ``nsenter ...``) listens
where this process cannot connect, so the probe then runs as a helper behind the same prefix:
it calls :func:`main` with ``KIND TARGET SECONDS`` (``mqtt HOST:PORT 10``, say) and polls from
inside until the broker answers (exit 0) or the time is up (exit 1). Which probe a kind uses
is the broker's entry in :mod:`tensorwire.transports.registry`.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

POLL = 0.05  # seconds between probes, and between looks at the broker and the helper


def answers(kind: str, target: str, timeout: float = 1.0) -> bool:
    """Whether the broker at ``target`` answers. ``kind`` names the broker (``mosquitto``) or
    a transport that uses one (``mqtt``); ``target`` is what its registry entry's probe takes:
    ``host:port`` for Mosquitto, the URL for RabbitMQ."""
    from tensorwire.transports.registry import get_broker

    return get_broker(kind).answers_at(target, timeout=timeout)


def wait_answering(
    broker: subprocess.Popen[Any],
    kind: str,
    target: str,
    timeout: float,
    command_prefix: Sequence[str] = (),
) -> bool:
    """Wait until the broker at ``target`` answers (True), its process ``broker`` ends or
    ``timeout`` seconds pass (False). With a ``command_prefix``, probe from behind it."""
    deadline = time.monotonic() + timeout
    if not command_prefix:
        # Polled: a starting broker gives no signal to wait on but its answering port.
        while not answers(kind, target, timeout=0.5):
            if broker.poll() is not None or time.monotonic() > deadline:
                return False
            time.sleep(POLL)
        return True
    helper = subprocess.Popen(
        [
            *command_prefix,
            sys.executable,
            "-c",
            "import sys; from tensorwire.transports.brokers.readiness import main; "
            "sys.exit(main(sys.argv[1:]))",
            kind,
            target,
            str(timeout),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        while helper.poll() is None:
            if broker.poll() is not None or time.monotonic() > deadline:
                return False
            time.sleep(POLL)
        return helper.returncode == 0
    finally:
        if helper.poll() is None:
            helper.kill()
            helper.wait()


def main(argv: Sequence[str]) -> int:
    """The helper (argv: kind, target, seconds): 0 once the broker answers, 1 when time is up."""
    kind, target, seconds = argv
    deadline = time.monotonic() + float(seconds)
    while not answers(kind, target, timeout=0.5):
        if time.monotonic() > deadline:
            return 1
        time.sleep(POLL)
    return 0
