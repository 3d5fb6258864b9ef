"""Devices' updates as they arrive: validated and taken into their round, kept for a later
aggregation when late (``late="stale"``) or dropped, or rejected, the device told why."""

from __future__ import annotations

import logging
import time
from typing import Any

import tensorwire
from tensorwire.fl.config import FLConfig
from tensorwire.fl.errors import UpdateRejected
from tensorwire.fl.server.device_manager import Device
from tensorwire.fl.server.outbox import Outbox
from tensorwire.fl.server.recorder import Recorder
from tensorwire.fl.server.round import Round
from tensorwire.fl.strategies import Update
from tensorwire.fl.train import StateDict
from tensorwire.fl.validation import check_update

log = logging.getLogger("tensorwire.fl")


class UpdateIntake:
    """Takes updates for the run ``cfg``; ``shard_sizes`` cap the samples an update of a
    built-in data set may claim. ``stale`` holds late updates kept for the next round."""

    def __init__(
        self,
        cfg: FLConfig,
        shard_sizes: list[int] | None,
        recorder: Recorder,
        outbox: Outbox,
    ) -> None:
        self.cfg, self.shard_sizes = cfg, shard_sizes
        self.recorder, self.outbox = recorder, outbox
        self.stale: dict[str, Update] = {}

    def take(
        self,
        dev: Device,
        msg: tensorwire.Message,
        rd: Round | None,
        round_number: int,
        global_state: StateDict,
    ) -> bool:
        """Take an update of ``dev`` during round ``round_number`` (``rd`` while it waits);
        True when it was late (the device is free again)."""
        r = msg.meta.get("round")
        if isinstance(r, bool) or not isinstance(r, int):
            self.reject(dev, None, "an update must name its round", round_number)
            return False
        if r == dev.answered:  # sent again (a reconnecting device does): the first one counts
            self.reject(dev, r, "a second update for the round", round_number)
        elif rd is not None and r == rd.number and dev.asked == r:
            if dev.id in rd.waiting or rd.status_of(dev.id) == "left":
                self._in_time(rd, dev, msg, global_state)
            else:
                self.reject(dev, r, "a second update for the round", round_number)
        elif dev.asked == r and r <= round_number:
            self._late(dev, msg, r, rd, round_number, global_state)
            return True
        else:  # e.g. a broker's broadcast reached a device that joined as it went out
            dev.dropped = r  # it rolls its error feedback back when next sampled
            self.reject(
                dev, r, f"this device was not asked for an update in round {r}", round_number
            )
        return False

    def take_stale(self) -> list[Update]:
        """The late updates kept so far (by device), now to be aggregated."""
        return [self.stale.pop(c) for c in sorted(self.stale)]

    def reject(self, dev: Device, r: Any, reason: str, round_number: int) -> None:
        """Tell the device why its update was rejected: once per round (a device sending
        update after update gets no answer to each)."""
        if dev.told == round_number:
            return
        dev.told = round_number
        log.warning("fl: rejected an update of %s for round %s: %s", dev.id, r, reason)
        self.outbox.tell(
            dev.id, {"fl": "verdict", "round": r, "status": "rejected", "reason": reason}
        )

    def _max_samples(self, dev: Device) -> int:
        if self.shard_sizes is not None and dev.shard is not None:
            return self.shard_sizes[dev.shard]
        return self.cfg.max_samples

    def _check(
        self, dev: Device, msg: tensorwire.Message, global_state: StateDict
    ) -> tuple[Update, float]:
        checked = check_update(
            msg.tensors,
            msg.meta,
            global_state,
            max_samples=self._max_samples(dev),
            clip_norm=self.cfg.clip_norm,
            loss=getattr(msg, "loss", None),
        )
        return Update(
            dev.id,
            int(msg.meta["round"]),
            checked.delta,
            checked.samples,
            float(checked.samples),
            checked.loss,
        ), checked.norm

    def _in_time(
        self, rd: Round, dev: Device, msg: tensorwire.Message, global_state: StateDict
    ) -> None:
        rd.waiting.discard(dev.id)
        rd.status.pop(dev.id, None)
        dev.busy, dev.answered = None, rd.number
        meta = msg.meta
        info = rd.info.setdefault(dev.id, {})
        info.update(
            arrived_s=time.monotonic() - rd.started,
            train_s=_number(meta.get("train_s")),
            train_loss=_number(meta.get("train_loss")),
            downlink_wall_s=_number(meta.get("downlink_wall_s")),
        )
        if msg.record is not None:
            rd.uplink.append(msg.record)
            self.recorder.transfers(rd.number, "update", [msg.record])
        try:
            update, norm = self._check(dev, msg, global_state)
        except UpdateRejected as exc:
            rd.status[dev.id] = ("rejected", exc.reason)
            dev.dropped = rd.number
            self.reject(dev, rd.number, exc.reason, rd.number)
            return
        info.update(
            samples=update.samples, norm=norm, lost_max=max(update.loss.values(), default=0.0)
        )
        rd.accepted[dev.id] = update

    def _late(
        self,
        dev: Device,
        msg: tensorwire.Message,
        r: int,
        current: Round | None,
        round_number: int,
        global_state: StateDict,
    ) -> None:
        dev.answered = r
        if dev.busy == r:
            dev.busy = None
        age = round_number - r
        row = {"round": r, "device": dev.id, "status": "late", "arrived_in_round": round_number}
        if msg.record is not None:
            self.recorder.transfers(r, "update", [msg.record])
        if current is not None:
            current.late_arrivals.append(dev.id)
        reason = "arrived after the round's deadline" + (f", {age} round(s) later" if age else "")
        if self.cfg.late == "stale":
            try:
                update, _ = self._check(dev, msg, global_state)
            except UpdateRejected as exc:
                row |= {"status": "rejected", "reason": exc.reason}
                dev.dropped = r
                self.reject(dev, r, exc.reason, round_number)
            else:
                self.stale[dev.id] = update
                row["reason"] = reason + ": kept for the next aggregation, weighted by its age"
                dev.dropped = None
        else:
            row["reason"] = reason + ": dropped"
            dev.dropped = r
            self.outbox.tell(
                dev.id, {"fl": "verdict", "round": r, "status": "late", "reason": row["reason"]}
            )
        self.recorder.result.updates.append(row)
        log.info("fl: %s's update for round %d %s", dev.id, r, row.get("reason"))


def _number(value: Any) -> float:
    return (
        float(value)
        if isinstance(value, int | float) and not isinstance(value, bool)
        else float("nan")
    )
