"""``tensorwire bench latency``: small-message round trips against the libraries used directly.

A round trip is one payload from this process to an echo process and the same bytes back,
timed here. The trials, each with its own echo process:

- ``raw-socket``: an 8-byte length and the payload in one ``sendmsg``, ``recv_into`` reused
  buffers on both sides (what a careful hand-written sender does);
- ``tensorwire-tcp``: a hub here, a channel in the echo process that receives into its
  previous message's arrays and sends the message back;
- ``tensorwire-tcp-nochecksum``: the same without per-tensor checksums, which shows what
  checksums cost;
- ``pyzmq``: a ROUTER here, a DEALER there, as tensorwire's zmq+tcp transport uses them;
- ``tensorwire-zmq``: tensorwire over ``zmq+tcp://``, like ``tensorwire-tcp``.

Each trial runs blocks of ``round_trips`` round trips after a warm-up; blocks of all trials
alternate ``repeat`` times, so a slow spell of the machine hits all of them alike. A trial's
figure is the median over its blocks of each block's median round trip, and
``time_vs_baseline`` the median over blocks of its block median / its baseline's block
median from the same round (the issue's targets: tcp <= 1.5x raw socket, zmq <= 1.2x
pyzmq). With two or more CPUs this process runs on the first CPU and the echo processes
on the last, as two hosts would.

Beside the wall time, each side's CPU time per round trip (``hub_cpu_us``: this process, the
hub's or the baseline's end, with every thread it runs; ``echo_cpu_us``: the echo process),
read from each process's own CPU-time clock over each timed block, median over blocks: a
figure that does not depend on how fast the machine's CPUs wake up.

``python -m tensorwire.bench.latency echo KIND ARGS...`` is an echo process.
"""

from __future__ import annotations

import contextlib
import os
import socket
import statistics
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import tensorwire
from tensorwire.bench.cpu_time import cpu_clock
from tensorwire.bench.progress import progress_bar
from tensorwire.bench.transfer import _CPUS, pinned_sender, random_tensor
from tensorwire.transports.registry import listed_transports

PAYLOADS = (4 << 10, 40 << 10)
"""Payload sizes in bytes: float32 tensors of 1,024 and 10,240 elements."""
TARGETS = {"tensorwire-tcp": 1.5, "tensorwire-zmq": 1.2}
"""The most each trial may take per round trip, as a multiple of its baseline's time."""
TIMEOUT = 60.0
"""Seconds any one reply may take before the run fails (an echo process that died or hung)."""
_LEN = struct.Struct("<Q")
_ECHO_ID = "echo"


@dataclass
class PingTrial:
    """A named way of sending one array to an echo process and receiving it back."""

    name: str
    once: Callable[[np.ndarray], None]
    close: Callable[[], None]
    baseline: str | None = None
    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)


def spawn_echo(*args: str) -> subprocess.Popen[bytes]:
    """Start an echo process (this module), on the last CPU when there are two or more."""
    pin = ["--cpu", str(_CPUS[-1])] if len(_CPUS) > 1 else []
    return subprocess.Popen([sys.executable, "-m", __name__, "echo", *pin, *args])


# -- raw socket ------------------------------------------------------------------------


@contextlib.contextmanager
def _killed_on_error(proc: subprocess.Popen[bytes]) -> Iterator[None]:
    """Kill ``proc`` if the block fails: a trial that could not start leaves no process."""
    try:
        yield
    except BaseException:
        proc.kill()
        proc.wait(timeout=30)
        raise


def raw_socket_trial(timeout: float = TIMEOUT) -> PingTrial:
    """The raw socket trial and its echo process."""
    listener = socket.create_server(("127.0.0.1", 0))
    proc = spawn_echo("socket", str(listener.getsockname()[1]))
    listener.settimeout(max(timeout, TIMEOUT))
    with _killed_on_error(proc), listener:
        sock, _ = listener.accept()
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.settimeout(timeout)
    header = bytearray(_LEN.size)
    reply = np.empty(0, np.uint8)

    def once(arr: np.ndarray) -> None:
        nonlocal reply
        view = arr.reshape(-1).view(np.uint8).data
        _send_all(sock, [_LEN.pack(len(view)), view])
        _recv_exact(sock, memoryview(header))
        (n,) = _LEN.unpack(header)
        if reply.nbytes != n:
            reply = np.empty(n, np.uint8)
        _recv_exact(sock, reply.data)

    return PingTrial("raw-socket", once, sock.close, proc=proc)


