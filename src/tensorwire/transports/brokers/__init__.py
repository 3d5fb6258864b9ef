"""Brokers the message-queue transports need: use the one at the URL if it answers, or start a
private one (own port, config and data directory) and stop it afterwards."""

from tensorwire.transports.brokers.mosquitto import (
    MosquittoBroker,
    ensure_mosquitto,
    mosquitto_answers,
)
from tensorwire.transports.brokers.rabbitmq import (
    RabbitMQBroker,
    ensure_rabbitmq,
    rabbitmq_answers,
)

__all__ = [
    "MosquittoBroker",
    "RabbitMQBroker",
    "ensure_mosquitto",
    "ensure_rabbitmq",
    "mosquitto_answers",
    "rabbitmq_answers",
]
