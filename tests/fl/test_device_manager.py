"""The server's device manager: shards, who is available and why not, leaving, restarts,
and what a checkpoint keeps."""

from __future__ import annotations

from tensorwire.fl.server.device_manager import DeviceManager


def _ready(devices: DeviceManager, cid: str, nonce: str = "n1") -> None:
    devices.ready(devices.joined(cid), nonce)


def test_device_n_gets_shard_n_and_a_stranger_the_first_free_one():
    devices = DeviceManager([10, 20, 30], expected=3)
    three, stranger = devices.joined("device-3"), devices.joined("laptop")
    assert devices.assign_shard(three) and three.shard == 2
    assert devices.assign_shard(stranger) and stranger.shard == 0
    assert devices.assign_shard(devices.joined("device-2"))
    assert not devices.assign_shard(devices.joined("device-9"))  # none left


def test_missing_says_why_each_device_is_not_available():
    devices = DeviceManager([10, 10, 10], expected=3)
    _ready(devices, "device-1")
    _ready(devices, "device-2")
    devices["device-2"].busy = 4
    devices.joined("device-3")
    assert devices.available() == ["device-1"]
    assert devices.missing() == {
        "device-2": "no update since round 4 (its deadline passed: hung or slow)",
        "device-3": "joined, not set up yet",
    }
    devices.left("device-1", "left", "connection lost", 5)
    assert devices.missing()["device-1"] == "left in round 5: connection lost"
    devices.left("device-3", "left", "bye", 5)  # never set up: forgotten
    assert devices.missing()["device-3"] == "never joined"


def test_a_restart_forgets_what_the_old_process_owed_and_held():
    devices = DeviceManager(None, expected=1)
    _ready(devices, "a", "first")
    dev = devices["a"]
    dev.busy, dev.holds, dev.dropped = 2, ("run", 2), 1
    assert not devices.ready(dev, "first")  # the same process, set up again
    assert dev.busy == 2
    assert devices.ready(dev, "second")
    assert (dev.busy, dev.holds, dev.dropped) == (None, None, None)


def test_a_checkpoint_keeps_shards_and_dropped_rounds():
    devices = DeviceManager([5, 5], expected=2)
    _ready(devices, "device-1")
    devices.assign_shard(devices["device-1"])
    devices["device-1"].dropped = 3
    resumed = DeviceManager([5, 5], expected=2)
    resumed.restore(devices.state())
    assert (resumed["device-1"].shard, resumed["device-1"].dropped) == (0, 3)
