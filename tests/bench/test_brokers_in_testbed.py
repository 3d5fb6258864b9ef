"""Brokers started inside a testbed's server namespace, as ``bench fl`` starts them: bound to
the server's address, answering the devices across their links, probed from inside."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest

from tensorwire.errors import MissingDependency
from tensorwire.testbed import Testbed, probe_capabilities
from tensorwire.transports.brokers import MosquittoBroker, RabbitMQBroker


@pytest.fixture(scope="module")
def testbed() -> Iterator[Testbed]:
    caps = probe_capabilities()
    if caps.mode is None:
        pytest.skip(f"no network namespaces here: {caps['netns'].reason}")
    with Testbed(devices=1, profile="4g") as tb:
        yield tb


def _answers_from(testbed: Testbed, node: str, kind: str, target: str) -> bool:
    probe = (
        "import sys; from tensorwire.transports.brokers.readiness import answers; "
        "sys.exit(0 if answers(sys.argv[1], sys.argv[2], timeout=2) else 1)"
    )
    argv = testbed.command(node, [sys.executable, "-c", probe, kind, target])
    return subprocess.run(argv, timeout=60, check=False).returncode == 0


def _start(broker):
    try:
        return broker.start()
    except MissingDependency as exc:
        pytest.skip(str(exc))


def test_mosquitto_in_the_server_namespace_serves_a_device(testbed: Testbed) -> None:
    broker = _start(
        MosquittoBroker(
            1883, bind=testbed.server_address, command_prefix=testbed.command("srv", [])
        )
    )
    try:
        target = f"{testbed.server_address}:1883"
        limit = broker.limits.connections  # named in its URLs: hubs warn before it is reached
        assert broker.url("x") == f"mqtt://{target}/x?connection_max={limit}"
        assert _answers_from(testbed, "dev1", "mqtt", target)
        assert broker.pid in _pids_in(testbed, "srv")
    finally:
        broker.stop()
    assert not _answers_from(testbed, "dev1", "mqtt", target)


def test_rabbitmq_in_the_server_namespace_lets_guest_in_from_a_device(testbed: Testbed) -> None:
    pytest.importorskip("pika", reason="pika is not installed (extra 'amqp')")
    broker = _start(
        RabbitMQBroker(5672, bind=testbed.server_address, command_prefix=testbed.command("srv", []))
    )
    try:
        url = broker.url()
        assert f"@{testbed.server_address}:5672/" in url
        assert _answers_from(testbed, "dev1", "amqp", url)  # guest, though not on loopback
    finally:
        broker.stop()
    assert not _pids_in(testbed, "srv")


def _pids_in(testbed: Testbed, node: str) -> list[int]:
    from tensorwire.testbed._netns import pids_in

    return pids_in([testbed._ready().namespaces[node].path])