def _echo_socket(port: int) -> None:
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    header = bytearray(_LEN.size)
    buf = np.empty(0, np.uint8)
    with sock:
        while _recv_exact(sock, memoryview(header), eof_ok=True):
            (n,) = _LEN.unpack(header)
            if buf.nbytes != n:
                buf = np.empty(n, np.uint8)
            _recv_exact(sock, buf.data)
            _send_all(sock, [header, buf.data])


def _send_all(sock: socket.socket, parts: list[Any]) -> None:
    views = [memoryview(p).cast("B") for p in parts]
    while views:
        sent = sock.sendmsg(views)
        while views and sent >= len(views[0]):
            sent -= len(views[0])
            views.pop(0)
        if views and sent:
            views[0] = views[0][sent:]


def _recv_exact(sock: socket.socket, view: memoryview, eof_ok: bool = False) -> bool:
    got = 0
    while got < len(view):
        n = sock.recv_into(view[got:])
        if not n:
            if eof_ok and not got:
                return False
            raise ConnectionError("the peer closed the connection mid-message")
        got += n
    return True


# -- pyzmq -----------------------------------------------------------------------------


def pyzmq_trial(timeout: float = TIMEOUT) -> PingTrial:
    """The pyzmq trial (ROUTER here, DEALER in the echo process) and its echo process."""
    import zmq

    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.linger = 0
    router.rcvtimeo = router.sndtimeo = int(max(timeout, TIMEOUT) * 1000)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    proc = spawn_echo("pyzmq", str(port))
    try:
        with _killed_on_error(proc):
            ident, _ = router.recv_multipart()  # the DEALER says hello: its routing id
    except BaseException:
        router.close()
        ctx.term()
        raise
    router.rcvtimeo = router.sndtimeo = int(timeout * 1000)

    def once(arr: np.ndarray) -> None:
        router.send_multipart([ident, arr.reshape(-1).view(np.uint8).data])
        router.recv_multipart(copy=False)

    def close() -> None:
        with contextlib.suppress(zmq.ZMQError):
            router.send_multipart([ident, b""])
        router.close()
        ctx.term()

    return PingTrial("pyzmq", once, close, proc=proc)


def _echo_pyzmq(port: int) -> None:
    import zmq

    ctx = zmq.Context()
    dealer = ctx.socket(zmq.DEALER)
    dealer.linger = 0
    dealer.rcvtimeo = int(TIMEOUT * 1000 * 10)
    dealer.connect(f"tcp://127.0.0.1:{port}")
    dealer.send(b"hello")
    try:
        while True:
            try:
                frame = dealer.recv(copy=False)
            except zmq.Again:
                return
            if not len(frame.buffer):
                return
            dealer.send(frame, copy=False)
    finally:
        dealer.close()
        ctx.term()


# -- tensorwire ------------------------------------------------------------------------


def tensorwire_trial(
    scheme: str,
    label: str,
    baseline: str | None = None,
    timeout: float = TIMEOUT,
    *,
    codec: Any = "auto",
    checksum: bool = True,
) -> PingTrial:
    """A tensorwire trial: a hub here on ``scheme``, a channel in the echo process."""
    hub = tensorwire.serve(f"{scheme}://127.0.0.1:0", codec=codec, checksum=checksum)
    try:
        proc = spawn_echo("tw", hub.url, "1" if checksum else "0", str(codec))
        with _killed_on_error(proc):
            hub.wait_for(1, timeout=max(timeout, TIMEOUT))  # a process start may take a while
    except BaseException:
        hub.close()
        raise

    def once(arr: np.ndarray) -> None:
        hub.send(_ECHO_ID, {"x": arr}, timeout=timeout)
        hub.recv(timeout=timeout)

    return PingTrial(label, once, hub.close, baseline, proc)


