"""The global model going out to a round's devices: whole, or (``downlink="delta"``) as the XOR
of its bits with the last round's to a device that holds that one."""

from __future__ import annotations

import time
import uuid
from typing import Any

from tensorwire.fl.compression import xor_delta
from tensorwire.fl.config import FLConfig
from tensorwire.fl.server.device_manager import DeviceManager
from tensorwire.fl.server.outbox import Outbox
from tensorwire.fl.server.recorder import MAX_REASON, Recorder
from tensorwire.fl.server.round import Round
from tensorwire.fl.train import StateDict
from tensorwire.transports import BroadcastResult


class Downlink:
    """Sends the run's models through ``outbox`` and keeps track of which device holds which.

    ``token`` names this server process: a model a device holds from another is stale.
    ``previous`` is the model sent in the last round (the base of a delta)."""

    def __init__(
        self, cfg: FLConfig, devices: DeviceManager, outbox: Outbox, recorder: Recorder
    ) -> None:
        self.cfg, self.devices, self.outbox, self.recorder = cfg, devices, outbox, recorder
        self.token = uuid.uuid4().hex
        self.previous: StateDict | None = None

    def send(self, rd: Round, cids: list[str], model: StateDict) -> None:
        """Send round ``rd``'s global ``model`` to ``cids``: a delta to those holding the last
        round's model (when the downlink is ``delta``), the whole model to the others."""
        r = rd.number
        devices = self.devices
        use_delta = self.cfg.downlink == "delta" and self.previous is not None
        by_delta = [c for c in cids if use_delta and devices[c].holds == (self.token, r - 1)]
        full = [c for c in cids if c not in by_delta]
        timeout = max(rd.deadline - time.monotonic(), 0.1)
        groups = []
        if by_delta:
            assert self.previous is not None
            groups.append((by_delta, xor_delta(model, self.previous), True))
        if full:
            groups.append((full, model, False))
        for group, payload, delta in groups:
            for c in group:
                rd.sent[c] = "delta" if delta else "full"
                dev = devices[c]
                dev.holds, dev.busy, dev.asked = (self.token, r), r, r
            meta: dict[str, Any] = {
                "fl": "round",
                "round": r,
                "run": self.token,
                "config": self.cfg.as_dict(),
                "shards": {c: devices[c].shard for c in group},
                "dropped": {c: devices[c].dropped for c in group if devices[c].dropped},
                "delta": delta,
            }
            if delta:
                meta["base"] = r - 1
            self.outbox.model(r, group, payload, meta, timeout)

    def sent(self, r: int, result: BroadcastResult, current: Round | None) -> None:
        """Round ``r``'s model went out (``current`` is the round under way, if any): record
        the transfers; a device it did not reach does not hold it."""
        self.recorder.transfers(r, "model", result.values())
        rd = current if current is not None and current.number == r else None
        if rd is not None:
            rd.downlink += list(result.values())
        for cid, exc in result.failed.items():
            dev = self.devices.get(cid)
            if dev is not None and dev.holds == (self.token, r):
                dev.holds = None
            if rd is not None:
                error = f"{type(exc).__name__}: {exc}"
                rd.info.setdefault(cid, {})["model_error"] = error[:MAX_REASON]
