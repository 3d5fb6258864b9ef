"""The hub: the serving end. Clients join it; it broadcasts, sends, receives and gathers.

A transport's hub implements two methods (:meth:`Hub._send_encoded`,
:meth:`Hub._close_transport`) and runs threads that drive a
:class:`~tensorwire.transports.session.HubSession` per peer, calling :meth:`Hub._joined`,
:meth:`Hub._delivered`, :meth:`Hub._rejected` and :meth:`Hub._left`; all else is here.
"""

from __future__ import annotations

import threading
import time
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, ClassVar

from tensorwire.errors import GatherTimeout, MessageTooLarge, PeerGone, TransportTimeout
from tensorwire.transports.base.dialling import deadline_after, remaining, soon
from tensorwire.transports.base.logs import _log_limited, log
from tensorwire.transports.base.membership import MAX_EVENTS, Membership, MembershipEvent, _Member
from tensorwire.transports.base.options import HubOptions
from tensorwire.transports.base.records import BroadcastResult, TransferRecord
from tensorwire.transports.base.send_time import SendTime, timed_send
from tensorwire.transports.security import KeyAuthenticator
from tensorwire.transports.session import Closed, Data, HubSession
from tensorwire.transports.streams import (
    ACK_KEY,
    DEFAULT_WINDOW,
    StreamBatch,
    StreamResult,
    ack_fields,
    receive_stream,
    send_stream,
    stream_fields,
)
from tensorwire.transports.url import redacted
from tensorwire.wire import EncodedMessage, Message


class Hub(Membership, ABC):
    """The server side: clients join it; it broadcasts, sends, receives and gathers.

    Use as a context manager. ``on_join(client_id)`` / ``on_leave(client_id, reason)``
    are called from transport threads.
    """

    options_type: ClassVar[type[HubOptions]] = HubOptions
    """The options this transport's hubs take (``serve``'s keywords become one)."""

    sees_client_certificates = True
    """Whether a TLS client certificate reaches this hub (False on a broker: it reaches the
    broker only, so mutual TLS cannot identify a device to the hub there)."""

    fanout = "concurrent"
    """How :meth:`broadcast` reaches its clients: ``concurrent`` (every connection at once, or
    the transport's own fan-out: one publish on a broker, one segment on shm) or
    ``sequential`` (one unicast after another: the baseline of a server that loops over its
    devices). ``serve(url, fanout=...)`` sets it."""

    options: HubOptions

    def __init__(self, url: str, options: HubOptions) -> None:
        self.url = url
        self.options = options
        super().__init__(options.codec, options.checksum, options.limits)
        self.on_join = options.on_join
        self.on_leave = options.on_leave
        self.on_event = options.on_event
        self.fanout = options.fanout
        self._call_timeout = options.timeouts.call
        credentials = options.credentials
        self.tls = tls = credentials.tls
        keys, authenticate = credentials.keys, credentials.authenticate
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

    # -- what a transport implements ------------------------------------------------------

    @abstractmethod
    def _send_encoded(self, client_id: str, enc: EncodedMessage, deadline: float | None) -> None:
        """Send one encoded message to one member by ``deadline`` (``time.monotonic()``)."""

    @abstractmethod
    def _close_transport(self) -> None:
        """Stop accepting, drop every peer, free what the transport holds."""

    # -- called by transport threads -----------------------------------------------------

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

    def _received(self, client_id: str, session: HubSession, msg: Message) -> str | None:
        """Act on a message of a member's open session: deliver data; return why the session
        ended if it did (a bye); log the rest. A transport may deliver open-session data itself
        first (kind "data", session OPEN), to save a call per message."""
        event = session.receive(msg)
        if isinstance(event, Data):
            self._delivered(client_id, msg)
        elif isinstance(event, Closed):
            return event.reason
        else:
            log.debug("%s: %r: %s", self.protocol, client_id, event)
        return None

    def _rejected(self, client_id: str, exc: Exception) -> None:
        _log_limited(
            f"rejected {client_id}",
            f"{self.protocol}: dropped a message from {client_id!r}: {exc}",
        )
        self.errors.append((client_id, exc))

    # -- public API ------------------------------------------------------------------
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
        if timeout is None:
            timeout = self._call_timeout
        deadline = None if timeout is None else time.monotonic() + timeout  # deadline_after
        sent = timed_send(
            lambda: self._send_encoded(client_id, enc, deadline), self._measures_link(enc)
        )
        return self._note_send(client_id, enc, sent, started)

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
    ) -> BroadcastResult:
        """Send one message to every client (or to ``clients``), concurrently.

        The message is encoded once per set of codecs the clients can decode. Each client's
        send has the same deadline, so a slow or hung one does not hold up the others past it.
        Returns a :class:`BroadcastResult`: a record per client reached, and ``.failed`` for
        each one not reached (not connected, gone, over its size limit, past the deadline),
        which is also logged and, for a missed deadline, a ``slow`` event.
        """
        started = time.perf_counter()
        if timeout is None:
            timeout = self._call_timeout
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
        results: list[Mapping[str, float | SendTime | Exception]] = [{} for _ in sends]
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
    ) -> Mapping[str, float | SendTime | Exception]:
        """Send ``enc`` to each client; return its wire seconds (a :class:`SendTime` where
        the link's part was measured), or the exception it raised.

        Concurrent unicast sends by default; transports with native fan-out (an MQTT topic,
        an AMQP fanout exchange, a ZeroMQ PUB socket) override this to publish once.
        """
        measure = self._measures_link(enc)

        def timed(c: str) -> SendTime:  # in the thread that sends: its busy time is the send's
            return timed_send(lambda: self._send_encoded(c, enc, deadline), measure)

        if len(clients) == 1:  # no hand-off to a worker thread for a single client
            try:
                return {clients[0]: timed(clients[0])}
            except Exception as exc:
                return {clients[0]: exc}
        futures = {c: self._pool.submit(timed, c) for c in clients}
        results: dict[str, float | SendTime | Exception] = {}
        for c, fut in futures.items():
            try:
                results[c] = fut.result()
            except Exception as exc:
                results[c] = exc
        return results

    def recv(self, timeout: float | None = None) -> tuple[str, Message]:
        """The next message from any client, as ``(client_id, message)``."""
        if timeout is None:
            timeout = self._call_timeout
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
        if timeout is None:
            timeout = self._call_timeout
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
            while not self._await_ack(client_id, sid, n, soon(deadline)):
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


def _sent() -> None:
    """What :meth:`Hub._start_send` returns for a message already sent."""
