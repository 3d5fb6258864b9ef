"""Bytes back into tensors: a whole-buffer decoder (``whole``), a sans-IO stream decoder
(``stream``), the small-message path both take first (``known``), one tensor's decoding
(``tensor``) and the decoded ``Message`` (``message``).
"""

from tensorwire.wire.decoder.known import decode_known
from tensorwire.wire.decoder.message import NEED_DATA, Message
from tensorwire.wire.decoder.stream import MessageStream
from tensorwire.wire.decoder.whole import decode_message

__all__ = ["NEED_DATA", "Message", "MessageStream", "decode_known", "decode_message"]