def _echo_tensorwire(url: str, checksum: bool, codec: Any) -> None:
    from tensorwire.errors import PeerGone

    with tensorwire.connect(
        url, client_id=_ECHO_ID, codec=codec, checksum=checksum, timeout=TIMEOUT
    ) as ch:
        out = None
        while True:
            try:
                msg = ch.recv(timeout=TIMEOUT * 10, out=out)
            except PeerGone:
                return
            out = msg.tensors
            ch.send(msg.tensors)


# -- the benchmark ---------------------------------------------------------------------


def _trials(
    stack: contextlib.ExitStack, checksum_off: bool, codec: Any, timeout: float
) -> list[PingTrial]:
    makers: list[Callable[[], PingTrial]] = [
        lambda: raw_socket_trial(timeout),
        lambda: tensorwire_trial("tcp", "tensorwire-tcp", "raw-socket", timeout, codec=codec),
    ]
    if checksum_off:
        makers.append(
            lambda: tensorwire_trial(
                "tcp",
                "tensorwire-tcp-nochecksum",
                "raw-socket",
                timeout,
                codec=codec,
                checksum=False,
            )
        )
    makers += [
        lambda: pyzmq_trial(timeout),
    ]
    zmq_entry = next((e for e in listed_transports() if e.baseline == "pyzmq"), None)
    if zmq_entry is not None:  # the transport that wraps pyzmq, against pyzmq itself
        makers.append(
            lambda: tensorwire_trial(
                zmq_entry.scheme, zmq_entry.label, "pyzmq", timeout, codec=codec
            )
        )
    # Started together: each waits for its echo process to start, which takes seconds.
    with ThreadPoolExecutor(len(makers)) as pool:
        futures = [pool.submit(make) for make in makers]
    wait(futures)
    trials = []
    for future in futures:
        if future.exception() is None:
            trial = future.result()
            stack.callback(stop_trial, trial)
            trials.append(trial)
    for future in futures:
        if (exc := future.exception()) is not None:
            raise exc
    return trials


def stop_trial(trial: PingTrial) -> None:
    """Close the trial's end and wait for its echo process (killed if it does not end)."""
    trial.close()
    if trial.proc is not None:
        try:
            trial.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            trial.proc.kill()
            trial.proc.wait(timeout=30)


@dataclass
class Block:
    """One timed block of a trial: each round trip's wall seconds, and the CPU seconds per
    round trip of this process (``hub_cpu_s``) and of the echo process (``echo_cpu_s``)."""

    times: list[float]
    hub_cpu_s: float
    echo_cpu_s: float


def _block(trial: PingTrial, arr: np.ndarray, round_trips: int) -> Block:
    hub_cpu = cpu_clock()
    echo_cpu = cpu_clock(trial.proc.pid) if trial.proc is not None else hub_cpu
    times = []
    hub_start, echo_start = hub_cpu(), echo_cpu()
    for _ in range(round_trips):
        t = time.perf_counter()
        trial.once(arr)
        times.append(time.perf_counter() - t)
    hub_s, echo_s = hub_cpu() - hub_start, echo_cpu() - echo_start
    per = max(round_trips, 1)  # a warm-up of none
    return Block(times, hub_s / per, echo_s / per)


