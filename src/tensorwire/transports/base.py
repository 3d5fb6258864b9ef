"""What every transport's hub and channel share: the API, membership, inbox, gather, records.

A transport subclass supplies the I/O: how to send an encoded message to one peer, and
threads that drive a :mod:`~tensorwire.transports.session` per peer and call
:meth:`Hub._joined`, :meth:`Hub._delivered` and :meth:`Hub._left`. :func:`dial` connects
with a deadline and backoff, :class:`Inbox` hands received messages to ``recv``. Logs that a
stranger can make grow (errors, records, events) are bounded.
"""

from __future__ import annotations

import logging
import math
import operator
import os
import socket
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, fields
from typing import Any, overload

import numpy as np

from tensorwire.codecs import (
    AutoCodec,
    FixedChainSelector,
    available_codecs,
    get_codec,
    resolve_codecs,
)
from tensorwire.errors import (
    GatherTimeout,
    MessageTooLarge,
    PeerGone,
    SessionRefused,
    TransportError,
    TransportTimeout,
)
from tensorwire.transports.security import TLS, KeyAuthenticator, Keys, load_secret
from tensorwire.transports.session import Authenticate, ClientSession
from tensorwire.transports.streams import (
    ACK_KEY,
    DEFAULT_WINDOW,
    AckBook,
    StreamBatch,
    StreamResult,
    ack_fields,
    receive_stream,
    send_stream,
    stream_fields,
)
from tensorwire.transports.url import redacted
from tensorwire.wire import (
    CodecSelector,
    EncodedMessage,
    Limits,
    Message,
    decode_message,
    encode_message,
)

log = logging.getLogger("tensorwire.transports")

MAX_RECORDS = 100_000  # transfer records kept per endpoint (older ones are only counted)
MAX_ERRORS = 1_000  # rejected messages kept per hub (all are counted, by type)
MAX_EVENTS = 10_000  # membership events kept per hub
MAX_HELD = 10_000  # a channel's messages kept while a stream waits for acknowledgements
OPEN_DOOR = "tw_open_door"  # set (True) on the log record of a hub's "accepts ANYONE" warning


@dataclass(slots=True)
class TransferRecord:
    """One message sent or received: sizes in bytes, times in seconds.

    ``wall_s`` is, for a send, from the start of encoding to the last byte handed to the
    transport; for a receive, from the first byte arriving to the last tensor decoded.
    ``e2e_s`` (receives only) runs from the sender's start of encoding, by the two clocks.
    """

    direction: str  # "send" or "recv"
    peer: str
    protocol: str
    kind: str
    tensors: int
    bytes_raw: int
    bytes_encoded: int
    codecs: str
    encode_s: float
    wire_s: float
    decode_s: float
    wall_s: float
    e2e_s: float | None
    started_at: float  # unix seconds

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


_RECORD_VALUES = operator.attrgetter(*(f.name for f in fields(TransferRecord)))
RECENT_RECORDS = 64  # the newest records a RecordLog keeps as the objects it was given


class RecordLog:
    """The last ``maxlen`` transfer records, oldest first, and a count of all ever added.

    ``mark()`` then ``since(mark)`` gives the records added in between (as many as are still
    kept); ``subscribe(fn)`` streams every record out as it is made (from transport threads).

    Records are kept as tuples of their values, which the garbage collector stops tracking
    (a full log of objects cost a 4 KiB message ~4 us in collections), and made records again
    when read; the newest ``RECENT_RECORDS`` are read back as the very objects appended.
    """

    def __init__(self, maxlen: int = MAX_RECORDS) -> None:
        self._items: deque[tuple[Any, ...]] = deque(maxlen=maxlen)
        self._recent: deque[TransferRecord] = deque(maxlen=RECENT_RECORDS)
        self.total = 0
        self._subscribers: list[Callable[[TransferRecord], None]] = []

    def append(self, rec: TransferRecord) -> None:
        self.add(rec, _RECORD_VALUES(rec))

    def add(self, rec: TransferRecord, values: tuple[Any, ...]) -> None:
        """:meth:`append` of a record made from ``values`` (its fields in order)."""
        self._items.append(values)
        self._recent.append(rec)
        self.total += 1
        for fn in self._subscribers:
            fn(rec)

    def _records(self, values: list[tuple[Any, ...]]) -> list[TransferRecord]:
        """Records of the newest ``len(values)`` items, given as ``values``."""
        recent = list(self._recent)
        k = min(len(recent), len(values))
        return [TransferRecord(*v) for v in values[: len(values) - k]] + recent[len(recent) - k :]

    def subscribe(self, fn: Callable[[TransferRecord], None]) -> None:
        self._subscribers.append(fn)

    def mark(self) -> int:
        return self.total

    def since(self, mark: int) -> list[TransferRecord]:
        n = min(self.total - mark, len(self._items))
        return self._records(list(self._items)[len(self._items) - n :]) if n > 0 else []

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[TransferRecord]:
        return iter(self._records(list(self._items)))

    def __getitem__(self, index: int) -> TransferRecord:
        n = len(self._items)
        i = index + n if index < 0 else index
        if not 0 <= i < n:
            raise IndexError("record index out of range")
        if n - i <= len(self._recent):
            return self._recent[i - n]
        return TransferRecord(*self._items[i])

    def __bool__(self) -> bool:
        return bool(self._items)


