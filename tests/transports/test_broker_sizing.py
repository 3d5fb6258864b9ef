"""Private brokers sized for their devices: file descriptors and connection limits."""

from __future__ import annotations

import resource
from pathlib import Path

import pytest

from tensorwire.errors import MissingDependency
from tensorwire.transports.brokers.mosquitto import MosquittoBroker
from tensorwire.transports.brokers.sizing import (
    MOSQUITTO,
    RABBITMQ,
    SPARE_CONNECTIONS,
    size_for,
)


def test_a_broker_gets_descriptors_for_its_devices_within_this_process_hard_limit():
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    small = size_for(None, None, RABBITMQ)
    assert small.fds == min(1024, hard) and small.connections >= 1
    thousand = size_for(1000, None, RABBITMQ)
    if hard >= thousand.fds:
        assert thousand.connections >= 1000 + 1 + SPARE_CONNECTIONS  # the hub and spares too
    assert thousand.fds <= hard
    fixed = size_for(500, 1024, RABBITMQ)  # a given limit wins over the devices
    assert fixed.fds == 1024 and fixed.connections < 500
    assert size_for(1000, None, MOSQUITTO).fds < size_for(1000, None, RABBITMQ).fds
    with pytest.raises(ValueError, match="no room"):
        size_for(None, 300, RABBITMQ)


def _open_files_limit(pid: int) -> int:
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            return int(line.split()[3])
    raise AssertionError("no open-files line")


def test_a_private_mosquitto_runs_with_the_descriptors_and_connection_limit_of_its_devices():
    broker = MosquittoBroker(devices=2000)
    try:
        broker.start()
    except MissingDependency as exc:
        pytest.skip(str(exc))
    try:
        assert broker.pid is not None
        assert _open_files_limit(broker.pid) == broker.limits.fds
        assert broker.limits.connections >= 2000
        assert broker.dir is not None
        conf = (broker.dir / "mosquitto.conf").read_text()
        assert f"max_connections {broker.limits.connections}" in conf
    finally:
        broker.stop()
