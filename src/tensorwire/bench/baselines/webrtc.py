"""The WebRTC data channel baseline (aiortc), as the GSoC Duet data channel work measured it.

aiortc's ICE offers the addresses of the host's interfaces except loopback, so its two peers
cannot meet on 127.0.0.1: each runs as a process in a node of the testbed (the sender in
``srv``, the receiver in ``dev1``, one unshaped veth link between them), where its only
interface besides loopback is its veth. No STUN or TURN server is configured; every
candidate both peers offer is checked to be a host address in the testbed's subnet before
the channel is opened, so nothing goes over the machine's own interfaces.

Signalling is relayed by this process over the peers' stdin / stdout pipes. ``once(arr)``
writes the array to a file in ``/dev/shm`` that the sending peer reads into its own memory
(both untimed), then times, from this process, the command to send, the transfer over the
data channel in chunks of the receiver's ``max-message-size`` (256 KiB between aiortc peers),
the receiver's ack back over the channel and the sender's report of it back over its pipe.
See :mod:`tensorwire.bench.webrtc.peer` for the peers.
"""

from __future__ import annotations

import contextlib
import importlib.util
import ipaddress
import os
import re
import subprocess
import sys
import tempfile
import time

import numpy as np

from tensorwire.bench.baselines import BaselineUnavailable

NAME = "aiortc-webrtc"
SETUP_TIMEOUT = 90.0  # seconds for a peer to start, gather and say its description
OPEN_TIMEOUT = 90.0  # seconds for ICE, DTLS and SCTP to open the channel
SLOWEST_BYTES_PER_S = 1e5  # an array's transfer deadline assumes at least this speed
_CANDIDATE = re.compile(r"^a=candidate:\S+ \d+ \S+ \d+ (\S+) \d+ typ (\S+)", re.MULTILINE)


def candidates(sdp: str) -> list[tuple[str, str]]:
    """The ICE candidates in session description ``sdp``: (address, type) pairs."""
    return [(m.group(1), m.group(2)) for m in _CANDIDATE.finditer(sdp)]


def check_candidates(found: list[tuple[str, str]], subnet: str) -> None:
    """``RuntimeError`` unless every candidate is a host address in ``subnet`` (and there is
    at least one): then no peer can send anything over the machine's own interfaces."""
    net = ipaddress.ip_network(subnet)
    if not found:
        raise RuntimeError("the WebRTC peers offered no ICE candidates")
    for address, kind in found:
        if kind != "host" or ipaddress.ip_address(address) not in net:
            raise RuntimeError(
                f"a WebRTC peer offered {kind} candidate {address}, outside the testbed's "
                f"{subnet}: refusing to send over it"
            )


def _shm_dir() -> str | None:
    return "/dev/shm" if os.path.isdir("/dev/shm") else None


class Sender:
    """The two peers in a one-device testbed, connected; ``verify=True`` makes the receiver
    ack with the digest of what arrived (:attr:`received_digest`, after each ``once``)."""

    receiver_args = None  # the receiver is placed in the testbed here, not by the benchmark

    def __init__(self, *, verify: bool = False) -> None:
        if importlib.util.find_spec("aiortc") is None:
            raise BaselineUnavailable("aiortc is not installed: pip install 'tensorwire[webrtc]'")
        from tensorwire.bench.webrtc.pipe import JsonPipe
        from tensorwire.errors import MissingDependency
        from tensorwire.testbed import NamespacesUnavailable, Testbed

        self.verify = verify
        self.received_digest: bytes | None = None
        self._stack = contextlib.ExitStack()
        try:
            try:
                self.testbed = self._stack.enter_context(Testbed(devices=1, profile="none"))
            except (NamespacesUnavailable, MissingDependency) as exc:
                raise BaselineUnavailable(
                    f"its peers must run in the testbed's network namespaces: {exc}"
                ) from exc
            self._file = self._stack.enter_context(
                tempfile.NamedTemporaryFile(prefix="tw-webrtc-", dir=_shm_dir())  # noqa: SIM115
            )
            self._sender = JsonPipe(self._start("srv", "offer"), "sending")
            self._receiver = JsonPipe(self._start("dev1", "answer"), "receiving")
            self._stack.callback(self._finish)  # before the testbed stops what is left
            offer = self._sender.expect("offer", SETUP_TIMEOUT)
            self._receiver.send({"offer": offer})
            answer = self._receiver.expect("answer", SETUP_TIMEOUT)
            self.candidates = candidates(offer) + candidates(answer)
            check_candidates(self.candidates, self.testbed.subnet)
            self._sender.send({"answer": answer})
            self.chunk_bytes: int = self._sender.expect("open", OPEN_TIMEOUT)
        except BaseException:
            self._stack.close()
            raise

    def _start(self, node: str, role: str) -> subprocess.Popen[bytes]:
        argv = ["baseline", __name__.rsplit(".", 1)[1], role]
        if role == "answer":  # the receiver on the last CPU, as the benchmark's others
            from tensorwire.bench.transfer import peer_argv

            cmd = peer_argv(*argv)
        else:  # the sender where this thread runs (the benchmark pins it to the first CPU)
            cmd = [sys.executable, "-m", "tensorwire.bench.peer", *argv]
        return self.testbed.popen(
            node, cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0
        )

    def once(self, arr: np.ndarray) -> float:
        view = arr.reshape(-1).view(np.uint8)
        self._file.seek(0)
        self._file.truncate()
        self._file.write(view.data)
        self._file.flush()
        self._sender.send({"load": self._file.name})
        loaded = self._sender.expect("loaded", SETUP_TIMEOUT)
        if loaded != view.nbytes:
            raise RuntimeError(f"the sending peer loaded {loaded} bytes, not {view.nbytes}")
        deadline = SETUP_TIMEOUT + view.nbytes / SLOWEST_BYTES_PER_S
        t = time.perf_counter()
        self._sender.send({"go": self.verify})
        digest = self._sender.expect("done", deadline)
        seconds = time.perf_counter() - t
        self.received_digest = bytes.fromhex(digest) if digest else None
        return seconds

    def _finish(self) -> None:
        """Close both peers' pipes (their end-of-file ends them) and give them time to."""
        self._sender.close()
        self._receiver.close()
        for pipe in (self._sender, self._receiver):
            with contextlib.suppress(subprocess.TimeoutExpired):
                pipe.proc.wait(timeout=5)

    def close(self) -> None:
        self._stack.close()


def receive(args: list[str]) -> None:
    """A peer process: ``offer`` (the sender) or ``answer`` (the receiver)."""
    from tensorwire.bench.webrtc.peer import run

    run(args[0] if args else "")