class ErrorLog:
    """``(peer, exception)`` of the last ``maxlen`` rejected messages; ``counts`` has them all
    by exception type."""

    def __init__(self, maxlen: int = MAX_ERRORS) -> None:
        self._items: deque[tuple[str, Exception]] = deque(maxlen=maxlen)
        self.counts: dict[str, int] = {}

    def append(self, item: tuple[str, Exception]) -> None:
        # a kept traceback would pin its frames, and with them a stranger's buffers
        self._items.append((item[0], item[1].with_traceback(None)))
        name = type(item[1]).__name__
        self.counts[name] = self.counts.get(name, 0) + 1

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[tuple[str, Exception]]:
        return iter(list(self._items))

    def __getitem__(self, index: int) -> tuple[str, Exception]:
        return self._items[index]

    def __bool__(self) -> bool:
        return bool(self._items)


@dataclass(frozen=True)
class MembershipEvent:
    """A change a hub's caller should see: ``kind`` is ``joined``, ``left``, ``refused``,
    ``replaced`` (a client's newer session took over), ``slow`` (a send missed its deadline),
    ``medium-lost`` / ``medium-back`` (the broker connection); ``at`` is unix seconds."""

    kind: str
    client_id: str | None
    reason: str
    at: float


class BroadcastResult(dict[str, TransferRecord]):
    """``broadcast``'s result: a record per client reached; ``failed`` maps each client it did
    not reach (not connected, gone, or past its deadline) to the error."""

    def __init__(self) -> None:
        super().__init__()
        self.failed: dict[str, Exception] = {}


class Inbox:
    """What a channel's transport thread received, for ``recv`` on the caller's thread.

    ``put`` a message; ``fail(exc)`` makes every later ``get`` raise ``exc`` once the queued
    messages are taken (the connection ended); ``get(deadline)`` raises
    :class:`TransportTimeout` when the deadline passes first.
    """

    def __init__(self) -> None:
        self._items: deque[Any] = deque()
        self._cond = threading.Condition()
        self._error: Exception | None = None

    def put(self, item: Any) -> None:
        with self._cond:
            self._items.append(item)
            self._cond.notify()

    def fail(self, exc: Exception) -> None:
        with self._cond:
            if self._error is None:
                self._error = exc
            self._cond.notify_all()

    @property
    def failed(self) -> Exception | None:
        return self._error

    def get(self, deadline: float | None) -> Any:
        with self._cond:
            while not self._items:
                if self._error is not None:
                    raise self._error.with_traceback(None)  # no tracebacks piling up
                left = remaining(deadline)
                if left == 0.0:
                    raise TransportTimeout("no message from the hub in time")
                self._cond.wait(left)
            return self._items.popleft()

    def __len__(self) -> int:
        return len(self._items)


def dial(
    connect: Callable[[float | None], Any],
    *,
    what: str,
    timeout: float | None,
    first_delay: float = 0.02,
    max_delay: float = 1.0,
) -> Any:
    """Call ``connect(deadline)`` until it returns, backing off after each failure.

    A refusal (:class:`SessionRefused`: wrong version, credential ...) is final and raised at
    once; any other ``OSError`` is retried until ``timeout`` seconds have passed, saying so in
    the log ("cannot reach WHAT (why), retrying (n; giving up in S s)"), then
    :class:`TransportTimeout` names the last error.
    """
    deadline = deadline_after(timeout)
    delay = first_delay
    attempt = 0
    while True:
        attempt += 1
        try:
            return connect(deadline)
        except SessionRefused:
            raise
        except OSError as exc:
            left = remaining(deadline)
            if left is not None and left <= delay:
                raise TransportTimeout(
                    f"could not reach {what} within {timeout} s ({attempt} attempts): {exc}"
                ) from None
            if attempt == 1 or attempt % 10 == 0:
                until = "" if left is None else f"; giving up in {left:.0f} s"
                log.info("cannot reach %s (%s), retrying (%d%s)", what, exc, attempt, until)
        time.sleep(delay)
        delay = min(delay * 2, max_delay)


@overload
def deadline_after(timeout: float) -> float: ...
@overload
def deadline_after(timeout: None) -> None: ...
@overload
def deadline_after(timeout: float | None) -> float | None: ...
def deadline_after(timeout: float | None) -> float | None:
    return None if timeout is None else time.monotonic() + timeout


def remaining(deadline: float | None) -> float | None:
    return None if deadline is None else max(deadline - time.monotonic(), 0.0)


