"""The flight:// channel: a session of two ``DoExchange`` calls on one gRPC connection, a
reader thread that queues the hub's batches for ``recv``, sends written on the caller's
thread under a :class:`Watchdog` deadline."""

from __future__ import annotations

import contextlib
import logging
import threading
from dataclasses import dataclass, field
from typing import Any, ClassVar

import pyarrow.flight as flight

from tensorwire.codecs import get_codec
from tensorwire.errors import PeerGone, TransportError, TransportTimeout, WireError
from tensorwire.transports.base import Channel, ChannelOptions, Inbox, remaining
from tensorwire.transports.flight.batches import batch_of, bytes_of, control_message, feed, pieces
from tensorwire.transports.flight.options import (
    BYE_TIMEOUT,
    FLIGHT_ERRORS,
    HANDSHAKE_TIMEOUT,
    SCHEMA,
    UP,
    FlightChannelOptions,
    location,
)
from tensorwire.transports.flight.tls import client_tls, unreachable
from tensorwire.transports.flight.watchdog import Watchdog
from tensorwire.transports.session import ClientSession, Closed, Data, Welcomed, bye
from tensorwire.transports.url import host_port, query_options
from tensorwire.wire import EncodedMessage, Message, MessageStream

log = logging.getLogger("tensorwire.transports.flight")


@dataclass(eq=False)
class _Session:
    client: flight.FlightClient
    session: ClientSession
    down: flight.FlightStreamReader
    down_writer: flight.FlightStreamWriter
    up: flight.FlightStreamWriter
    up_call: flight.FlightStreamReader  # never read: it cancels the uplink
    stream: MessageStream
    inbox: Inbox = field(default_factory=Inbox)  # the hub's record batches, for recv
    answered: threading.Event = field(default_factory=threading.Event)  # welcome, refuse, end
    thread: threading.Thread | None = None


