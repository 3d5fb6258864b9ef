"""The two aiortc peers of the WebRTC baseline, each run as a process in a testbed node.

Both talk to the benchmark in JSON lines on stdin / stdout (signalling and commands: no array
goes through them). The offering peer (the sender, in ``srv``) makes a data channel and an
offer, takes the answer, then per command ``{"load": PATH}`` reads the array's bytes from
``PATH`` into its own memory (untimed) and per ``{"go": VERIFY}`` sends them and reports the
receiver's ack. The answering peer (the receiver, in ``dev1``) answers the offer and receives
each array into one buffer it reuses.

On the data channel (ordered, reliable: SCTP over DTLS over UDP) an array is a 9-byte header
(its length, bytes, and whether to verify) and the bytes in messages of at most the peer's
``max-message-size`` (aiortc refuses larger ones); the ack is ``b"k"``, followed by the
BLAKE2b digest (16 bytes) of what arrived when the header asked to verify.

No STUN or TURN server (``iceServers=[]``: aiortc's default is a public STUN server); the
candidates are the host addresses of the node's interfaces, which aioice takes without
loopback.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import struct
import sys
from typing import Any

import numpy as np
from aiortc import RTCConfiguration, RTCDataChannel, RTCPeerConnection, RTCSessionDescription

from tensorwire._lifeline import watch_parent

HEADER = struct.Struct("<QB")  # array length (bytes), verify (0 or 1)
ACK = b"k"
DIGEST_BYTES = 16
MAX_ARRAY_BYTES = 1 << 34  # a header declaring more is refused, not allocated
DEFAULT_MESSAGE_BYTES = 65536  # RFC 8841: a peer that states no max-message-size takes this
MAX_CHUNK_BYTES = 262144  # aiortc's own max-message-size: chunks never exceed it
_HIGH_WATER = 4 << 20  # bytes queued in the channel before the sender waits for it to drain
_LOW_WATER = 1 << 20
OPEN_TIMEOUT = 60.0  # seconds for ICE, DTLS and SCTP to bring the channel up


class ChannelProtocolError(ValueError):
    """A data channel message that does not fit the baseline's protocol."""


def digest(data: Any) -> bytes:
    """The BLAKE2b digest (16 bytes) the receiver acks a verified array with."""
    return hashlib.blake2b(data, digest_size=DIGEST_BYTES).digest()


def chunk_bytes(sdp: str) -> int:
    """The size of the messages to send a peer whose session description is ``sdp``: its
    ``a=max-message-size`` (0 means any size), at most :data:`MAX_CHUNK_BYTES`."""
    found = re.search(r"^a=max-message-size:(\d+)\s*$", sdp, re.MULTILINE)
    stated = int(found.group(1)) if found else DEFAULT_MESSAGE_BYTES
    return MAX_CHUNK_BYTES if stated == 0 else min(stated, MAX_CHUNK_BYTES)


class ArrayReceiver:
    """Reassembles arrays from data channel messages into one reused buffer (sans-IO)."""

    def __init__(self) -> None:
        self.buf = np.empty(0, np.uint8)
        self._expect: int | None = None  # bytes of the array under way; None: a header next
        self._got = 0
        self._verify = False

    def feed(self, message: bytes | str) -> bytes | None:
        """Take one message; the ack to send back when it completes an array, else None."""
        if not isinstance(message, bytes):
            raise ChannelProtocolError("a text message on the array channel")
        if self._expect is None:
            if len(message) != HEADER.size:
                raise ChannelProtocolError(f"a header of {len(message)} bytes, not {HEADER.size}")
            nbytes, verify = HEADER.unpack(message)
            if nbytes > MAX_ARRAY_BYTES:
                raise ChannelProtocolError(f"an array of {nbytes} bytes: over {MAX_ARRAY_BYTES}")
            if self.buf.nbytes != nbytes:
                self.buf = np.empty(nbytes, np.uint8)
            self._expect, self._got, self._verify = nbytes, 0, bool(verify)
        else:
            end = self._got + len(message)
            if end > self._expect:
                raise ChannelProtocolError(f"{end} bytes of an array of {self._expect}")
            self.buf[self._got : end] = np.frombuffer(message, np.uint8)
            self._got = end
        if self._got < self._expect:
            return None
        self._expect = None
        return ACK + (digest(self.buf) if self._verify else b"")


def _config() -> RTCConfiguration:
    return RTCConfiguration(iceServers=[])  # no STUN, no TURN: nothing leaves the testbed