def bench_latency(
    *,
    payloads: Iterable[int] = PAYLOADS,
    round_trips: int = 2000,
    repeat: int = 7,
    warmup: int = 200,
    checksum_off: bool = True,
    codec: Any = "auto",
    timeout: float = TIMEOUT,
) -> list[dict[str, Any]]:
    """Ping-pong every trial with float32 payloads of ``payloads`` bytes; one row per
    (payload, trial) with medians in microseconds (see the module docstring).

    ``round_trips`` per block, ``repeat`` blocks per trial and payload, interleaved;
    ``codec`` is the tensorwire trials' ``codec=``; ``checksum_off`` adds the
    ``tensorwire-tcp-nochecksum`` trial; a reply that takes over ``timeout`` seconds fails
    the run."""
    if round_trips < 1 or repeat < 1:
        raise ValueError("round_trips and repeat must be >= 1")
    rows: list[dict[str, Any]] = []
    sizes = list(payloads)
    with contextlib.ExitStack() as stack, pinned_sender(), progress_bar() as bar:
        trials = _trials(stack, checksum_off, codec, timeout)
        task = bar.add_task("latency", total=len(sizes) * repeat)
        for nbytes in sizes:
            arr = random_tensor((nbytes // 4,), "float32")
            for trial in trials:
                _block(trial, arr, warmup)
            blocks: dict[str, list[Block]] = {t.name: [] for t in trials}
            for r in range(repeat):
                bar.update(task, description=f"{nbytes} B, round {r + 1}/{repeat}")
                for trial in trials:
                    blocks[trial.name].append(_block(trial, arr, round_trips))
                bar.advance(task)
            rows += _rows(nbytes, trials, blocks)
    return rows


def _rows(
    nbytes: int, trials: list[PingTrial], blocks: dict[str, list[Block]]
) -> list[dict[str, Any]]:
    medians = {name: [statistics.median(b.times) for b in bs] for name, bs in blocks.items()}
    rows = []
    for trial in trials:
        mine = medians[trial.name]
        every = sorted(t for b in blocks[trial.name] for t in b.times)
        ratio = None
        if trial.baseline in medians:
            base = medians[trial.baseline]
            ratio = statistics.median(m / b for m, b in zip(mine, base, strict=True))
        rows.append(
            {
                "case": "ping-pong",
                "transport": trial.name,
                "bytes": nbytes,
                "round_trips": len(every),
                "blocks": len(mine),
                "median_us": statistics.median(mine) * 1e6,
                "p99_us": every[min(len(every) - 1, int(0.99 * len(every)))] * 1e6,
                "min_us": every[0] * 1e6,
                "hub_cpu_us": statistics.median(b.hub_cpu_s for b in blocks[trial.name]) * 1e6,
                "echo_cpu_us": statistics.median(b.echo_cpu_s for b in blocks[trial.name]) * 1e6,
                "baseline": trial.baseline or "",
                "time_vs_baseline": ratio,
                "target": TARGETS.get(trial.name),
                "block_medians_us": [m * 1e6 for m in mine],
            }
        )
    return rows


def latency_targets(rows: Iterable[dict[str, Any]]) -> Iterator[tuple[str, float, float | None]]:
    """``(what, target, measured)`` for every row with a target: time per round trip as a
    multiple of its baseline's (lower is better; met when measured <= target)."""
    for r in rows:
        if r.get("target") is not None:
            yield (
                f"{r['transport']} vs {r['baseline']}, {r['bytes']} B round trip "
                f"(target <= {r['target']:g}x)",
                r["target"],
                r["time_vs_baseline"],
            )


def _echo_main(argv: list[str]) -> None:
    if argv[0] == "--cpu":
        os.sched_setaffinity(0, {int(argv[1])})
        argv = argv[2:]
    kind, args = argv[0], argv[1:]
    if kind == "socket":
        _echo_socket(int(args[0]))
    elif kind == "pyzmq":
        _echo_pyzmq(int(args[0]))
    elif kind == "tw":
        codec = None if args[2] == "None" else args[2]
        _echo_tensorwire(args[0], checksum=args[1] == "1", codec=codec)
    else:
        raise SystemExit(f"unknown echo kind {kind!r}: use socket, pyzmq or tw")


if __name__ == "__main__":
    if len(sys.argv) < 3 or sys.argv[1] != "echo":
        raise SystemExit("usage: python -m tensorwire.bench.latency echo [--cpu N] KIND ARGS...")
    _echo_main(sys.argv[2:])