class FlightChannel(Channel):
    """A client's session with a :class:`FlightHub`, with :class:`FlightChannelOptions`;
    retries reaching it for ``timeouts.connect`` seconds.

    ``tls`` makes it speak gRPC over TLS (``tls.ca`` verifies the hub; ``tls.cert``/``tls.key``
    are its own certificate for mutual TLS); ``key`` is its enrolled secret (bytes, hex, or a
    file of hex), proven in every hello.
    """

    protocol = "flight"
    options_type: ClassVar[type[ChannelOptions]] = FlightChannelOptions
    options: FlightChannelOptions

    def __init__(self, url: str, options: FlightChannelOptions) -> None:
        super().__init__(url, options)
        query_options(url, ())
        host, port = host_port(url)
        self._tls_options = {} if self.tls is None else client_tls(self.tls)
        self._location = location(host, port, self.tls)
        self._batch_bytes = options.batch_bytes
        self._send_lock = threading.RLock()  # the uplink's writer: sends, bye, close
        self._watchdog = Watchdog(f"tensorwire-flight-deadline-{self.client_id}")
        self._session: _Session | None = None
        self.reconnect()

    def _open(self, deadline: float | None) -> Welcomed:
        """One attempt at a session: both calls, then the hub's answer by ``deadline`` (at
        most twice the hub's handshake window). ``OSError`` when it may be worth retrying."""
        session = self._client_session(f"the hub at {self.url}")
        client = flight.FlightClient(self._location, **self._tls_options)
        try:
            hello = flight.FlightDescriptor.for_command(session.hello().to_bytes())
            down_writer, down = client.do_exchange(hello)
            up, up_call = client.do_exchange(flight.FlightDescriptor.for_path(*UP, session.session))
        except flight.FlightUnavailableError as exc:
            client.close()
            raise unreachable(self.url, exc) from None
        except FLIGHT_ERRORS as exc:
            client.close()
            raise TransportError(f"cannot open a session with {self.url}: {exc}") from None
        with contextlib.suppress(*FLIGHT_ERRORS):  # no hub there: the reader says so
            down_writer.done_writing()  # before the reader starts: it may then finish the call
            up.begin(SCHEMA)
        s = _Session(
            client,
            session,
            down,
            down_writer,
            up,
            up_call,
            MessageStream(limits=self.limits, codec_lookup=get_codec),
        )
        s.thread = threading.Thread(
            target=self._read_loop, args=(s,), name="tensorwire-flight-reader", daemon=True
        )
        s.thread.start()
        wait = remaining(deadline)
        s.answered.wait(2 * HANDSHAKE_TIMEOUT if wait is None else min(wait, 2 * HANDSHAKE_TIMEOUT))
        failure = s.inbox.failed  # before the close below fails it too
        welcome = s.session.welcome
        if welcome is not None and failure is None:
            self._session = s
            return welcome
        self._close_session(s)
        raise failure or TransportTimeout(f"no answer from the hub at {self.url} in time")

    def _read_loop(self, s: _Session) -> None:
        """Queue the hub's batches for :meth:`recv`; act on control messages as they come."""
        where = f"the hub at {self.url}"
        try:
            while True:
                chunk = s.down.read_chunk()
                if chunk.data is not None:
                    s.inbox.put(chunk.data)
                if chunk.app_metadata is None:
                    continue
                try:
                    msg = control_message(chunk.app_metadata, self.limits)
                except WireError as exc:
                    log.warning("flight: ignoring a bad control message from %s: %s", where, exc)
                    continue
                try:
                    event = s.session.receive(msg)
                except TransportError as exc:  # refused, or not a tensorwire hub
                    s.inbox.fail(exc)
                    return
                if isinstance(event, Closed):
                    s.inbox.fail(s.session.closed_error())
                    return
                if isinstance(event, Data):
                    log.warning("flight: ignoring data in app_metadata from %s", where)
                if s.session.welcome is not None:
                    s.answered.set()
        except StopIteration:
            s.inbox.fail(PeerGone(f"{where} ended the session"))
        except flight.FlightUnavailableError as exc:
            s.inbox.fail(unreachable(self.url, exc))
        except FLIGHT_ERRORS as exc:
            s.inbox.fail(PeerGone(f"the session with {where} broke: {exc}"))
        finally:
            s.up_call.cancel()  # so the hub's end of the uplink ends too
            s.answered.set()

    def _live(self) -> _Session:
        if self._session is None:
            raise PeerGone("channel is closed; call reconnect()")
        return self._session

    def _send_encoded(self, enc: EncodedMessage, deadline: float | None) -> None:
        s = self._live()
        with self._send_lock:
            if deadline is not None:  # a blocked gRPC write ends only when its call is cancelled
                self._watchdog.arm(deadline, s.up_call.cancel)
            try:
                for piece in pieces(enc, self._batch_bytes):
                    s.up.write_batch(batch_of(piece))
            except FLIGHT_ERRORS as exc:
                self._drop()  # half a message leaves the uplink unusable
                if self._watchdog.fired():
                    raise TransportTimeout(f"send of {enc.nbytes} bytes timed out") from None
                raise PeerGone(f"session with {self.url} broke: {exc}") from None
            finally:
                self._watchdog.disarm()

    def _recv_message(self, deadline: float | None, out: Any) -> Message:
        s = self._live()
        while True:
            if not s.stream.in_message:
                s.stream.set_out(out)
            msg = s.stream.next_event()  # a bad message raises its WireError; the stream goes on
            if isinstance(msg, Message):  # else NEED_DATA: no whole message buffered yet
                if msg.kind == "data":
                    return msg
                if isinstance(s.session.receive(msg), Closed):
                    self._drop()
                    raise s.session.closed_error()
                continue
            try:
                batch = s.inbox.get(deadline)
            except PeerGone:
                self._drop()
                raise
            try:
                whole = feed(s.stream, bytes_of(batch))
            except WireError:
                self._drop()  # framing is lost with the bytes of a bad batch
                raise
            if whole is not None:  # as next_event would give it, without the queue
                if whole.kind == "data":
                    return whole
                if isinstance(s.session.receive(whole), Closed):
                    self._drop()
                    raise s.session.closed_error()

    def _drop(self) -> None:
        """End the session at once, without a goodbye, and stop the send deadlines' thread."""
        s, self._session = self._session, None
        if s is not None:
            s.inbox.fail(PeerGone("channel is closed; call reconnect()"))
            self._close_session(s)
        self._watchdog.stop()

    def _close_session(self, s: _Session) -> None:
        s.down.cancel()  # cancels end blocked reads and writes at once
        s.up_call.cancel()
        if s.thread is not None:
            s.thread.join(timeout=5)
        with self._send_lock:
            for closable in (s.down_writer, s.up, s.client):
                with contextlib.suppress(*FLIGHT_ERRORS):
                    closable.close()

    def _say_goodbye(self) -> None:
        """Write ``bye`` in the uplink's metadata and half-close it; wait briefly for the hub
        to end the downlink."""
        s = self._session
        if s is None:
            return
        with self._send_lock, contextlib.suppress(*FLIGHT_ERRORS):
            s.up.write_metadata(bye().to_bytes())
            s.up.done_writing()
        if s.thread is not None:
            s.thread.join(BYE_TIMEOUT)  # the hub ends the downlink on our bye
