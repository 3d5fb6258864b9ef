"""The session every transport drives: hello -> welcome -> data -> bye, as a sans-IO machine.

Like ``wire`` (and h11), nothing here touches a socket, a topic or a queue: a transport hands
each whole message it received to :meth:`HubSession.receive` / :meth:`ClientSession.receive`
and gets back an event (:class:`Joined`, :class:`Data`, :class:`Closed` ...), and it sends the
control messages these objects encode (:meth:`ClientSession.hello`, :meth:`HubSession.welcome`,
:meth:`HubSession.refusal`, :func:`bye`). ``docs/session.md`` specifies the messages.

What a session settles before any data flows:

- the protocol version (a peer of another version gets :class:`VersionMismatch` naming both);
- the codecs each side can decode (a sender never uses one its peer cannot decode);
- the largest message each side accepts (a sender refuses to send a bigger one, so the error
  is the sender's, not a silent drop at the receiver);
- the credential check: :class:`HubSession` takes an ``authenticate`` callable (a
  :class:`~tensorwire.transports.security.KeyAuthenticator`) that sees the hello and the TLS
  peer's certificate name, raises :class:`~tensorwire.errors.AuthenticationError` to refuse it
  and otherwise returns the welcome's proof and the session key; a :class:`ClientSession` with
  a ``secret`` proves it in its hello and checks the hub's proof (``docs/security.md``).
"""

from __future__ import annotations

import enum
import re
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tensorwire.errors import (
    AuthenticationError,
    PeerGone,
    SessionRefused,
    TransportError,
    VersionMismatch,
)
from tensorwire.transports.security import check_welcome, hello_auth
from tensorwire.wire import EncodedMessage, Limits, Message, encode_message

Authenticate = Callable[["Hello", str | None], tuple[Mapping[str, Any], bytes | None]]
"""``authenticate(hello, tls_name) -> (welcome auth fields, session key or None)``."""

PROTOCOL_VERSION = 2
"""The session protocol this build speaks (``hello.version``). 1 was the unchecked handshake
of tensorwire 0.1; 2 adds ``max_message_bytes``, ``session`` and the ``refuse`` answer."""

CLIENT_ID = re.compile(r"^[A-Za-z0-9._:@+=-]{1,128}$")
"""A client id: 1 to 128 characters that are safe in topic, queue and file names."""

CONTROL_KINDS = frozenset({"hello", "welcome", "refuse", "bye"})

HELLO_LIMITS = Limits(max_header_bytes=64 << 10, max_message_bytes=64 << 10, max_tensors=1)
"""What a hub reads from a peer that has not said hello yet: a stranger's first message can
make it allocate at most 64 KiB, whatever its prefix declares."""


class State(enum.Enum):
    AWAIT_HELLO = "await hello"  # hub: a new connection, nothing said yet
    AWAIT_WELCOME = "await welcome"  # client: said hello
    OPEN = "open"  # data may flow both ways
    CLOSED = "closed"  # bye said or heard, or refused


@dataclass(frozen=True)
class Hello:
    """What a client says first: who it is and what it accepts."""

    client_id: str
    decoders: frozenset[str]
    version: int
    max_message_bytes: int | None
    session: str  # a fresh id per session, so a stale bye or will cannot end a newer one
    meta: Mapping[str, Any] = field(default_factory=dict)  # the whole hello, transport fields too


@dataclass(frozen=True)
class Joined:
    """Hub event: a client completed its hello; send :meth:`HubSession.welcome` back."""

    hello: Hello

    @property
    def client_id(self) -> str:
        return self.hello.client_id


@dataclass(frozen=True)
class Welcomed:
    """Client event: the hub accepted the hello."""

    decoders: frozenset[str]
    max_message_bytes: int | None
    meta: Mapping[str, Any]


@dataclass(slots=True)  # not frozen: made for every message, and frozen costs ~0.5 us
class Data:
    """A data message from the peer."""

    message: Message


@dataclass(frozen=True)
class Closed:
    """The peer said goodbye (or, for a client, the hub did)."""

    reason: str


@dataclass(frozen=True)
class Ignored:
    """A message with no effect in this state (a repeated hello or welcome, an unknown kind)."""

    reason: str


Event = Joined | Welcomed | Data | Closed | Ignored


def _decoders(meta: Mapping[str, Any], who: str) -> frozenset[str]:
    decoders = meta.get("decoders", [])
    if not isinstance(decoders, list) or not all(isinstance(d, str) for d in decoders):
        raise SessionRefused(f"{who}: 'decoders' must be a list of codec ids")
    return frozenset(decoders)


