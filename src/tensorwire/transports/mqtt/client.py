"""The paho client of a broker connection: MQTT 5, credentials, TLS checked for the name the
settings give, and no Nagle."""

from __future__ import annotations

import socket
import ssl
import uuid
from typing import Any

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion

from tensorwire.transports.mqtt.settings import MqttSettings
from tensorwire.transports.security import TLS


class _ServerNamed:
    """An SSL context that checks the broker's certificate for ``name`` (``TLS.server_name``)
    rather than for the host paho dials, which paho passes to ``wrap_socket``."""

    def __init__(self, context: ssl.SSLContext, name: str) -> None:
        self._context = context
        self._name = name

    @property
    def check_hostname(self) -> bool:
        return self._context.check_hostname

    def wrap_socket(self, sock: socket.socket, server_hostname: Any = None, **kw: Any) -> Any:
        return self._context.wrap_socket(sock, server_hostname=self._name, **kw)


def connection_tls(settings: MqttSettings, tls: TLS | None) -> TLS | None:
    """The TLS a connection runs: the settings given, else the system's CAs for an ``mqtts`` URL."""
    return tls if tls is not None or not settings.tls else TLS()


def _no_delay(_client: Any, _userdata: Any, sock: Any) -> None:
    # paho leaves Nagle on: a small publish or PUBACK then waits ~40 ms for a delayed ACK.
    if isinstance(sock, socket.socket):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def paho_client(settings: MqttSettings, tls: TLS | None) -> paho.Client:
    """A paho client (MQTT 5, a fresh client id) with the settings' credentials and ``tls``."""
    client = paho.Client(
        CallbackAPIVersion.VERSION2,
        client_id=f"tw-{uuid.uuid4().hex[:20]}",
        protocol=MQTTProtocolVersion.MQTTv5,
    )
    client.suppress_exceptions = True  # a callback's bug is logged, never ends the loop
    if settings.username is not None:
        client.username_pw_set(settings.username, settings.password)
    if tls is not None:
        context = tls.client_context()
        named = context if tls.server_name is None else _ServerNamed(context, tls.server_name)
        # _ServerNamed has what paho uses of a context: check_hostname and wrap_socket
        client.tls_set_context(named)  # type: ignore[arg-type]
    client.on_socket_open = _no_delay
    return client
