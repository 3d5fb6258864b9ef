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
from collections.abc import Callable, Sequence
from pathlib import Path
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
    failed: Callable[[], object] = lambda: False,
) -> bool:
    """Wait until the broker at ``target`` answers (True), its process ``broker`` ends,
    ``failed()`` says it never will (true: its log says so, say) or ``timeout`` seconds pass
    (False). With a ``command_prefix``, probe from behind it."""
    deadline = time.monotonic() + timeout

    def given_up() -> bool:
        return broker.poll() is not None or bool(failed()) or time.monotonic() > deadline

    if not command_prefix:
        # Polled: a starting broker gives no signal to wait on but its answering port.
        while not answers(kind, target, timeout=0.5):
            if given_up():
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
            if given_up():
                return False
            time.sleep(POLL)
        return helper.returncode == 0
    finally:
        if helper.poll() is None:
            helper.kill()
            helper.wait()


def wait_all_answering(
    broker: subprocess.Popen[Any],
    kind: str,
    targets: Sequence[str],
    timeout: float,
    command_prefix: Sequence[str] = (),
    failed: Callable[[], object] = lambda: False,
) -> bool:
    """:func:`wait_answering` for each of ``targets`` in turn (a broker's listeners), all
    within ``timeout`` seconds: True once every one answers."""
    deadline = time.monotonic() + timeout
    for target in targets:
        left = deadline - time.monotonic()
        if not wait_answering(broker, kind, target, left, command_prefix, failed):
            return False
    return True


def logged(path: Path, since: int, marker: bytes) -> str:
    """The lines of the log at ``path`` past its first ``since`` bytes that hold ``marker``
    ("" if none, or no log yet): what a starting broker said of itself this time."""
    try:
        with open(path, "rb") as f:
            f.seek(since)
            found = [line for line in f.read().splitlines() if marker in line]
    except OSError:
        return ""
    return b"\n".join(found).decode(errors="replace")


def main(argv: Sequence[str]) -> int:
    """The helper (argv: kind, target, seconds): 0 once the broker answers, 1 when time is up."""
    kind, target, seconds = argv
    deadline = time.monotonic() + float(seconds)
    while not answers(kind, target, timeout=0.5):
        if time.monotonic() > deadline:
            return 1
        time.sleep(POLL)
    return 0
