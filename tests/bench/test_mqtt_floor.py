"""``tensorwire.bench.mqtt_floor``: Mosquitto's own floor with raw-socket clients finishes a
tiny run on a private broker, and a client that never answers is counted, not waited for."""

from __future__ import annotations

import pytest

from tensorwire.bench import mqtt_floor
from tensorwire.errors import MissingDependency
from tensorwire.transports.brokers.mosquitto import find_mosquitto
from tensorwire.transports.brokers.mqtt_packets import remaining_length

try:
    find_mosquitto()
except MissingDependency as exc:
    pytest.skip(str(exc), allow_module_level=True)


def test_remaining_length_is_mqtts_variable_integer():
    assert [remaining_length(n) for n in (0, 127, 128, 16_383, 16_384)] == [
        b"\x00", b"\x7f", b"\x80\x01", b"\xff\x7f", b"\x80\x80\x01"
    ]  # fmt: skip


def test_a_tiny_run_gathers_a_reply_from_every_client():
    row = mqtt_floor.floor_case(6, broadcast=64 << 10, reply=4 << 10, timeout=60)
    assert row.get("error") is None, row
    assert row["clients"] == 6 and row["client_procs"] == 4
    assert row["per_client_ms"] > 0 and row["broker_cpu_s"] >= 0


def test_replies_smaller_than_asked_for_are_not_counted_and_the_run_ends_by_its_deadline():
    # The clients send 4 KiB; the driver waits for 8 KiB replies: none counts, and the case
    # ends at its deadline with the count in its error.
    row = mqtt_floor.floor_case(2, broadcast=64 << 10, reply=4 << 10, timeout=3)
    assert row.get("error") is None  # control: the same run with matching sizes finishes
    real = mqtt_floor._gather
    try:
        mqtt_floor._gather = lambda hub, n, reply, deadline: real(hub, n, 2 * reply, deadline)
        row = mqtt_floor.floor_case(2, broadcast=64 << 10, reply=4 << 10, timeout=3)
    finally:
        mqtt_floor._gather = real
    assert row["error"] == "0 of 2 replies within 3 s"
