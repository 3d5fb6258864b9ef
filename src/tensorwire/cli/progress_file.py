"""``fl server --progress FILE``: the server's events as JSON lines for a watching process
(the benchmark's runner), with an optional acknowledgement after each round."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

ACK_POLL = 0.002  # seconds between looks at the progress acknowledgement file


class ProgressFile:
    """Events of a server run appended to a file as JSON lines, for a watching process:
    ``ready`` (with the hub's URL), one ``round`` per round (its row), ``done``.

    With ``wait_ack`` > 0, after each round the server waits up to that many seconds until
    ``FILE.ack`` holds the round's number, so the watcher can read counters between rounds.
    ``append`` (a resumed run) keeps the lines already there."""

    def __init__(self, path: Path, wait_ack: float = 0.0, append: bool = False) -> None:
        self.path = path
        self.ack = path.with_name(path.name + ".ack")
        self.wait_ack = wait_ack
        path.parent.mkdir(parents=True, exist_ok=True)
        if not append:
            path.write_text("")
            self.ack.unlink(missing_ok=True)  # an old run's ack would release this one's rounds

    def write(self, event: str, **fields: Any) -> None:
        line = json.dumps({"event": event, "time": time.time(), **fields}, default=str)
        with self.path.open("a") as f:
            f.write(line + "\n")

    def round(self, row: dict[str, Any]) -> None:
        self.write("round", **row)
        deadline = time.monotonic() + self.wait_ack
        # Polled: the watcher answers through a file, the one channel both sides share.
        while time.monotonic() < deadline and not self._acked(row["round"]):
            time.sleep(ACK_POLL)

    def _acked(self, round_: int) -> bool:
        try:
            return int(self.ack.read_text() or 0) >= round_
        except (OSError, ValueError):
            return False