def _max_bytes(meta: Mapping[str, Any], who: str) -> int | None:
    value = meta.get("max_message_bytes")
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise SessionRefused(f"{who}: 'max_message_bytes' must be a positive integer")
    return value


def _version(meta: Mapping[str, Any]) -> int:
    value = meta.get("version", 1)
    return value if isinstance(value, int) and not isinstance(value, bool) else -1


def parse_hello(msg: Message) -> Hello:
    """Validate a client's hello; :class:`SessionRefused` (or its :class:`VersionMismatch`)
    says what is wrong."""
    if msg.kind != "hello":
        raise SessionRefused(f"a session must open with a hello, not a {msg.kind!r} message")
    meta = msg.meta
    version = _version(meta)
    if version != PROTOCOL_VERSION:
        raise VersionMismatch(ours=PROTOCOL_VERSION, theirs=version, peer="client")
    cid = meta.get("client_id")
    if not isinstance(cid, str) or not CLIENT_ID.match(cid):
        raise SessionRefused(
            f"hello: client_id {cid!r} must be 1 to 128 letters, digits or ._:@+=-"
        )
    session = meta.get("session")
    if not isinstance(session, str) or not 1 <= len(session) <= 64:
        raise SessionRefused("hello: 'session' must be an id of 1 to 64 characters")
    return Hello(
        client_id=cid,
        decoders=_decoders(meta, "hello"),
        version=version,
        max_message_bytes=_max_bytes(meta, "hello"),
        session=session,
        meta=dict(meta),
    )


def bye(reason: str = "") -> EncodedMessage:
    """The goodbye either side sends before it closes."""
    return encode_message(None, {"reason": reason} if reason else {}, kind="bye")


class HubSession:
    """The hub's side of one client's session.

    ``authenticate`` (optional, see :data:`Authenticate`) raises :class:`AuthenticationError`
    to refuse a client; ``tls_name`` is the common name of the client's verified TLS
    certificate, where the transport has one; ``welcome_meta`` adds transport fields to the
    welcome (a UDP mode, say). After the hello, :attr:`key` is the session key (or None).
    """

    def __init__(
        self,
        *,
        decoders: list[str],
        max_message_bytes: int,
        authenticate: Authenticate | None = None,
        tls_name: str | None = None,
        welcome_meta: Mapping[str, Any] | None = None,
    ) -> None:
        self.state = State.AWAIT_HELLO
        self.hello: Hello | None = None
        self.key: bytes | None = None
        self._decoders = list(decoders)
        self._max_message_bytes = max_message_bytes
        self._authenticate = authenticate
        self._tls_name = tls_name
        self._welcome_meta = dict(welcome_meta or {})
        self._welcome_auth: Mapping[str, Any] = {}

    @property
    def client_id(self) -> str | None:
        return None if self.hello is None else self.hello.client_id

    def receive(self, msg: Message) -> Event:
        """Act on one message from the client.

        Raises :class:`SessionRefused` (send :meth:`refusal` of it, then close) when the hello
        is malformed, of another version or not authenticated; after that, every message is
        an event and nothing raises.
        """
        if self.state is State.AWAIT_HELLO:
            try:
                hello = parse_hello(msg)
                if self._authenticate is not None:
                    self._welcome_auth, self.key = self._authenticate(hello, self._tls_name)
            except SessionRefused:
                self.state = State.CLOSED
                raise
            self.hello = hello
            self.state = State.OPEN
            return Joined(hello)
        if self.state is State.CLOSED:
            return Ignored("session is closed")
        if msg.kind == "data":
            return Data(msg)
        if msg.kind == "bye":
            self.state = State.CLOSED
            reason = msg.meta.get("reason")
            return Closed(f"said goodbye ({reason})" if reason else "said goodbye")
        if msg.kind == "hello":
            return Ignored("repeated hello")  # a client that missed the welcome asks again
        return Ignored(f"unexpected {msg.kind!r} message")

    def welcome(self) -> EncodedMessage:
        """The answer to the hello that :meth:`receive` turned into :class:`Joined`."""
        meta = {
            **self._welcome_meta,
            "version": PROTOCOL_VERSION,
            "decoders": self._decoders,
            "max_message_bytes": self._max_message_bytes,
        }
        if self.hello is not None:
            meta["session"] = self.hello.session
        if self._welcome_auth:
            meta["auth"] = dict(self._welcome_auth)
        return encode_message(None, meta, kind="welcome")

    @staticmethod
    def refusal(exc: SessionRefused) -> EncodedMessage:
        """The answer to a refused hello: its reason, the kind of refusal and our version."""
        meta = {"reason": str(exc), "code": exc.code, "version": PROTOCOL_VERSION}
        return encode_message(None, meta, kind="refuse")