def _say(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


async def _stdin() -> asyncio.StreamReader:
    reader = asyncio.StreamReader(limit=1 << 20)
    loop = asyncio.get_running_loop()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    return reader


async def _command(stdin: asyncio.StreamReader) -> dict[str, Any] | None:
    """The benchmark's next command; None when it closed the pipe (it is done with us)."""
    line = await stdin.readline()
    return json.loads(line) if line else None


async def send_array(
    channel: RTCDataChannel, buf: np.ndarray, chunk: int, verify: bool, drained: asyncio.Event
) -> None:
    """Queue ``buf`` on ``channel`` as a header and ``chunk``-byte messages, waiting for the
    channel to drain below its low-water mark whenever more than the high-water mark waits."""
    channel.send(HEADER.pack(buf.nbytes, int(verify)))
    for offset in range(0, buf.nbytes, chunk):
        while channel.bufferedAmount > _HIGH_WATER:
            drained.clear()
            await drained.wait()
        channel.send(buf[offset : offset + chunk].tobytes())  # aiortc takes bytes only


async def offer() -> None:
    """The sending peer: offer, take the answer, then serve the benchmark's commands."""
    stdin = await _stdin()
    pc = RTCPeerConnection(_config())
    channel = pc.createDataChannel("tensors")  # ordered and reliable: the default
    opened = asyncio.Event()
    drained = asyncio.Event()
    acks: asyncio.Queue[bytes | str] = asyncio.Queue()
    channel.bufferedAmountLowThreshold = _LOW_WATER
    channel.on("open", opened.set)
    channel.on("bufferedamountlow", drained.set)
    channel.on("message", acks.put_nowait)
    channel.on("close", lambda: acks.put_nowait(""))  # no ack will come: say so, not wait
    try:
        await pc.setLocalDescription(await pc.createOffer())  # gathers the host candidates
        _say({"offer": pc.localDescription.sdp})
        answer = await _command(stdin)
        if answer is None:
            return
        await pc.setRemoteDescription(RTCSessionDescription(answer["answer"], "answer"))
        await asyncio.wait_for(opened.wait(), OPEN_TIMEOUT)
        chunk = chunk_bytes(answer["answer"])
        _say({"open": chunk})
        buf = np.empty(0, np.uint8)
        while (cmd := await _command(stdin)) is not None:
            if "load" in cmd:
                buf = np.fromfile(cmd["load"], np.uint8)
                _say({"loaded": buf.nbytes})
            else:
                await send_array(channel, buf, chunk, bool(cmd["go"]), drained)
                ack = await acks.get()
                if ack == "":
                    _say({"error": "the data channel closed before the receiver acked"})
                    return
                if not isinstance(ack, bytes) or not ack.startswith(ACK):
                    raise ChannelProtocolError(f"the receiver acked with {ack!r}")
                _say({"done": ack[len(ACK) :].hex() or None})
    finally:
        await pc.close()


async def answer() -> None:
    """The receiving peer: answer the offer, receive and ack arrays until the benchmark closes
    its pipe or the channel closes."""
    stdin = await _stdin()
    pc = RTCPeerConnection(_config())
    receiver = ArrayReceiver()
    closed = asyncio.Event()

    @pc.on("datachannel")
    def _on_channel(channel: RTCDataChannel) -> None:
        def on_message(message: bytes | str) -> None:
            ack = receiver.feed(message)
            if ack is not None:
                channel.send(ack)

        channel.on("message", on_message)
        channel.on("close", closed.set)

    try:
        offered = await _command(stdin)
        if offered is None:
            return
        await pc.setRemoteDescription(RTCSessionDescription(offered["offer"], "offer"))
        await pc.setLocalDescription(await pc.createAnswer())
        _say({"answer": pc.localDescription.sdp})
        ended = asyncio.ensure_future(stdin.read())  # EOF: the benchmark is done with us
        gone = asyncio.ensure_future(closed.wait())
        await asyncio.wait([ended, gone], return_when=asyncio.FIRST_COMPLETED)
        for task in (ended, gone):
            task.cancel()
    finally:
        await pc.close()


def run(role: str) -> None:
    """Run the ``offer`` (sending) or ``answer`` (receiving) peer until its pipe closes."""
    roles = {"offer": offer, "answer": answer}
    if role not in roles:
        raise SystemExit(f"unknown WebRTC peer role {role!r}: use offer or answer")
    watch_parent()
    asyncio.run(roles[role]())
