"""Whether a RabbitMQ broker answers at a URL: an AMQP connection with its credentials."""

from __future__ import annotations

import contextlib
import socket

from tensorwire.errors import MissingDependency
from tensorwire.transports.security import split_security_options


def rabbitmq_answers(url: str, timeout: float = 2.0) -> bool:
    """Whether a broker at the ``amqp://`` or ``amqps://`` URL accepts an AMQP connection with
    the URL's credentials and vhost within ``timeout`` seconds. Over TLS the broker's
    certificate is checked first (against the URL's ``ca=``, else the system's CAs), so the
    credentials go only to the broker the URL names."""
    try:
        import pika
        import pika.exceptions
        from pika.adapters.utils.connection_workflow import AMQPConnectorException

        from tensorwire.transports.amqp import AmqpAddress
    except ImportError as exc:
        raise MissingDependency(
            f"probing RabbitMQ needs {exc.name or exc}: pip install 'tensorwire[amqp]'"
        ) from exc
    url, security = split_security_options(url, "channel")
    params = AmqpAddress(url, tls=security.get("tls")).params
    try:  # nothing listening: say so without pika's error logs of a failed connection
        socket.create_connection((params.host, params.port), timeout=timeout).close()
    except OSError:
        return False
    params.socket_timeout = timeout
    params.stack_timeout = timeout
    params.blocked_connection_timeout = timeout
    params.connection_attempts = 1
    try:
        conn = pika.BlockingConnection(params)
    # AMQPConnectorException: no handshake in time (a listener at its limit accepts no more)
    except (pika.exceptions.AMQPError, AMQPConnectorException, OSError):
        return False
    with contextlib.suppress(pika.exceptions.AMQPError, OSError):  # it answered: that is all
        conn.close()
    return True
