"""The private brokers' ports: a port picked free and taken by another program before the
broker bound it is picked again; a port the caller gave is never replaced."""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator

import pytest

from tensorwire.errors import MissingDependency, TransportError
from tensorwire.transports.brokers import mosquitto, ports, rabbitmq
from tensorwire.transports.brokers.mosquitto import MosquittoBroker, mosquitto_answers
from tensorwire.transports.brokers.rabbitmq import RabbitMQBroker, rabbitmq_answers


@pytest.fixture
def taken() -> Iterator[int]:
    """A port another program listens on (this test, on 127.0.0.1), held throughout."""
    with socket.create_server(("127.0.0.1", 0)) as holder:
        yield holder.getsockname()[1]


def _first_pick(port: int) -> tuple[Callable[[str], int], list[int]]:
    """A port picker whose first pick is ``port`` (as if taken in the moment after the
    kernel called it free), then the real one's; and the list of its picks."""
    picks: list[int] = []

    def pick(host: str) -> int:
        picks.append(port if not picks else ports.free_port(host))
        return picks[-1]

    return pick, picks


def test_clashes_are_told_apart_from_other_failures():
    assert ports.port_clash(TransportError("log:\n1: Error: Address already in use"))
    assert ports.port_clash(TransportError("{listen_error,5672,eaddrinuse}"))
    assert not ports.port_clash(TransportError("mosquitto did not start within 10 s"))
    calls: list[int] = []

    def fails() -> None:
        calls.append(1)
        raise TransportError("Address already in use")

    with pytest.raises(TransportError, match="in use"):  # the last clash, as it was
        ports.start_on_free_ports(fails, lambda: None, "test")
    assert len(calls) == ports.ATTEMPTS


BROKERS = {  # how to find it, the module that picks its ports, the class, whether it answers
    "mosquitto": (
        mosquitto.find_mosquitto,
        mosquitto,
        MosquittoBroker,
        lambda b: mosquitto_answers(b.host, b.port),
    ),
    "rabbitmq": (
        rabbitmq.find_rabbitmq,
        rabbitmq,
        RabbitMQBroker,
        lambda b: rabbitmq_answers(f"amqp://guest:guest@127.0.0.1:{b.port}/%2F"),
    ),
}


@pytest.mark.parametrize("kind", sorted(BROKERS))
def test_a_broker_moves_off_a_port_taken_before_it_bound_it(kind, taken, monkeypatch):
    find, module, broker_type, answers = BROKERS[kind]
    try:
        find()
    except MissingDependency as exc:
        pytest.skip(str(exc))
    pick, picks = _first_pick(taken)
    monkeypatch.setattr(module, "free_port", pick)
    with broker_type() as broker:
        assert picks[0] == taken and broker.port not in (0, taken) and answers(broker)


def test_a_port_given_is_the_callers_and_is_never_replaced(taken):
    try:
        mosquitto.find_mosquitto()
    except MissingDependency as exc:
        pytest.skip(str(exc))
    with pytest.raises(TransportError, match=r"(?i)address already in use"):  # and says why
        MosquittoBroker(taken).start()
