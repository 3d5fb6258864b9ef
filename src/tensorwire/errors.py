"""The exceptions tensorwire raises; every layer imports them from here.

Each error is raised where the fault is found and its message says what was wrong and,
where there is something to do, what to do.
"""

from __future__ import annotations


class TensorwireError(Exception):
    """Base class of every error tensorwire raises on purpose."""


class MissingDependency(TensorwireError, ImportError):
    """An optional dependency is not installed; the message names the extra to install."""


# --- wire: malformed or over-limit input ------------------------------------------------


class WireError(TensorwireError, ValueError):
    """Bytes that are not a valid tensorwire message (or exceed the configured limits)."""


class BadMagic(WireError):
    """The bytes do not start with the tensorwire magic: not a tensorwire message."""


class UnsupportedVersion(WireError):
    """The message uses a wire-format version this build cannot read."""


class TruncatedMessage(WireError):
    """The input ended before the message did."""


class HeaderTooLarge(WireError):
    """The declared header length exceeds ``Limits.max_header_bytes``."""


class MessageTooLarge(WireError):
    """The declared message size exceeds ``Limits.max_message_bytes``."""


class MalformedHeader(WireError):
    """The header is not valid msgpack or does not have the fields the format requires."""


class HeaderCheckMismatch(MalformedHeader):
    """The header's bytes do not match the check in the prefix: header or prefix is corrupt."""


class UnknownDtype(WireError):
    """A tensor names a dtype this build does not know."""


class UnknownCodec(WireError):
    """A tensor's codec chain names a codec that is not registered here."""


class ShapeMismatch(WireError):
    """A tensor's shape and dtype do not match its declared byte count."""


class ChecksumMismatch(WireError):
    """The checksum of a tensor's encoded bytes differs from the one sent with them."""


class DecompressedSizeMismatch(WireError):
    """A codec produced (or would produce) a size other than the header declares."""


class CodecDataError(WireError):
    """A codec could not decode its input: the compressed bytes are corrupt."""


class ChunkError(WireError):
    """A chunk of a chunked message is malformed or inconsistent with its siblings."""


# --- codecs: configuration ---------------------------------------------------------------


class CodecConfigError(TensorwireError, ValueError):
    """A codec was configured with parameters it does not accept."""


# --- transports --------------------------------------------------------------------------


class TransportError(TensorwireError, OSError):
    """A transport could not connect, send or receive."""


class UnknownScheme(TransportError, ValueError):
    """No transport is registered for the URL's scheme."""


class UnknownHost(TransportError, ValueError):
    """A URL's host name that no name server knows (a typo, most often): not retried."""


class TransportTimeout(TransportError, TimeoutError):
    """An operation did not complete within its timeout (seconds)."""


class PeerGone(TransportError):
    """The peer closed the connection or left."""


class DeliveryUncertain(TransportError):
    """A message may not have arrived: the medium lost state while it was in flight (a
    broker that came back without the session). Sending it again is the sender's call."""


class GatherTimeout(TransportTimeout):
    """``Hub.gather`` timed out; ``missing`` lists the clients that did not answer."""

    def __init__(self, message: str, missing: list[str]) -> None:
        super().__init__(message)
        self.missing = missing


class SessionRefused(TransportError):
    """The other side refused the session: a malformed hello, say. ``code`` names the kind."""

    code = "refused"


class VersionMismatch(SessionRefused):
    """The peer speaks another session-protocol version; the message names both."""

    code = "version"

    def __init__(self, ours: int, theirs: int, peer: str) -> None:
        super().__init__(
            f"{peer} speaks tensorwire session protocol version {theirs}, this side speaks "
            f"version {ours}: run the same tensorwire release on both sides"
        )
        self.ours = ours
        self.theirs = theirs


class AuthenticationError(SessionRefused):
    """The hub did not accept this client's credential (or it has none the hub asks for)."""

    code = "auth"


class BrokerFull(SessionRefused):
    """The broker refused this connection: it is at its limit of connections (or of file
    descriptors); the message names the limit. Final, not retried: a device more than the
    broker was sized for does not fit until another leaves, or a broker sized for more runs
    (``RabbitMQBroker(devices=N)``, ``MosquittoBroker(devices=N)``)."""

    code = "broker-full"


# --- collective --------------------------------------------------------------------------


class CollectiveError(TensorwireError):
    """A collective operation could not complete on this group. The group is unusable after
    it (every later operation raises it again): close it and form a new one."""


class RankFailed(CollectiveError, TransportError):
    """A rank died (its connections closed), hung (sent nothing by the deadline) or left the
    group; ``rank`` names it, the message says what was seen and by whom."""

    def __init__(self, rank: int, reason: str) -> None:
        super().__init__(f"rank {rank} failed: {reason}")
        self.rank = rank
        self.reason = reason


class RankDropped(CollectiveError):
    """This rank of an elastic group was dropped (it failed, hung, or did not report in
    time), and the others went on without it; ``rank`` is its own. Form the group anew
    (``Group.join`` again) to rejoin."""

    def __init__(self, rank: int, reason: str) -> None:
        super().__init__(f"rank {rank} was dropped from the group: {reason}")
        self.rank = rank
        self.reason = reason


class CoordinatorLost(CollectiveError):
    """An elastic group's coordinator (its rendezvous hub) closed, or did not answer a
    rank's report by the deadline: without it no rank can tell which ranks are left."""


class CollectiveMismatch(CollectiveError, ValueError):
    """The ranks called different operations, or the same one with a different shape, dtype,
    reduction or root; ``rank`` names the first rank seen to differ from this one."""

    def __init__(self, rank: int, reason: str) -> None:
        super().__init__(f"rank {rank} does not match: {reason}")
        self.rank = rank
        self.reason = reason
