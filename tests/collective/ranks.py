"""Running a test group: a rendezvous in the test's process and each rank in a process of
its own (``rank_process.py``), whose JSON lines the test reads with a deadline."""

from __future__ import annotations

import contextlib
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
    """``size`` rank processes running ``scenario`` (of ``worker``, with ``extra`` arguments
    after its four: the same for every rank, or a list per rank); use as a context manager.
    ``elastic``: the rendezvous coordinates an elastic group; ``credentials``: it is served
    with them (see :class:`Rendezvous`); ``url``: meet at that hub instead of one served by
    the test."""

    def __init__(
        self,
        scenario: str,
        size: int,
        worker: Path = WORKER,
        *,
        elastic: bool = False,
        credentials: Any = None,
        url: str | None = None,
        extra: tuple[str, ...] | list[list[str]] = (),
    ) -> None:
        self.size = size
        self.rendezvous = None
        if url is None:
            self.rendezvous = Rendezvous(
                "tcp://127.0.0.1:0", size, timeout=120, elastic=elastic, credentials=credentials
            )
            url = self.rendezvous.url
        self._args = [str(worker), scenario, url]
        self._extra = (
            [list(each) for each in extra]
            if isinstance(extra, list)
            else [list(extra) for _ in range(size)]
        )
        self.procs = [self._spawn(r) for r in range(size)]
        self.lines: list[queue.Queue[dict[str, Any] | None]] = [queue.Queue() for _ in range(size)]
        for proc, lines in zip(self.procs, self.lines, strict=True):
            threading.Thread(target=self._read, args=(proc, lines), daemon=True).start()

    def _spawn(self, rank: int) -> subprocess.Popen[str]:
        env = {**os.environ, "PYTHONPATH": f"{SRC}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
        return subprocess.Popen(
            [sys.executable, *self._args, str(rank), str(self.size), *self._extra[rank]],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            text=True,
        )

    def restart(self, rank: int) -> None:
        """Start rank ``rank`` afresh (its old process must have ended)."""
        self.procs[rank].wait(30)
        self.procs[rank] = self._spawn(rank)
        self.lines[rank] = queue.Queue()
        threading.Thread(
            target=self._read, args=(self.procs[rank], self.lines[rank]), daemon=True
        ).start()

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
        before: list[dict[str, Any]] = []
        while True:
            try:
                line = self.next(rank, max(deadline - time.monotonic(), 0.01))
            except (AssertionError, queue.Empty) as exc:  # say what it printed first
                raise AssertionError(
                    f"{exc or 'no line in time'}; before: {before}; the others: {self._unread()}"
                ) from None
            if key in line:
                return line, before
            before.append(line)

    def _unread(self) -> dict[int, list[dict[str, Any] | None]]:
        """Each rank's lines not read yet (None: it ended), for a failure's message."""
        unread: dict[int, list[dict[str, Any] | None]] = {}
        for rank, lines in enumerate(self.lines):
            with contextlib.suppress(queue.Empty):
                while True:
                    unread.setdefault(rank, []).append(lines.get_nowait())
        return unread

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
        if self.rendezvous is not None:
            self.rendezvous.close()