def default_client_id() -> str:
    """``host-pid-random``: unique enough for a client that was given no id."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


@dataclass(frozen=True)
class _Member:
    decoders: frozenset[str]
    max_message_bytes: int | None  # the largest message it accepts; None: not announced
    session: object  # the connection it joined on (see Hub._joined)


class _DecodableCodecs:
    """An endpoint's codec selector kept to the codecs a peer decodes (a chain with any other
    goes raw); what a chain achieved goes back to the selector (``auto`` and named codecs
    watch their streams by it, see ``tensorwire.codecs.streams``)."""

    def __init__(self, selector: CodecSelector, decoders: frozenset[str]) -> None:
        self.selector = selector
        self.decoders = decoders

    def __call__(self, name: str, arr: Any) -> list[Any]:
        chain = list(self.selector(name, arr))
        ids = (getattr(c, "codec_id", None) or c.get_config()["id"] for c in chain)
        return chain if all(i in self.decoders for i in ids) else []

    def observe(self, name: str, arr: Any, chain: list[Any], encoded_nbytes: int) -> None:
        observe = getattr(self.selector, "observe", None)
        if observe is not None:
            observe(name, arr, chain, encoded_nbytes)


class _Endpoint:
    """Codec policy, limits and records shared by hubs and channels."""

    protocol = "?"

    def __init__(self, codec: Any, checksum: bool, limits: Limits) -> None:
        self.codec_spec = codec
        self.selector: CodecSelector = resolve_codecs(codec)
        # (selector, raw_below, codecs kept to what the peer decodes) by the peer's decoders
        self._codecs_for: dict[frozenset[str], tuple[Any, float, Any]] = {}
        self.checksum = checksum
        self.limits = limits
        self.records = RecordLog()
        self.errors = ErrorLog()
        self.decoders = available_codecs()
        self._acks = AckBook()
        # a channel's messages that came while a stream waited for acknowledgements
        self._stream_held: deque[Message] = deque()

    def set_codec(self, codec: Any) -> None:
        """Use ``codec`` (anything ``codec=`` takes) for the messages sent from now on."""
        self.codec_spec = codec
        self.selector = resolve_codecs(codec)

    def _encode_for(
        self,
        tensors: Mapping[str, Any] | None,
        meta: Mapping[str, Any] | None,
        peer_decoders: frozenset[str],
        kind: str = "data",
        peer_max_bytes: int | None = None,
        peer: str = "the peer",
        client: str | None = None,
    ) -> EncodedMessage:
        """Encode with this endpoint's codecs, keeping to those the peer can decode; a message
        larger than the peer accepts raises :class:`MessageTooLarge` here, at the sender."""
        selector = self.selector
        chosen = self._codecs_for.get(peer_decoders)
        if chosen is None or chosen[0] is not selector:
            # codec=None: nothing to choose per tensor (half the cost of encoding a stream
            # batch); tensors under the selector's min_size go raw without asking it
            raw_below = _raw_below(selector)
            allowed = None if raw_below == math.inf else _DecodableCodecs(selector, peer_decoders)
            if len(self._codecs_for) >= _MAX_DECODER_SETS:  # peers choose them: bounded
                self._codecs_for.clear()
            chosen = self._codecs_for[peer_decoders] = (selector, raw_below, allowed)
        _, raw_below, allowed = chosen
        enc = encode_message(
            tensors, meta, codecs=allowed, checksum=self.checksum, kind=kind, raw_below=raw_below
        )
        if peer_max_bytes is not None and enc.nbytes > peer_max_bytes:
            raise MessageTooLarge(
                f"a message of {enc.nbytes} bytes is over the {peer_max_bytes} bytes "
                f"{peer if client is None else f'client {client!r}'} "
                "accepts (its Limits.max_message_bytes): send less, or raise its limit"
            )
        return enc

    def _note_send(
        self, peer: str, enc: EncodedMessage, wire_s: float, started: float
    ) -> TransferRecord:
        if isinstance(self.selector, AutoCodec) and enc.nbytes >= 1 << 20 and wire_s > 0:
            self.selector.update_bandwidth(enc.nbytes / wire_s)
        values = (  # TransferRecord's fields, in order (positional: cheaper per message)
            "send",
            peer,
            self.protocol,
            "data",
            len(enc.buffers),
            enc.raw_nbytes,
            enc.nbytes,
            enc.codec_label,
            enc.encode_s,
            wire_s,
            0.0,
            time.perf_counter() - started,
            None,
            enc.t0,
        )
        rec = TransferRecord(*values)
        self.records.add(rec, values)
        return rec

    def _decode_whole(self, buf: Any, first_byte_at: float, out: Any = None) -> Message:
        """Decode a message a transport received whole (or reassembled from chunks).

        ``first_byte_at`` is ``time.perf_counter()`` when its first byte (or chunk) arrived.
        Raw tensors stay views of a writable ``buf`` unless ``out`` holds arrays for them; a
        read-only ``buf`` (a library's ``bytes``) is copied from once, so the caller gets
        arrays it can change and decode into again.
        """
        copy = memoryview(buf).readonly
        msg = decode_message(buf, limits=self.limits, codec_lookup=get_codec, out=out, copy=copy)
        msg.recv_s = time.perf_counter() - first_byte_at
        return msg

    def _note_recv(self, peer: str, msg: Message) -> TransferRecord:
        now = time.time()
        values = (  # TransferRecord's fields, in order
            "recv",
            peer,
            self.protocol,
            msg.kind,
            msg.n_tensors,
            msg.nbytes,
            msg.wire_nbytes,
            msg.codec_label,
            0.0,
            max(msg.recv_s - msg.decode_s, 0.0),
            msg.decode_s,
            msg.recv_s,
            (now - msg.t0) if msg.t0 is not None else None,
            now - msg.recv_s,
        )
        rec = TransferRecord(*values)
        self.records.add(rec, values)
        msg.record = rec
        return rec


class Hub(_Endpoint):
    """The server side: clients join it; it broadcasts, sends, receives and gathers.

    Use as a context manager. ``on_join(client_id)`` / ``on_leave(client_id, reason)``
    are called from transport threads.
    """

    sees_client_certificates = True
    """Whether a TLS client certificate reaches this hub (False on a broker: it reaches the
    broker only, so mutual TLS cannot identify a device to the hub there)."""

    fanout = "concurrent"
    """How :meth:`broadcast` reaches its clients: ``concurrent`` (every connection at once, or
    the transport's own fan-out: one publish on a broker, one segment on shm) or
    ``sequential`` (one unicast after another: the baseline of a server that loops over its
    devices). ``serve(url, fanout=...)`` sets it."""

    def __init__(
        self,
        *,
        codec: Any = "auto",
        checksum: bool = True,
        limits: Limits = Limits(),
        on_join: Callable[[str], None] | None = None,
        on_leave: Callable[[str, str], None] | None = None,
        on_event: Callable[[MembershipEvent], None] | None = None,
        tls: TLS | None = None,
        auth: Keys | Mapping[str, Any] | str | os.PathLike[str] | None = None,
        authenticate: Authenticate | None = None,
    ) -> None:
        super().__init__(codec, checksum, limits)
        self.on_join = on_join
        self.on_leave = on_leave
        self.on_event = on_event
        self.tls = tls
        keys = auth if auth is None or isinstance(auth, Keys) else _keys(auth)
        mutual = tls is not None and tls.mutual and self.sees_client_certificates
        if authenticate is None and (keys is not None or mutual):
            authenticate = KeyAuthenticator(keys, require_tls_name=keys is None)
        self.authenticate = authenticate
        self._open_door_said = False
        self.events: deque[MembershipEvent] = deque(maxlen=MAX_EVENTS)
        self._cond = threading.Condition()
        self._members: dict[str, _Member] = {}
        self._inbox: deque[tuple[str, Message]] = deque()
        self._closed = False
        self._pool = ThreadPoolExecutor(max_workers=16, thread_name_prefix="tensorwire-send")

    # -- what transports implement ---------------------------------------------------

    url: str

    def _send_encoded(self, client_id: str, enc: EncodedMessage, deadline: float | None) -> None:
        raise NotImplementedError

    def _close_transport(self) -> None:
        raise NotImplementedError

    # -- called by transport threads -----------------------------------------------------

    def _session_options(self) -> dict[str, Any]:
        """Keyword arguments for a :class:`~tensorwire.transports.session.HubSession`."""
        return {
            "decoders": self.decoders,
            "max_message_bytes": self.limits.max_message_bytes,
            "authenticate": self.authenticate,
        }

    def _event(self, kind: str, client_id: str | None, reason: str) -> None:
        event = MembershipEvent(kind, client_id, reason, time.time())
        self.events.append(event)
        if self.on_event:
            try:
                self.on_event(event)
            except Exception:  # the caller's bug must not end a transport thread
                log.exception("%s: on_event(%s) raised", self.protocol, event)

    def _joined(
        self,
        client_id: str,
        decoders: frozenset[str],
        session: object = None,
        max_message_bytes: int | None = None,
    ) -> None:
        """``client_id`` is a member now. ``session`` (a connection object) ties the
        membership to one connection, so that an old connection's late :meth:`_left` cannot
        remove the client that has since reconnected."""
        self._announce_member(
            client_id, self._make_member(client_id, decoders, session, max_message_bytes)
        )

    def _make_member(
        self,
        client_id: str,
        decoders: frozenset[str],
        session: object = None,
        max_message_bytes: int | None = None,
    ) -> bool:
        """The membership half of :meth:`_joined` (no logs, events or callbacks), for a
        transport that must be a member before its welcome goes out; True if it replaced one."""
        with self._cond:
            replaced = client_id in self._members
            self._members[client_id] = _Member(decoders, max_message_bytes, session)
            self._cond.notify_all()
        return replaced

    def _announce_member(self, client_id: str, replaced: bool) -> None:
        """The other half of :meth:`_joined`: the log line, event and ``on_join``."""
        log.info("%s: client %r joined", self.protocol, client_id)
        if self.authenticate is None and not self._open_door_said:
            self._open_door_said = True
            log.warning(
                "%s: the hub at %s accepts ANYONE who can reach it (%r joined with no "
                "credential): serve(..., auth=tensorwire.Keys.load(DIR)) and tls=tensorwire.TLS("
                "...) to admit only enrolled devices (tensorwire certs makes the files)",
                self.protocol,
                redacted(getattr(self, "url", "?")),
                client_id,
                extra={OPEN_DOOR: True},  # a benchmark's own loopback hubs say it once, their way
            )
        self._event("replaced" if replaced else "joined", client_id, "said hello")
        if self.on_join:
            self.on_join(client_id)

    def _left(self, client_id: str, reason: str, session: object = None) -> None:
        """``client_id`` left; with ``session``, only if that connection is still its own."""
        with self._cond:
            member = self._members.get(client_id)
            if member is None or (session is not None and member.session is not session):
                return  # unknown, or an older connection's end: the client is back on a newer one
            del self._members[client_id]
            self._cond.notify_all()
        log.info("%s: client %r left: %s", self.protocol, client_id, reason)
        self._event("left", client_id, reason)
        if self.on_leave:
            self.on_leave(client_id, reason)

    def _refused(self, who: str, exc: Exception) -> None:
        """A session was refused (bad hello, version, credential): logged, rate-limited."""
        # one key per kind of refusal and host (not port): a flood of connections logs once
        host = who.rsplit(":", 1)[0]
        _log_limited(
            f"refused {type(exc).__name__} {host}",
            f"{self.protocol}: refused a session from {who}: {exc}",
        )
        self._event("refused", None, f"{who}: {exc}")

    def _delivered(self, client_id: str, msg: Message) -> None:
        self._note_recv(client_id, msg)
        ack = ack_fields(msg.meta)
        if ack is not None:  # a stream's receiver consumed some: for send_many, not recv
            self._acks.note(client_id, *ack)
            return
        with self._cond:
            self._inbox.append((client_id, msg))
            self._cond.notify_all()

    def _take_delivered(self, client_id: str, msg: Message) -> tuple[str, Message] | None:
        """:meth:`_delivered` by a thread about to take the inbox's next message (a ``recv``
        that read it itself): that message, without queueing ``msg`` when nothing is queued
        before it; None when ``msg`` was a stream acknowledgement."""
        self._note_recv(client_id, msg)
        ack = ack_fields(msg.meta) if msg.meta else None
        if ack is not None:
            self._acks.note(client_id, *ack)
            return None
        if not self._inbox:  # one look under the GIL: what another thread queues after it
            return client_id, msg  # comes after this message, as if this one took the lock
        with self._cond:
            if not self._inbox:
                return client_id, msg
            self._inbox.append((client_id, msg))
            self._cond.notify_all()
            return self._inbox.popleft()

    def _rejected(self, client_id: str, exc: Exception) -> None:
        _log_limited(
            f"rejected {client_id}",
            f"{self.protocol}: dropped a message from {client_id!r}: {exc}",
        )
        self.errors.append((client_id, exc))

    # -- public API ------------------------------------------------------------------

    @property
    def clients(self) -> list[str]:
        """Ids of the clients connected now, sorted."""
        with self._cond:
            return sorted(self._members)

    def wait_for(self, n: int, timeout: float | None = None) -> list[str]:
        """Block until at least ``n`` clients have joined; return their ids."""
        deadline = deadline_after(timeout)
        with self._cond:
            while len(self._members) < n:
                left = remaining(deadline)
                if left == 0.0:
                    raise TransportTimeout(
                        f"only {len(self._members)} of {n} clients joined within {timeout} s: "
                        f"{sorted(self._members)}"
                    )
                self._cond.wait(left)
            return sorted(self._members)

    def send(
        self,
        client_id: str,
        tensors: Mapping[str, Any] | None = None,
        meta: Mapping[str, Any] | None = None,
        *,
        timeout: float | None = None,
    ) -> TransferRecord:
        """Send one message to one client; return its transfer record.

        Raises :class:`PeerGone` if it is not connected (or the hub is closed),
        :class:`TransportTimeout` past ``timeout`` seconds, :class:`MessageTooLarge` if the
        message is over what the client accepts.
        """
        started = time.perf_counter()
        enc = self._encode_to(client_id, tensors, meta)
        deadline = None if timeout is None else time.monotonic() + timeout  # deadline_after
        t = time.perf_counter()
        self._send_encoded(client_id, enc, deadline)
        return self._note_send(client_id, enc, time.perf_counter() - t, started)

    def _encode_to(
        self, client_id: str, tensors: Mapping[str, Any] | None, meta: Mapping[str, Any] | None
    ) -> EncodedMessage:
        """Encode a message for a member with the codecs and limits it announced."""
        member = None if self._closed else self._members.get(client_id)  # atomic: no lock
        if member is None:
            raise PeerGone(self._not_connected(client_id))
        return self._encode_for(
            tensors,
            meta,
            member.decoders,
            peer_max_bytes=member.max_message_bytes,
            client=client_id,
        )

    def _start_send(
        self, client_id: str, enc: EncodedMessage, deadline: float | None
    ) -> Callable[[], None]:
        """Start sending a stream's message; the call returned waits until it is sent (and
        raises what the send raised). This one sends at once; a transport whose sends are
        queued for a writer thread returns before the write, so the stream's next message is
        encoded while this one is written."""
        self._send_encoded(client_id, enc, deadline)
        return _sent

    def _not_connected(self, client_id: str) -> str:
        if self._closed:
            return f"the hub at {redacted(self.url)} is closed"
        return f"client {client_id!r} is not connected (connected: {self.clients})"

    def broadcast(
        self,
        tensors: Mapping[str, Any] | None = None,
        meta: Mapping[str, Any] | None = None,
        *,
        timeout: float | None = None,
        clients: list[str] | None = None,
    ) -> dict[str, TransferRecord]:
        """Send one message to every client (or to ``clients``), concurrently.

        The message is encoded once per set of codecs the clients can decode. Each client's
        send has the same deadline, so a slow or hung one does not hold up the others past it.
        Returns a :class:`BroadcastResult`: a record per client reached, and ``.failed`` for
        each one not reached (not connected, gone, over its size limit, past the deadline),
        which is also logged and, for a missed deadline, a ``slow`` event.
        """
        started = time.perf_counter()
        deadline = deadline_after(timeout)
        out = BroadcastResult()
        with self._cond:
            if self._closed:
                raise PeerGone(f"the hub at {redacted(self.url)} is closed")
            wanted = list(self._members) if clients is None else list(clients)
            targets = {c: self._members[c] for c in wanted if c in self._members}
        for c in wanted:
            if c not in targets:
                out.failed[c] = PeerGone(f"client {c!r} is not connected")
        groups: dict[tuple[frozenset[str], int | None], list[str]] = {}
        for c, member in targets.items():
            groups.setdefault((member.decoders, member.max_message_bytes), []).append(c)
        sends: list[tuple[list[str], EncodedMessage]] = []
        for (decoders, max_bytes), members in groups.items():
            try:
                sends.append(
                    (members, self._encode_for(tensors, meta, decoders, peer_max_bytes=max_bytes))
                )
            except MessageTooLarge as exc:
                out.failed.update(dict.fromkeys(members, exc))
        results: list[dict[str, float | Exception]] = [{} for _ in sends]
        send_many = self._send_sequentially if self.fanout == "sequential" else self._send_many

        def send_group(i: int) -> None:
            results[i] = send_many(sends[i][0], sends[i][1], deadline)

        # groups go at once: a hung client in one must not hold up the next past the deadline
        extra = [threading.Thread(target=send_group, args=(i,)) for i in range(1, len(sends))]
        for t in extra:
            t.start()
        if sends:
            send_group(0)
        for t in extra:
            t.join()
        for (_, enc), group in zip(sends, results, strict=True):
            for c, result in group.items():
                if isinstance(result, Exception):
                    out.failed[c] = result
                else:
                    out[c] = self._note_send(c, enc, result, started)
        for c, err in out.failed.items():
            log.warning("%s: broadcast to %r failed: %s", self.protocol, c, err)
            if isinstance(err, TransportTimeout):
                self._event("slow", c, f"missed the broadcast deadline: {err}")
        return out

    def _send_sequentially(
        self, clients: list[str], enc: EncodedMessage, deadline: float | None
    ) -> dict[str, float | Exception]:
        """``fanout="sequential"``: one client after another, each to its own connection, as
        a server that loops over its devices does (FedComm's TCP server did). A client's time
        runs from the start of the broadcast, waits for those before it included."""
        t0 = time.perf_counter()
        results: dict[str, float | Exception] = {}
        for c in clients:
            try:
                self._send_encoded(c, enc, deadline)
                results[c] = time.perf_counter() - t0
            except Exception as exc:
                results[c] = exc
        return results

    def _send_many(
        self, clients: list[str], enc: EncodedMessage, deadline: float | None
    ) -> dict[str, float | Exception]:
        """Send ``enc`` to each client; return its wire seconds, or the exception it raised.

        Concurrent unicast sends by default; transports with native fan-out (an MQTT topic,
        an AMQP fanout exchange, a ZeroMQ PUB socket) override this to publish once.
        """

        def timed(c: str) -> float:
            t = time.perf_counter()
            self._send_encoded(c, enc, deadline)
            return time.perf_counter() - t

        if len(clients) == 1:  # no hand-off to a worker thread for a single client
            try:
                return {clients[0]: timed(clients[0])}
            except Exception as exc:
                return {clients[0]: exc}
        futures = {c: self._pool.submit(timed, c) for c in clients}
        results: dict[str, float | Exception] = {}
        for c, fut in futures.items():
            try:
                results[c] = fut.result()
            except Exception as exc:
                results[c] = exc
        return results

    def recv(self, timeout: float | None = None) -> tuple[str, Message]:
        """The next message from any client, as ``(client_id, message)``."""
        deadline = deadline_after(timeout)
        with self._cond:
            while not self._inbox:
                left = remaining(deadline)
                if left == 0.0 or self._closed:
                    raise TransportTimeout(f"no message within {timeout} s")
                self._cond.wait(left)
            return self._inbox.popleft()

    def gather(
        self, timeout: float | None = None, clients: list[str] | None = None
    ) -> Iterator[tuple[str, Message]]:
        """Yield one message from each client (default: all connected now), as they arrive.

        A client that leaves meanwhile is no longer waited for. Messages from clients already
        answered stay queued for the next ``recv``/``gather``. Raises ``GatherTimeout`` (with
        ``.missing``) when ``timeout`` seconds pass first.
        """
        deadline = deadline_after(timeout)
        waiting = set(self.clients if clients is None else clients)
        while waiting:
            with self._cond:
                found = next((i for i, (c, _) in enumerate(self._inbox) if c in waiting), None)
                if found is None:
                    gone = waiting - self._members.keys()
                    if gone:
                        log.warning(
                            "%s: gather stops waiting for %s: left", self.protocol, sorted(gone)
                        )
                        waiting -= gone
                        continue
                    left = remaining(deadline)
                    if left == 0.0 or self._closed:
                        raise GatherTimeout(
                            f"gather timed out after {timeout} s waiting for {sorted(waiting)}",
                            missing=sorted(waiting),
                        )
                    self._cond.wait(left)
                    continue
                client, msg = self._inbox[found]
                del self._inbox[found]
            waiting.discard(client)
            yield client, msg

    def send_many(
        self,
        client_id: str,
        batches: Iterable[Any],
        *,
        window: int = DEFAULT_WINDOW,
        timeout: float | None = None,
    ) -> StreamResult:
        """Send ``batches`` (mappings of tensors, or ``(tensors, meta)`` pairs) to one client
        as a stream: at most ``window`` unconsumed at once, so a client that stops consuming
        stops this sender (``TransportTimeout`` after ``timeout`` seconds without progress).
        Returns when the client's :meth:`Channel.stream` has consumed the last batch."""

        def wait_acked(sid: str, n: int, deadline: float | None) -> bool:
            if self._acks.acked(client_id, sid) >= n:  # the window is open: nothing to wait
                return True
            while not self._await_ack(client_id, sid, n, _soon(deadline)):
                with self._cond:
                    if client_id not in self._members:
                        raise PeerGone(self._not_connected(client_id))
                if deadline is not None and time.monotonic() >= deadline:
                    return False
            return True

        def start(tensors: Mapping[str, Any] | None, meta: Mapping[str, Any]) -> Any:
            started = time.perf_counter()
            enc = self._encode_to(client_id, tensors, meta)
            t = time.perf_counter()
            wait = self._start_send(client_id, enc, deadline_after(timeout))

            def sent() -> TransferRecord:
                wait()
                return self._note_send(client_id, enc, time.perf_counter() - t, started)

            return enc.nbytes, sent

        return send_stream(
            start,
            wait_acked,
            batches,
            window=window,
            timeout=timeout,
            peer=f"client {client_id!r}",
        )

    def _await_ack(self, client_id: str, sid: str, n: int, deadline: float | None) -> bool:
        """Wait until ``client_id`` has acknowledged ``n`` of stream ``sid``; False at the
        deadline. Here the transport's reader delivers acknowledgements; a transport whose
        caller can read the connection itself reads them in this call instead."""
        return self._acks.wait(client_id, sid, n, deadline)

    def stream(
        self, client_id: str | None = None, *, timeout: float | None = None
    ) -> Iterator[StreamBatch]:
        """Iterate over the next stream a client (or ``client_id``) sends with
        :meth:`Channel.send_many`, batch by batch, until its end; ``timeout`` bounds the wait
        for each batch. Other messages stay queued for ``recv``."""
        who: list[str] = [] if client_id is None else [client_id]

        def next_message(deadline: float | None, sid: str | None) -> Message:
            with self._cond:
                while True:
                    for i, (c, msg) in enumerate(self._inbox):
                        if who and c != who[0]:
                            continue
                        fields = stream_fields(msg.meta)
                        if fields is not None and (sid is None or fields[0] == sid):
                            del self._inbox[i]
                            if not who:
                                who.append(c)
                            return msg
                    if who and who[0] not in self._members:
                        raise PeerGone(f"client {who[0]!r} left in the middle of a stream")
                    left = remaining(deadline)
                    if left == 0.0 or self._closed:
                        raise TransportTimeout(f"no stream batch within {timeout} s")
                    self._cond.wait(left)

        def send_ack(sid: str, n: int) -> None:
            self.send(who[0], None, {ACK_KEY: [sid, n]}, timeout=timeout)

        yield from receive_stream(next_message, send_ack, timeout=timeout)

    def close(self) -> None:
        """Say goodbye to every client, stop the transport's threads, free the port."""
        if self._closed:
            return
        self._close_transport()
        with self._cond:
            self._closed = True
            self._members.clear()
            self._cond.notify_all()
        self._pool.shutdown(wait=True)

    def __enter__(self) -> Hub:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Channel(_Endpoint):
    """The client side: one connection to a hub. Use as a context manager."""

    client_id: str
    hub_decoders: frozenset[str]
    hub_max_bytes: int | None = None  # the largest message the hub accepts (its welcome)
    tls: TLS | None = None
    secret: bytes | None = None  # this client's enrolled secret, proven in every hello

    def _rejected(self, exc: Exception) -> None:
        """Something on this channel's medium was not a valid message from the hub: counted in
        :attr:`errors`, logged (rate-limited), never raised from ``recv``."""
        self.errors.append(("hub", exc))
        _log_limited(
            f"channel {self.client_id} {type(exc).__name__}",
            f"{self.protocol}: {self.client_id}: dropped a message not from the hub: {exc}",
        )

    def _credentials(self, tls: TLS | None, key: Any) -> None:
        """Keep the channel's TLS settings and secret (bytes, hex, or a file of hex)."""
        self.tls = tls
        self.secret = None if key is None else load_secret(key)

    def _client_session(self, where: str, **hello_meta: Any) -> ClientSession:
        """A fresh session for one connection attempt, with this channel's settings."""
        return ClientSession(
            self.client_id,
            decoders=self.decoders,
            max_message_bytes=self.limits.max_message_bytes,
            hello_meta=hello_meta,
            where=where,
            secret=self.secret,
        )

    def _send_encoded(self, enc: EncodedMessage, deadline: float | None) -> None:
        raise NotImplementedError

    def _recv_message(self, deadline: float | None, out: Any) -> Message:
        raise NotImplementedError

    def send(
        self,
        tensors: Mapping[str, Any] | None = None,
        meta: Mapping[str, Any] | None = None,
        *,
        timeout: float | None = None,
    ) -> TransferRecord:
        """Send one message to the hub; return its transfer record."""
        started = time.perf_counter()
        enc = self._encode_for(
            tensors, meta, self.hub_decoders, peer_max_bytes=self.hub_max_bytes, peer="the hub"
        )
        deadline = None if timeout is None else time.monotonic() + timeout  # deadline_after
        t = time.perf_counter()
        self._send_encoded(enc, deadline)
        return self._note_send("hub", enc, time.perf_counter() - t, started)

    def recv(
        self, timeout: float | None = None, *, out: Mapping[Any, Any] | None = None
    ) -> Message:
        """The next message from the hub.

        ``out`` (nested like the message, or keyed by name-path tuples) holds arrays to decode
        into where dtype, shape and order match; others get new arrays.
        """
        if self._stream_held:
            return self._stream_held.popleft()
        deadline = deadline_after(timeout)
        while True:
            msg = self._next_from_hub(deadline, _out_by_path(out))
            if msg is not None:
                return msg

    def _next_from_hub(self, deadline: float | None, out: Any = None) -> Message | None:
        """The next message from the hub, or None when it was a stream acknowledgement
        (noted for :meth:`send_many`)."""
        msg = self._recv_message(deadline, out)
        self._note_recv("hub", msg)
        ack = ack_fields(msg.meta) if msg.meta else None
        if ack is None:
            return msg
        self._acks.note("hub", *ack)
        return None

    def _hold_for_recv(self, msg: Message) -> None:
        """Keep a message that came while a stream waited, for the next ``recv``."""
        if len(self._stream_held) >= MAX_HELD:
            raise TransportError(
                f"the hub sent {MAX_HELD} messages nobody received while a stream waited: "
                "call recv(), or stream with a larger window"
            )
        self._stream_held.append(msg)

    def send_many(
        self,
        batches: Iterable[Any],
        *,
        window: int = DEFAULT_WINDOW,
        timeout: float | None = None,
    ) -> StreamResult:
        """Send ``batches`` (mappings of tensors, or ``(tensors, meta)`` pairs) to the hub as
        a stream: at most ``window`` unconsumed at once, so a hub that stops consuming stops
        this sender (``TransportTimeout`` after ``timeout`` seconds without progress).
        Returns when the hub's :meth:`Hub.stream` has consumed the last batch."""

        def wait_acked(sid: str, n: int, deadline: float | None) -> bool:
            while self._acks.acked("hub", sid) < n:
                try:
                    msg = self._next_from_hub(deadline)
                except TransportTimeout:
                    return False
                if msg is not None:
                    self._hold_for_recv(msg)
            return True

        def start(tensors: Mapping[str, Any] | None, meta: Mapping[str, Any]) -> Any:
            record = self.send(tensors, meta, timeout=timeout)
            return record.bytes_encoded, lambda: record

        return send_stream(
            start,
            wait_acked,
            batches,
            window=window,
            timeout=timeout,
            peer="the hub",
        )

    def stream(self, *, timeout: float | None = None) -> Iterator[StreamBatch]:
        """Iterate over the next stream the hub sends with :meth:`Hub.send_many`, batch by
        batch, until its end; ``timeout`` bounds the wait for each batch. Other messages stay
        queued for ``recv``."""

        def next_message(deadline: float | None, sid: str | None) -> Message:
            for i, held in enumerate(self._stream_held):
                fields = stream_fields(held.meta)
                if fields is not None and (sid is None or fields[0] == sid):
                    del self._stream_held[i]
                    return held
            while True:
                msg = self._next_from_hub(deadline)
                if msg is None:
                    continue
                fields = stream_fields(msg.meta)
                if fields is not None and (sid is None or fields[0] == sid):
                    return msg
                self._hold_for_recv(msg)

        def send_ack(sid: str, n: int) -> None:
            self.send(None, {ACK_KEY: [sid, n]}, timeout=timeout)

        yield from receive_stream(next_message, send_ack, timeout=timeout)

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Channel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_MAX_DECODER_SETS = 64  # distinct decoder sets whose codec choice an endpoint keeps


def _raw_below(selector: Any) -> float:
    """The size in bytes under which ``selector`` sends every tensor raw (inf: all sizes)."""
    if type(selector) is FixedChainSelector:
        return selector.min_size if selector.chain else math.inf
    if type(selector) is AutoCodec:
        return selector.min_size
    return 0


def _keys(auth: Mapping[str, Any] | str | os.PathLike[str]) -> Keys:
    return Keys(auth) if isinstance(auth, Mapping) else Keys.load(os.fspath(auth))


_LOG_EVERY_S = 10.0  # a repeated warning (one peer's junk, say) is logged at most this often
_last_logged: dict[str, tuple[float, int]] = {}


def _sent() -> None:
    """What :meth:`Hub._start_send` returns for a message already sent."""


def _soon(deadline: float | None, step: float = 0.05) -> float:
    """``deadline``, or ``step`` seconds from now if that comes first (to look around)."""
    soon = time.monotonic() + step
    return soon if deadline is None else min(deadline, soon)


def _log_limited(key: str, text: str) -> None:
    """Log a warning, but one of the same ``key`` (a kind of fault from one peer) at most once
    per ``_LOG_EVERY_S`` seconds, saying how many were held back."""
    now = time.monotonic()
    last, held = _last_logged.get(key, (-_LOG_EVERY_S, 0))
    if now - last < _LOG_EVERY_S:
        _last_logged[key] = (last, held + 1)
        return
    if len(_last_logged) > 1024:
        _last_logged.clear()
    _last_logged[key] = (now, 0)
    log.warning("%s%s", text, f" (and {held} more like it)" if held else "")


def _out_by_path(out: Mapping[Any, Any] | None) -> dict[tuple[str, ...], Any] | None:
    """Accept ``out`` as a nested mapping, a flat mapping of "a/b" names, or of path tuples."""
    if out is None:
        return None
    flat: dict[tuple[str, ...], Any] = {}
    if type(out) is dict:  # the common case, a message's own tensors: no walk
        for key, value in out.items():
            if type(value) is not np.ndarray or type(key) is not str:
                flat.clear()
                break
            flat[(key,)] = value
        else:
            return flat

    def walk(node: Mapping[Any, Any], prefix: tuple[str, ...]) -> None:
        for key, value in node.items():
            path = key if isinstance(key, tuple) else (*prefix, key)
            if isinstance(value, Mapping):
                walk(value, path)
            else:
                flat[path] = value

    walk(out, ())
    return flat
