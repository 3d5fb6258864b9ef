"""``mqtt://[user:pass@]host:port/prefix?qos=1&chunk=1048576``: tensors through an MQTT 5 broker
(``mqtts://``, or ``tls=``: over TLS to the broker).

``docs/transports/mqtt.md`` specifies the mapping. Every payload published is one chunk
(``tensorwire.wire.iter_chunks``) of a tensorwire message, cut under the broker's maximum
packet size, on these topics under ``prefix`` (``<session>`` is the session id of the client's
hello, ``<hub>`` the hub's id, which its welcome names):

- ``prefix/up/<client>/<session>``: the client's hello, data and bye, and its will (a ``bye``
  with ``will: true`` that the broker publishes when the client's connection dies);
- ``prefix/ctl/<client>/<session>``: the hub's welcome or refuse;
- ``prefix/down/<client>/<session>``: the hub's messages to one client;
- ``prefix/down``: broadcasts (the broker's fan-out: one publish reaches every client);
- ``prefix/hub/<hub>``: the hub's bye, and its will.

The session (``docs/session.md``) runs on :class:`HubSession` and :class:`ClientSession`. A
client subscribes before it says hello and repeats the hello until welcomed, so neither start
order nor a late hub loses a message. Sessions are named in the topics: a stale will or a
stranger's bye cannot end a newer session, and the hub reads a topic with no open session under
the small hello limits, taking nothing from it but a hello.

Both sides keep themselves connected: paho reconnects with backoff, the MQTT session (clean
start off, an expiry) keeps subscriptions and queued messages on a broker that keeps them, and
publishes the broker had not acknowledged are sent again (a receiver drops a repeated message
id). A will does not end a session at once: the peer has ``WILL_GRACE_S`` seconds of connected
time to say hello again, because Mosquitto sends every will when it shuts down.

Publishing waits for the broker's acknowledgement of each chunk (PUBACK at QoS 1, PUBCOMP at
QoS 2; the socket write at QoS 0), a window of them in flight, so a send returns when the broker
holds the whole message. Each paho client runs its network loop in its own thread.

Security: TLS protects each connection to the broker, the broker's user name and password admit
it, and the session's hello proves the device's secret to the hub. Any other user of the
broker can still publish on these topics, so a session with a key seals every payload after the
welcome with a MAC trailer (``security.seal``; one entry per member on a broadcast) that the
receiver checks before it reassembles anything; a client's will, and a bye before its welcome,
are sealed with a key both sides derive from the secret and the session id (``will.will_key``).

Files: ``settings`` (the URL, topics, timing), ``connection`` (paho, publishing), ``will``,
``hub``, ``channel``; sealing, reassembly, the medium and graces are ``transports.broker``'s.
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
