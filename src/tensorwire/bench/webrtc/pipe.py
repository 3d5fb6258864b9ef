"""JSON lines to and from a peer process's stdin / stdout, each read bounded by a deadline."""

from __future__ import annotations

import contextlib
import json
import os
import select
import subprocess
import time
from typing import Any

_MAX_LINE = 1 << 20  # bytes: a session description is a few KiB


class PeerPipeError(RuntimeError):
    """A peer process ended, hung past its deadline or wrote what was not expected."""


class JsonPipe:
    """Commands to ``proc`` as JSON lines on its stdin, its replies from its stdout (both
    pipes, unbuffered: ``stdin=PIPE, stdout=PIPE, bufsize=0``); ``name`` says who in errors."""

    def __init__(self, proc: subprocess.Popen[bytes], name: str) -> None:
        if proc.stdin is None or proc.stdout is None:
            raise ValueError("the peer needs stdin=PIPE and stdout=PIPE")
        self.proc = proc
        self.name = name
        self._stdin = proc.stdin
        self._fd = proc.stdout.fileno()
        self._pending = bytearray()

    def send(self, obj: dict[str, Any]) -> None:
        try:
            self._stdin.write(json.dumps(obj).encode() + b"\n")
            self._stdin.flush()
        except (BrokenPipeError, ValueError) as exc:
            raise PeerPipeError(f"the {self.name} peer is gone ({self._ended()})") from exc

    def expect(self, key: str, timeout: float) -> Any:
        """The value of ``key`` in the peer's next line, which must have it (a line with
        ``error`` instead says why the peer gave up); waits at most ``timeout`` seconds."""
        line = self._line(time.monotonic() + timeout)
        try:
            said = json.loads(line)
            if key not in said and "error" in said:
                raise PeerPipeError(f"the {self.name} peer failed: {said['error']}")
            return said[key]
        except (ValueError, KeyError, TypeError):
            raise PeerPipeError(f"the {self.name} peer said {line[:200]!r}, not {key}") from None

    def close(self) -> None:
        """Close the peer's stdin: its end-of-file tells it to finish."""
        if not self._stdin.closed:
            with contextlib.suppress(BrokenPipeError):
                self._stdin.close()

    def _line(self, deadline: float) -> bytes:
        while b"\n" not in self._pending:
            if len(self._pending) > _MAX_LINE:
                raise PeerPipeError(f"the {self.name} peer wrote a line over {_MAX_LINE} bytes")
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._fd], [], [], left)[0]:
                raise PeerPipeError(f"the {self.name} peer did not answer in time")
            data = os.read(self._fd, 65536)
            if not data:
                raise PeerPipeError(f"the {self.name} peer ended ({self._ended()})")
            self._pending += data
        line, _, rest = bytes(self._pending).partition(b"\n")
        self._pending = bytearray(rest)
        return line

    def _ended(self) -> str:
        try:
            code = self.proc.wait(timeout=1)
        except subprocess.TimeoutExpired:
            return "still running"
        return f"exit status {code}"
