"""Ending a child process that leaves when its stdin closes."""

from __future__ import annotations

import subprocess
from typing import Any


def close_and_reap(child: subprocess.Popen[Any], wait_s: float) -> None:
    """Close ``child``'s stdin (its cue to leave), wait up to ``wait_s`` seconds for it to
    end, and kill it if it has not."""
    if child.stdin is not None:
        child.stdin.close()
    try:
        child.wait(timeout=wait_s)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()
