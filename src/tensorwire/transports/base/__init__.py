"""The transport template: what every transport's hub and channel share.

A transport implements a narrow contract, declared as abstract methods that mypy checks:
:class:`Hub` (send one encoded message to a member, close) and :class:`Channel` (open one
attempt at a session, send one encoded message, read the next, drop the connection). The
template around them owns dialling with deadline and backoff, reconnecting, membership, the
inbox, deadlines, records, codec negotiation and streams. Logs a stranger can make grow
(errors, records, events) are bounded. One idea per module:

- :mod:`.options`: typed options (``HubOptions``, ``ChannelOptions``, ``Timeouts``,
  ``Credentials``) that ``serve`` / ``connect`` keywords become;
- :mod:`.records`: transfer records and the error log; :mod:`.membership`: a hub's members
  and their events; :mod:`.inbox`: a channel's received messages for ``recv``;
- :mod:`.dialling`: deadlines, and dialling with backoff; :mod:`.logs`: rate-limited warnings;
- :mod:`.negotiation` and :mod:`.endpoint`: codecs kept to what a peer decodes, encoding and
  decoding with records; :mod:`.send_time`: what of a send's time was the link's (for
  ``auto``); :mod:`.hub` and :mod:`.channel`: the two ends.
"""

from tensorwire.transports.base.channel import BYE_TIMEOUT, MAX_HELD, Channel
from tensorwire.transports.base.dialling import (
    deadline_after,
    default_client_id,
    dial,
    remaining,
    soon,
)
from tensorwire.transports.base.endpoint import _Endpoint, _out_by_path
from tensorwire.transports.base.hub import Hub
from tensorwire.transports.base.inbox import Inbox
from tensorwire.transports.base.logs import OPEN_DOOR, _last_logged, _log_limited, log
from tensorwire.transports.base.membership import MAX_EVENTS, MembershipEvent
from tensorwire.transports.base.negotiation import _MAX_DECODER_SETS
from tensorwire.transports.base.options import (
    FANOUTS,
    ChannelOptions,
    Credentials,
    EndpointOptions,
    HubOptions,
    Timeouts,
)
from tensorwire.transports.base.records import (
    MAX_ERRORS,
    MAX_RECORDS,
    RECENT_RECORDS,
    BroadcastResult,
    ErrorLog,
    RecordLog,
    TransferRecord,
)
from tensorwire.transports.base.send_time import SendTime

__all__ = [
    "BYE_TIMEOUT",
    "FANOUTS",
    "MAX_ERRORS",
    "MAX_EVENTS",
    "MAX_HELD",
    "MAX_RECORDS",
    "OPEN_DOOR",
    "RECENT_RECORDS",
    "_MAX_DECODER_SETS",
    "BroadcastResult",
    "Channel",
    "ChannelOptions",
    "Credentials",
    "EndpointOptions",
    "ErrorLog",
    "Hub",
    "HubOptions",
    "Inbox",
    "MembershipEvent",
    "RecordLog",
    "SendTime",
    "Timeouts",
    "TransferRecord",
    "_Endpoint",
    "_last_logged",
    "_log_limited",
    "_out_by_path",
    "deadline_after",
    "default_client_id",
    "dial",
    "log",
    "remaining",
    "soon",
]
