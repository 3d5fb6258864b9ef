"""The channel of a broker transport: its session's sealing, what it holds until the welcome
brings the key to check it, the inbox of whole messages, and the medium lost / back."""

from __future__ import annotations

import itertools
import logging
from typing import Any

from tensorwire.errors import (
    AuthenticationError,
    PeerGone,
    TransportError,
    TransportTimeout,
    WireError,
)
from tensorwire.transports.base import Channel, Inbox, _log_limited
from tensorwire.transports.security import ReplayWindow, Sealer
from tensorwire.transports.session import ClientSession, State, Welcomed
from tensorwire.transports.url import redacted
from tensorwire.wire import PREFIX_SIZE, Message

log = logging.getLogger("tensorwire.transports.broker")

# Bytes of the hub's payloads a channel with a secret holds before the welcome that lets it check
# them (data the hub sends from on_join may overtake the welcome on another topic or queue).
EARLY_BYTES = 64 << 20


class BrokerChannel(Channel):
    """A channel whose hub is reached through a broker."""

    _session: ClientSession
    _inbox: Inbox  # whole messages for recv
    _forged: AuthenticationError | None = None  # why a welcome was not the hub's

    def _abandon(self) -> None:
        """A connect that failed for good: release it, and what the broker holds for it."""
        self._drop()

    @property
    def _shown(self) -> str:
        """The URL in messages: its password stays out of them."""
        return redacted(self.url)

    @property
    def _most_bytes(self) -> int:
        """The largest whole message this channel reassembles, bytes."""
        return PREFIX_SIZE + self.limits.max_header_bytes + self.limits.max_message_bytes

    def reconnect(self, timeout: float | None = None) -> None:
        """The template's, and a broker's own: an attempt that fails for good releases what
        the broker holds for it, and a welcome that failed its proof is said (no hub that
        knows our secret answered, though something did)."""
        self._forged = None
        try:
            super().reconnect(timeout)
        except TransportTimeout:
            self._abandon()
            if self._forged is None:
                raise
            waited = self.options.timeouts.connect if timeout is None else timeout
            raise AuthenticationError(
                f"no hub that knows {self.client_id!r}'s secret welcomed it at {self._shown} "
                f"within {waited} s: {self._forged}"
            ) from None
        except BaseException:
            self._abandon()
            raise

    # -- the session -------------------------------------------------------------------------

    def _begin_session(self, **hello_meta: Any) -> None:
        """A fresh session, with its hello (encoded once: every repeat is the same bytes, whose
        nonce the hub checks once) and the numbers of its sealed payloads, ours and the hub's."""
        self._session = self._client_session(f"the hub at {self._shown}", **hello_meta)
        self._hello = self._session.hello()
        self._seq = itertools.count()
        self._window = ReplayWindow()
        self._early: list[Any] = []  # the hub's payloads, before the key to check them
        self._early_bytes = 0

    def _sealer(self) -> Sealer | None:
        """What seals this session's payloads once it has a key; None before, or without."""
        key = self._session.key
        return None if key is None else Sealer([key], self.client_id.encode(), self._seq)

    def _answer(self, msg: Message) -> Welcomed | Exception | None:
        """What ``msg`` answers to our hello: the welcome, or why there is no session (refused,
        another version, not a hub); None for a welcome without proof of our secret (forged, or
        another hub's), rejected and kept in :attr:`_forged`, or anything else."""
        s = self._session
        try:
            event = s.receive(msg)
        except AuthenticationError as exc:
            if s.state is not State.AWAIT_WELCOME:  # the hub refused our credential
                return exc
            self._forged = exc
            self._rejected(exc)
            return None
        except TransportError as exc:
            return exc
        return event if isinstance(event, Welcomed) else None

    def _hold(self, item: Any, nbytes: int) -> None:
        """Keep a payload that may be the hub's until the welcome's key can check it (dropped
        past :data:`EARLY_BYTES`)."""
        if self._early_bytes + nbytes > EARLY_BYTES:
            self._dropped(f"more than {EARLY_BYTES} bytes came before the welcome")
            return
        self._early.append(item)
        self._early_bytes += nbytes

    def _take_held(self) -> list[Any]:
        """What came before the welcome, to check now that its key is here."""
        early, self._early, self._early_bytes = self._early, [], 0
        return early

    def _dropped(self, what: object, where: str = "") -> None:
        """Log, rate-limited per ``where``, a message dropped unread (not the hub's, or bad)."""
        on = f" on {where}" if where else ""
        _log_limited(
            f"{self.protocol} {self.client_id} {where}",
            f"{self.protocol}: {self.client_id!r} dropped a message{on}: {what}",
        )

    # -- the medium --------------------------------------------------------------------------

    def _medium_lost(self, detail: str) -> None:
        log.warning("%s: %r %s; reconnecting", self.protocol, self.client_id, detail)

    def _medium_back(self, detail: str, kept: bool = True) -> None:
        (log.info if kept else log.warning)("%s: %r is %s", self.protocol, self.client_id, detail)

    # -- receiving ---------------------------------------------------------------------------

    def _recv_message(self, deadline: float | None, out: Any) -> Message:
        """The next data message: the inbox holds decoded messages, or ``(bytes, time of the
        first chunk)`` that are decoded here, into ``out``."""
        while True:
            if self._closed:
                raise PeerGone("channel is closed; call reconnect()")
            item = self._inbox.get(deadline)
            if isinstance(item, Message):
                return item
            buf, first_byte_at = item
            try:
                msg = self._decode_whole(buf, first_byte_at, out=out)
            except WireError as exc:
                self._dropped(exc)
                continue
            if msg.kind == "data":
                return msg
            self._dropped(f"a {msg.kind!r} message where only data goes")
