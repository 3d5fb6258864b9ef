"""``mqtt://[user:pass@]host:port/prefix?qos=1&chunk=1048576``: tensors through an MQTT 5 broker
(``mqtts://``, or ``tls=``: over TLS to the broker). ``docs/transports/mqtt.md`` specifies it.

Every payload is one chunk of a tensorwire message on topics under ``prefix``: the client's
``up/<client>/<session>`` (hello, data, bye, its will), the hub's ``ctl/<client>/<session>``
(welcome, refuse), ``down/<client>/<session>`` and ``down`` (one client, and the broker's
fan-out to all), ``hub/<hub>`` (the hub's bye and will). A client subscribes, then says hello
until welcomed; sessions are named in the topics, so a stale will or a stranger's bye cannot end
a newer one. Both sides ride out the broker's restarts: paho reconnects, the MQTT session keeps
subscriptions and queued messages, unacknowledged publishes go again, and a will leaves its peer
``WILL_GRACE_S`` seconds of connected time to come back. A send returns once the broker
acknowledged every chunk. With a key, every payload after the welcome is sealed end to end; a
client's will, and a bye before its welcome, with a key derived from its secret.

Files: ``settings`` (the URL, topics, timing), ``client`` (the paho client), ``connection``
(a broker connection, publishing), ``loop`` (one I/O thread driving a process's connections),
``will``, ``hub``, ``channel``; sealing, reassembly, the medium and graces are
``transports.broker``'s.
"""

from tensorwire.transports.mqtt.channel import MqttChannel, MqttsChannel
from tensorwire.transports.mqtt.hub import MqttHub, MqttsHub
from tensorwire.transports.mqtt.settings import (
    DEFAULT_CHUNK_BYTES,
    DEFAULT_PORT,
    DEFAULT_TLS_PORT,
    MqttSettings,
)
from tensorwire.transports.mqtt.will import WILL_GRACE_S

__all__ = [
    "DEFAULT_CHUNK_BYTES",
    "DEFAULT_PORT",
    "DEFAULT_TLS_PORT",
    "WILL_GRACE_S",
    "MqttChannel",
    "MqttHub",
    "MqttSettings",
    "MqttsChannel",
    "MqttsHub",
]
