"""The devices of a run: who is connected, set up and free, and which ones a round samples.

Like Flower's ``ClientManager``: membership (joins, leaves, restarts, failures), data shards
and sampling live here; the round loop tells it what the hub and the devices said, and asks
it which devices are available and why the others are not.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

_DEVICE_N = re.compile(r"device-(\d+)")


@dataclass
class Device:
    """The server's view of one device."""

    id: str
    connected: bool = False
    ready: bool = False  # answered the setup since it (re)joined
    nonce: str | None = None  # its process's, from its last ready: a new one is a restart
    shard: int | None = None
    holds: tuple[str, int] | None = None  # (run token, round) of the global model it has
    busy: int | None = None  # a round it was sampled in and has not answered yet
    asked: int | None = None  # the last round it was sent the model for
    answered: int | None = None  # the last round an update of it was taken for (or late)
    failed: str | None = None  # the error it reported
    why: str = "never joined"  # why it is not connected
    dropped: int | None = None  # a round whose update was not applied (it rolls back)
    told: int | None = None  # the round in which it was last told of a rejection
    junk: int = 0  # messages from it that were not FL messages

    def available(self) -> bool:
        return self.connected and self.ready and self.busy is None and self.failed is None


class DeviceManager:
    """Every device the run has seen, by id. ``shard_sizes``: the shards of a built-in data
    set (None for devices' own data); ``expected``: how many devices the run is for."""

    def __init__(self, shard_sizes: list[int] | None, expected: int) -> None:
        self.shard_sizes = shard_sizes
        self.expected = expected
        self._devices: dict[str, Device] = {}
        self._left_at: dict[str, float] = {}  # monotonic time each device was last seen leave

    def __getitem__(self, cid: str) -> Device:
        return self._devices[cid]

    def __iter__(self) -> Iterator[Device]:
        return iter(self._devices.values())

    def get(self, cid: str) -> Device | None:
        return self._devices.get(cid)

    def device(self, cid: str) -> Device:
        """The device ``cid``, first seen now if it was not known."""
        dev = self._devices.get(cid)
        if dev is None:
            dev = self._devices[cid] = Device(cid)
        return dev

    # -- membership -------------------------------------------------------------------------

    def joined(self, cid: str) -> Device:
        dev = self.device(cid)
        dev.connected = True
        return dev

    def left(self, cid: str, kind: str, reason: str, round_number: int) -> None:
        """``cid`` left (``kind`` "left") or was replaced by a new connection, which may be a
        new process: back, it owes nothing, and may not hold the model."""
        dev = self.device(cid)
        self._left_at[cid] = time.monotonic()
        dev.connected, dev.ready = False, False
        dev.holds, dev.busy = None, None
        dev.why = f"left in round {round_number}: {reason}"
        if dev.nonce is None and kind == "left":  # never set up: nothing to keep
            del self._devices[cid]
            self._left_at.pop(cid, None)

    def ready(self, dev: Device, nonce: str) -> bool:
        """``dev`` answered its setup from the process ``nonce``; True when that is a new
        process (a restart): nothing of the old one carries over."""
        restarted = dev.nonce is not None and nonce != dev.nonce
        if restarted:
            dev.busy, dev.holds, dev.dropped = None, None, None
        dev.nonce, dev.ready, dev.failed = nonce, True, None
        return restarted

    def failed(self, dev: Device, error: str) -> None:
        dev.failed, dev.ready = error, False

    def still_there(self, cid: str, grace: float) -> bool:
        """Connected, or left less than ``grace`` seconds ago (its last messages may trail
        the news that it left)."""
        return self._devices[cid].connected or time.monotonic() - self._left_at[cid] < grace

    def assign_shard(self, dev: Device) -> bool:
        """Give a device of a built-in data set its shard: ``device-N`` shard N (1-based)
        when free, others the first free one. False when none is left."""
        sizes = self.shard_sizes
        if sizes is None or dev.shard is not None:
            return True
        taken = {d.shard for d in self._devices.values() if d.shard is not None}
        m = _DEVICE_N.fullmatch(dev.id)
        home = int(m.group(1)) - 1 if m else -1
        if 0 <= home < len(sizes) and home not in taken:
            dev.shard = home
            return True
        free = [i for i in range(len(sizes)) if i not in taken]
        if not free:
            return False
        dev.shard = free[0]
        return True

    # -- availability and sampling ----------------------------------------------------------

    def connected(self) -> list[str]:
        return [d.id for d in self._devices.values() if d.connected]

    def available(self) -> list[str]:
        """Connected, set up, not failed, not working on an earlier round; sorted."""
        return sorted(d.id for d in self._devices.values() if d.available())

    def available_count(self) -> int:
        return sum(d.available() for d in self._devices.values())

    def sample(self, k: int, seed: Sequence[int]) -> list[str]:
        """``k`` of the available devices, drawn by a generator seeded with ``seed`` (so a
        rerun samples alike); all of them when ``k`` is as many."""
        available = self.available()
        if k >= len(available):
            return available
        rng = np.random.default_rng(list(seed))
        return sorted(rng.choice(available, size=k, replace=False).tolist())

    def missing(self) -> dict[str, str]:
        """Every device known or expected that is not available, and why."""
        out: dict[str, str] = {}
        if self.shard_sizes is not None:
            for i in range(1, self.expected + 1):
                if f"device-{i}" not in self._devices:
                    out[f"device-{i}"] = "never joined"
        for d in sorted(self._devices.values(), key=lambda d: d.id):
            if d.available():
                continue
            if not d.connected:
                out[d.id] = d.why
            elif d.failed is not None:
                out[d.id] = f"failed: {d.failed}"
            elif d.busy is not None:
                out[d.id] = f"no update since round {d.busy} (its deadline passed: hung or slow)"
            else:
                out[d.id] = "joined, not set up yet"
        return dict(sorted(out.items()))

    # -- checkpoints ------------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        """What a resumed run needs of the devices: their shards, and the rounds whose
        update of theirs was not applied (they roll those back)."""
        devices = self._devices.values()
        return {
            "shards": {d.id: d.shard for d in devices if d.shard is not None},
            "dropped": {d.id: d.dropped for d in devices if d.dropped is not None},
        }

    def restore(self, state: dict[str, Any]) -> None:
        """Take back what :meth:`state` gave."""
        for cid, shard in state.get("shards", {}).items():
            self.device(cid).shard = shard
        for cid, r in state.get("dropped", {}).items():
            self.device(cid).dropped = r