class ClientSession:
    """The client's side of its session with a hub: say :meth:`hello`, feed what comes back.

    With a ``secret`` (this client's enrolled secret) the hello proves it and the welcome must
    prove the hub knows it too; :attr:`key` is then the session key.
    """

    def __init__(
        self,
        client_id: str,
        *,
        decoders: list[str],
        max_message_bytes: int,
        hello_meta: Mapping[str, Any] | None = None,
        where: str = "the hub",
        secret: bytes | None = None,
    ) -> None:
        if not CLIENT_ID.match(client_id):
            raise ValueError(f"client_id {client_id!r} must be 1 to 128 letters, digits or ._:@+=-")
        self.client_id = client_id
        self.session = uuid.uuid4().hex
        self.state = State.AWAIT_HELLO
        self.welcome: Welcomed | None = None
        self._decoders = list(decoders)
        self._max_message_bytes = max_message_bytes
        self._hello_meta = dict(hello_meta or {})
        self._where = where
        self._version = PROTOCOL_VERSION  # the version the hello said
        self._secret = secret
        self._auth: dict[str, Any] = {}
        self.key: bytes | None = None

    def hello(self) -> EncodedMessage:
        """The opening message; may be sent again while no welcome has come."""
        if self.state is State.AWAIT_HELLO:
            self.state = State.AWAIT_WELCOME
        self._version = PROTOCOL_VERSION
        meta = {
            **self._hello_meta,
            "client_id": self.client_id,
            "version": self._version,
            "decoders": self._decoders,
            "max_message_bytes": self._max_message_bytes,
            "session": self.session,
        }
        if self._secret is not None:
            self._auth = hello_auth(self._secret, self.client_id, self.session)
            meta["auth"] = self._auth
        return encode_message(None, meta, kind="hello")

    def receive(self, msg: Message) -> Event:
        """Act on one message from the hub.

        Before the welcome: raises :class:`VersionMismatch`, :class:`AuthenticationError` or
        :class:`SessionRefused` when the hub refuses, ``TransportError`` when it answers
        something else. Once open: data is :class:`Data`, the hub's bye :class:`Closed`.
        """
        if self.state is State.AWAIT_WELCOME:
            if msg.kind == "refuse":
                self.state = State.CLOSED
                raise _refusal_error(msg.meta, self._where, self._version)
            if msg.kind != "welcome":
                raise TransportError(
                    f"{self._where} answered {msg.kind!r} instead of welcome; is it a "
                    "tensorwire hub?"
                )
            version = _version(msg.meta)
            if version != self._version:
                self.state = State.CLOSED
                raise VersionMismatch(ours=self._version, theirs=version, peer=self._where)
            session = msg.meta.get("session")
            if session is not None and session != self.session:
                return Ignored("a welcome for an earlier session")
            if self._secret is not None:
                self.key = check_welcome(
                    self._secret,
                    self.session,
                    self._auth["nonce"],
                    msg.meta.get("auth"),
                    self._where,
                )
            self.welcome = Welcomed(
                decoders=_decoders(msg.meta, "welcome"),
                max_message_bytes=_max_bytes(msg.meta, "welcome"),
                meta=dict(msg.meta),
            )
            self.state = State.OPEN
            return self.welcome
        if self.state is State.CLOSED:
            return Ignored("session is closed")
        if self.state is State.AWAIT_HELLO:
            raise TransportError("say hello before receiving")
        if msg.kind == "data":
            return Data(msg)
        if msg.kind == "bye":
            self.state = State.CLOSED
            return Closed(f"{self._where} closed the session")
        return Ignored(f"unexpected {msg.kind!r} message")

    def closed_error(self) -> PeerGone:
        return PeerGone(f"{self._where} closed the session; call reconnect()")


def _refusal_error(meta: Mapping[str, Any], where: str, ours: int) -> SessionRefused:
    reason = str(meta.get("reason", "no reason given"))
    code = meta.get("code")
    if code == "version":
        return VersionMismatch(ours=ours, theirs=_version(meta), peer=where)
    if code == "auth":
        return AuthenticationError(f"{where} refused this client: {reason}")
    return SessionRefused(f"{where} refused the session: {reason}")
