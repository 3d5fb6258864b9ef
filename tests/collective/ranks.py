"""Running a test group: a rendezvous in the test's process and each rank in a process of
its own (``rank_process.py``), whose JSON lines the test reads with a deadline."""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from tensorwire.collective import Rendezvous

WORKER = Path(__file__).with_name("rank_process.py")
SRC = Path(__file__).resolve().parents[2] / "src"


class Ranks:
    """``size`` rank processes running ``scenario``; use as a context manager."""

    def __init__(
        self,
        scenario: str,
        size: int,
        *,
        worker: Path = WORKER,
        credentials: Any = None,
        extra: list[list[str]] | None = None,
    ) -> None:
        """``worker`` runs each rank, given ``extra[rank]`` after the usual arguments; the
        rendezvous is served with ``credentials`` (see :class:`Rendezvous`)."""
        self.size = size
        self.rendezvous = Rendezvous(
            "tcp://127.0.0.1:0", size, timeout=120, credentials=credentials
        )
        env = {**os.environ, "PYTHONPATH": f"{SRC}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
        extra = extra or [[] for _ in range(size)]
        self.procs = [
            subprocess.Popen(
                [sys.executable, str(worker), scenario, self.rendezvous.url, str(r), str(size)]
                + extra[r],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                env=env,
                text=True,
            )
            for r in range(size)
        ]
        self.lines: list[queue.Queue[dict[str, Any] | None]] = [queue.Queue() for _ in range(size)]
        for proc, lines in zip(self.procs, self.lines, strict=True):
            threading.Thread(target=self._read, args=(proc, lines), daemon=True).start()

    @staticmethod
    def _read(proc: subprocess.Popen[str], lines: queue.Queue[dict[str, Any] | None]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(json.loads(line))
        lines.put(None)  # the process ended

    def next(self, rank: int, timeout: float = 120) -> dict[str, Any]:
        """Rank ``rank``'s next line; fails the test if there is none in ``timeout`` s."""
        line = self.lines[rank].get(timeout=timeout)
        assert line is not None, f"rank {rank} ended (exit code {self.procs[rank].wait()})"
        return line

    def until(self, rank: int, key: str, timeout: float = 120) -> tuple[dict[str, Any], list]:
        """Rank ``rank``'s lines up to the first with ``key``: (that line, those before)."""
        deadline = time.monotonic() + timeout
        before = []
        while True:
            line = self.next(rank, max(deadline - time.monotonic(), 0.01))
            if key in line:
                return line, before
            before.append(line)

    def tell(self, rank: int) -> None:
        """Let rank ``rank`` go on (its scenario waits for a line on stdin)."""
        assert self.procs[rank].stdin is not None
        self.procs[rank].stdin.write("go\n")
        self.procs[rank].stdin.flush()

    def __enter__(self) -> Ranks:
        return self

    def __exit__(self, *exc: object) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
        self.rendezvous.close()
