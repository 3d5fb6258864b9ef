"""What the server records as the run goes: the rows of a :class:`RunResult`, written to the
results directory after every round."""

from __future__ import annotations

import time
from collections.abc import Collection
from pathlib import Path
from typing import Any

from tensorwire.fl.config import FLConfig
from tensorwire.fl.records import RunResult, transfer_rows
from tensorwire.fl.results import RunDirectory

MAX_REASON = 500  # characters of a device's error message kept
MAX_EVENT_ROWS = 10_000  # events recorded per run (the rest are counted by kind)
MAX_DEVICE_RECORDS = 10_000  # transfer rows taken from one device at the end


class Recorder:
    """The run's rows (``result``) and, with ``path``, its results directory."""

    def __init__(self, cfg: FLConfig, path: Path | None) -> None:
        self.cfg = cfg
        self.run_dir = RunDirectory(path) if path is not None else None
        self.result = RunResult(cfg)
        self.events_not_kept: dict[str, int] = {}

    def resume(self, after_round: int) -> None:
        """Go on from the rows written up to ``after_round`` (later ones are done again)."""
        if self.run_dir is not None:
            self.result = self.run_dir.load(self.cfg)
            self.result.keep_until(after_round)

    def start(self, url: str, secured: bool, resumed_from: int) -> None:
        if self.run_dir is not None:
            self.run_dir.start(self.cfg, {"url": url, "secured": secured}, resumed_from)

    def save(self) -> None:
        if self.run_dir is not None:
            self.run_dir.save(self.result)

    def finish(self, seconds: float, outcome: str) -> None:
        if self.run_dir is not None:
            extra = {"seconds": seconds, "outcome": outcome}
            self.run_dir.finish(self.result, extra | {"events_not_kept": self.events_not_kept})

    def event(
        self, round_: int, kind: str, device: str | None, reason: str, at: float | None = None
    ) -> None:
        """Record an event; past :data:`MAX_EVENT_ROWS` (a stranger knocking again and again)
        they are only counted."""
        if len(self.result.events) >= MAX_EVENT_ROWS:
            self.events_not_kept[kind] = self.events_not_kept.get(kind, 0) + 1
            return
        self.result.events.append(
            {
                "round": round_,
                "time": at or time.time(),
                "kind": kind,
                "device": device,
                "reason": reason[:MAX_REASON],
            }
        )

    def transfers(self, round_: int, payload: str, records: Collection[Any]) -> None:
        """The server's transfer rows of round ``round_``'s models or updates."""
        rows = transfer_rows(round_, "server", records)
        for row in rows:
            row["payload"] = payload
        self.result.transfers += rows


def device_records(device: str, meta: dict[str, Any]) -> list[dict[str, Any]] | None:
    """The transfer rows a device sent at the end (``meta["records"]``), the well-formed
    ones, at most :data:`MAX_DEVICE_RECORDS`, each marked as the device's own; None when
    it sent none."""
    rows = meta.get("records")
    if not isinstance(rows, list):
        return None
    keep = [
        row
        for row in rows[:MAX_DEVICE_RECORDS]
        if isinstance(row, dict)
        and isinstance(row.get("round"), int)
        and all(isinstance(v, str | int | float | bool | None) for v in row.values())
    ]
    for row in keep:
        row["device"] = device  # a device speaks for itself only
        row["side"] = "device"
    return keep
