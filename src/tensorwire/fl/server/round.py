"""One round as it goes: whom it waits for, what each device did, what crossed the network,
and the row the run records for it."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tensorwire.fl.strategies import RoundPlan, Update

STATUSES = ("applied", "dropped", "rejected", "missing", "left", "failed")


@dataclass
class Round:
    """Round ``number``, planned by the strategy, started at ``started`` (monotonic)."""

    number: int
    plan: RoundPlan
    started: float
    available: int  # devices available when the round sampled
    waited: float = 0.0  # seconds the round waited for a quorum of devices before it began
    sampled: list[str] = field(init=False)
    waiting: set[str] = field(init=False)
    accepted: dict[str, Update] = field(default_factory=dict)
    status: dict[str, tuple[str, str]] = field(default_factory=dict)  # device: (status, why)
    info: dict[str, dict[str, Any]] = field(default_factory=dict)  # device: its row's values
    sent: dict[str, str] = field(default_factory=dict)  # device: "full" / "delta"
    downlink: list[Any] = field(default_factory=list)  # transfer records
    uplink: list[Any] = field(default_factory=list)
    late_arrivals: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.sampled = list(self.plan.devices)
        self.waiting = set(self.plan.devices)

    @property
    def deadline(self) -> float:
        """When (monotonic) the round stops waiting."""
        return self.started + self.plan.deadline_s

    def status_of(self, cid: str, default: str = "") -> str:
        return self.status.get(cid, (default, ""))[0]

    def left(self, cid: str, why: str) -> None:
        """``cid`` is gone (it left, or restarted): the round stops waiting for it."""
        if cid in self.waiting:
            self.waiting.discard(cid)
            self.status[cid] = ("left", why)

    def failed(self, cid: str, error: str) -> None:
        """``cid`` reported ``error``; its leaving may have been seen first: this says why."""
        if cid in self.waiting or self.status_of(cid) == "left":
            self.waiting.discard(cid)
            self.status[cid] = ("failed", error)

    def may_join(self, cid: str) -> bool:
        """Whether ``cid``, available now, may still take part: it has not answered (or it
        left) and the deadline has not passed."""
        return (
            self.status_of(cid, "left") == "left"
            and cid not in self.accepted
            and time.monotonic() < self.deadline
        )

    def join(self, cid: str) -> None:
        if cid not in self.sampled:
            self.sampled.append(cid)
        self.waiting.add(cid)
        self.status.pop(cid, None)

    def end(self) -> str:
        """Mark whoever it still waits for missing; say how it ended."""
        ended = "all answered" if not self.waiting else "deadline"
        for cid in self.waiting:
            self.status[cid] = (
                "missing",
                f"no update by the round's deadline ({self.plan.deadline_s:g} s)",
            )
        return ended

    def update_rows(self) -> list[dict[str, Any]]:
        """A row per sampled device: its status, why, and how its model went out."""
        rows = []
        for cid in self.sampled:
            status, why = self.status.get(cid, ("missing", "no update"))
            rows.append(
                {
                    "round": self.number,
                    "device": cid,
                    "status": status,
                    "reason": why,
                    "model_sent": self.sent.get(cid),
                    **self.info.get(cid, {}),
                }
            )
        return rows

    def row(
        self,
        ended: str,
        quorum: bool,
        accepted: list[Update],
        stale: list[Update],
        test_loss: float,
        accuracy: float,
    ) -> dict[str, Any]:
        """The round's row: accuracy, losses, bytes, times and who did what."""
        infos = [self.info[u.client] for u in accepted]
        train_s = [i["train_s"] for i in infos]
        by = {s: sorted(c for c, (st, _) in self.status.items() if st == s) for s in STATUSES}
        return {
            "round": self.number,
            "status": "aggregated" if quorum else "no-quorum",
            "accuracy": accuracy,
            "test_loss": test_loss,
            "train_loss": float(np.mean([i["train_loss"] for i in infos]))
            if infos
            else float("nan"),
            "train_s_max": max(train_s) if train_s else float("nan"),
            "train_s_mean": float(np.mean(train_s)) if train_s else float("nan"),
            "uplink_bytes": sum(rec.bytes_encoded for rec in self.uplink),
            "uplink_bytes_raw": sum(rec.bytes_raw for rec in self.uplink),
            "downlink_bytes": sum(rec.bytes_encoded for rec in self.downlink),
            # device-reported downlink wall (first encoded byte to last tensor decoded) + uplink
            "comm_s": sum(i.get("downlink_wall_s", 0.0) for i in infos)
            + sum(rec.e2e_s or rec.wall_s for rec in self.uplink),
            "round_s": time.monotonic() - self.started,
            "waited_s": self.waited,
            "ended": ended,
            "deadline_s": self.plan.deadline_s,
            "quorum": self.plan.quorum,
            "updates": len(accepted),
            "stale_applied": [u.client for u in stale],
            "available": self.available,
            "sampled": list(self.sampled),
            "applied": by["applied"] if quorum else [],
            "dropped": by["dropped"],
            "rejected": by["rejected"],
            "missing": by["missing"],
            "left": by["left"],
            "failed": by["failed"],
            "late_arrivals": self.late_arrivals,
        }
