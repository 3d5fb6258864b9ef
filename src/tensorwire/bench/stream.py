"""``tensorwire bench stream``: many record batches one way, tensorwire streams against Arrow
Flight ``DoGet``, in the same run.

The workload is the Arrow Flight benchmark's: batches of ``records`` rows of ``columns`` int64
columns (4,096 x 4 = 128 KiB a batch), ``batches`` per stream, ``streams`` at once. The sending
side (a tensorwire hub's :meth:`~tensorwire.Hub.send_many`, or a Flight server's ``do_get``)
runs in this process on one CPU; the receiving side (:meth:`~tensorwire.Channel.stream`, or
``FlightClient.do_get``) in a peer process on the other, which times each batch: the wait from
asking for the next batch to having it (as the Flight benchmark does), and the wall time from
the request to the last batch. Each side also reports the CPU its whole process spent per
batch (every thread: gRPC's C++ ones too), so a contender that is faster only because it
spreads work over more threads shows it. Both sides keep their connections across trials
(connecting is never timed); every contender runs one untimed warm-up trial first; then
trials alternate between the contenders, and figures are medians over trials.

The peer is this module run as ``python -m tensorwire.bench.stream peer``; it reads one
command per line on stdin (``tw URL ID S`` / ``doget PORT S``) and answers one JSON line.
"""

from __future__ import annotations

import contextlib
import json
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np

import tensorwire
from tensorwire.bench.transfer import _CPUS, pinned_sender
from tensorwire.transports.local import local_hub_url
from tensorwire.transports.registry import get_transport

FLIGHT = "pyarrow-flight-doget"

TARGETS = {"tensorwire-tcp": (1.0, True), "tensorwire-flight": (0.9, False)}
"""Issue 12's streaming targets: MB/s as a multiple of Flight DoGet's in the same run, and
whether the p99 wait must be no worse than DoGet's too."""


def make_columns(records: int, columns: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {f"c{i}": rng.integers(0, 1 << 62, records, dtype=np.int64) for i in range(columns)}


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q)) if values else float("nan")


# --- the receiving peer -------------------------------------------------------------------


def _receive_tw(url: str, cid: str, streams: int) -> dict[str, Any]:
    """Receive one stream on each of ``streams`` channels (ids ``cid-0`` ...)."""
    key = (url, cid, streams)
    if key not in _peer_channels:
        _peer_channels[key] = [
            tensorwire.connect(url, client_id=f"{cid}-{k}", codec=None, timeout=120)
            for k in range(streams)
        ]
    chans = _peer_channels[key]
    waits: list[float] = []
    nbytes = [0]
    lock = threading.Lock()

    def one(ch: tensorwire.Channel) -> None:
        mine: list[float] = []
        got = 0
        it = ch.stream(timeout=120)
        while True:
            t = time.perf_counter()
            try:
                batch = next(it)
            except StopIteration:
                break
            mine.append(time.perf_counter() - t)
            got += sum(a.nbytes for a in batch.message.tensors.values())
        with lock:
            waits.extend(mine)
            nbytes[0] += got

    started, cpu = time.perf_counter(), time.process_time()
    _run_all([lambda ch=ch: one(ch) for ch in chans])
    return {
        "seconds": time.perf_counter() - started,
        "cpu_s": time.process_time() - cpu,
        "bytes": nbytes[0],
        "waits": waits,
    }


_peer_channels: dict[Any, list[tensorwire.Channel]] = {}


def _receive_flight(port: int, streams: int) -> dict[str, Any]:
    import pyarrow.flight as flight

    # one client (and gRPC connection) per port for every trial, as the tensorwire channels
    # are kept: connecting is not timed on either side
    if port not in _peer_clients:
        _peer_clients[port] = flight.FlightClient(("127.0.0.1", port))
        _peer_clients[port].wait_for_available(timeout=120)
    client = _peer_clients[port]
    waits: list[float] = []
    nbytes = [0]
    lock = threading.Lock()

    def one() -> None:
        mine: list[float] = []
        got = 0
        reader = client.do_get(flight.Ticket(b"batches"))
        while True:
            t = time.perf_counter()
            try:
                chunk = reader.read_chunk()
            except StopIteration:
                break
            mine.append(time.perf_counter() - t)
            got += chunk.data.nbytes
        with lock:
            waits.extend(mine)
            nbytes[0] += got

    started, cpu = time.perf_counter(), time.process_time()
    _run_all([one] * streams)
    seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
    return {"seconds": seconds, "cpu_s": cpu, "bytes": nbytes[0], "waits": waits}


_peer_clients: dict[int, Any] = {}


def _run_all(jobs: list[Any]) -> None:
    errors: list[BaseException] = []

    def wrap(job: Any) -> None:
        try:
            job()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=wrap, args=(j,)) for j in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


def peer_main() -> None:
    try:
        for line in sys.stdin:
            parts = line.split()
            if not parts:
                continue
            if parts[0] == "tw":
                out = _receive_tw(parts[1], parts[2], int(parts[3]))
            elif parts[0] == "doget":
                out = _receive_flight(int(parts[1]), int(parts[2]))
            elif parts[0] == "ucxx":
                from tensorwire.bench import stream_ucxx

                out = stream_ucxx.receive(*map(int, parts[1:5]))
            else:
                break
            print(json.dumps(out), flush=True)
    finally:  # say goodbye: a Flight call left to the interpreter's exit logs its cancel
        for chans in _peer_channels.values():
            for ch in chans:
                ch.close()
        if "tensorwire.bench.stream_ucxx" in sys.modules:
            sys.modules["tensorwire.bench.stream_ucxx"].close_peer()


# --- the sending side -----------------------------------------------------------------------


class _FlightSource:
    """A Flight server whose ``do_get`` sends ``batches`` copies of one record batch."""

    def __init__(self, columns: dict[str, np.ndarray]) -> None:
        import pyarrow as pa
        import pyarrow.flight as flight

        batch = pa.RecordBatch.from_pydict(columns)
        source = self

        class Server(flight.FlightServerBase):
            def do_get(self, context: Any, ticket: Any) -> Any:
                return flight.GeneratorStream(batch.schema, (batch for _ in range(source.batches)))

        self.batches = 0
        self.server = Server("grpc://127.0.0.1:0")
        self.port = self.server.port

    def close(self) -> None:
        self.server.shutdown()


def bench_stream(
    transports: list[str],
    *,
    records: int = 4096,
    columns: int = 4,
    batches: int = 1000,
    streams: int = 1,
    window: int = 16,
    repeat: int = 5,
    flight_baseline: bool = True,
    ucxx_baseline: bool = False,
    progress: Any = None,
) -> list[dict[str, Any]]:
    """Run the trials; return one row per contender with MB/s, batches/s and per-batch wait
    mean and percentiles (medians over ``repeat`` interleaved trials). ``ucxx_baseline``: also
    raw ucxx (:mod:`tensorwire.bench.stream_ucxx`), ``ucx://``'s baseline."""
    data = make_columns(records, columns)
    batch_bytes = sum(a.nbytes for a in data.values())
    pin = ["--cpu", str(_CPUS[-1])] if len(_CPUS) > 1 else []
    peer = subprocess.Popen(
        [sys.executable, "-m", "tensorwire.bench.stream", "peer", *pin],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    trials: dict[str, list[dict[str, Any]]] = {}
    with contextlib.ExitStack() as stack, pinned_sender():
        stack.callback(_stop_peer, peer)
        runs: list[tuple[str, Any]] = []
        if flight_baseline:
            source = _FlightSource(data)
            stack.callback(source.close)

            def run_flight(source: _FlightSource = source) -> dict[str, Any]:
                source.batches = batches
                return _ask(peer, f"doget {source.port} {streams}")

            runs.append((FLIGHT, run_flight))
        if ucxx_baseline:
            from tensorwire.bench.stream_ucxx import NAME, UcxxSource

            ucxx = UcxxSource(data, streams)
            stack.callback(ucxx.close)

            def run_ucxx(source: UcxxSource = ucxx) -> dict[str, Any]:
                source.batches = batches
                return _ask(peer, f"ucxx {source.port} {streams} {batches} {batch_bytes}")

            runs.append((NAME, run_ucxx))
        for name in transports:
            entry = get_transport(name)
            url = stack.enter_context(local_hub_url(name))
            hub = stack.enter_context(tensorwire.serve(url, codec=None))
            runs.append((entry.label, _tw_run(peer, hub, data, batches, streams, window)))
        for _, run in runs:  # untimed: TCP and HTTP/2 windows grow, caches fill, on every side
            run()
        for _ in range(repeat):
            for label, run in runs:
                cpu = time.process_time()
                res = run()
                res["send_cpu_s"] = time.process_time() - cpu
                trials.setdefault(label, []).append(res)
                if progress is not None:
                    progress()
    rows = []
    for label, results in trials.items():
        mbs = [res["bytes"] / res["seconds"] / 1e6 for res in results]
        bps = [batches * streams / res["seconds"] for res in results]
        row: dict[str, Any] = {
            "contender": label,
            "batch_bytes": batch_bytes,
            "batches": batches,
            "streams": streams,
            "mb_per_s": statistics.median(mbs),
            "batches_per_s": statistics.median(bps),
        }
        row["mean_us"] = statistics.median(statistics.fmean(res["waits"]) * 1e6 for res in results)
        for q in (50, 95, 99):
            row[f"p{q}_us"] = statistics.median(
                percentile(res["waits"], q) * 1e6 for res in results
            )
        row["max_us"] = statistics.median(max(res["waits"]) * 1e6 for res in results)
        # CPU seconds each process spent per batch, all its threads (gRPC's C++ ones too)
        for side, key in (("send", "send_cpu_s"), ("recv", "cpu_s")):
            row[f"{side}_cpu_us"] = statistics.median(
                res[key] / (batches * streams) * 1e6 for res in results
            )
        ok = all(res["bytes"] == batch_bytes * batches * streams for res in results)
        row["complete"] = ok
        rows.append(row)
    base = next((r for r in rows if r["contender"] == FLIGHT), None)
    for row in rows:
        row["vs_flight"] = row["mb_per_s"] / base["mb_per_s"] if base else None
    return rows


def _tw_run(
    peer: subprocess.Popen[str],
    hub: tensorwire.Hub,
    data: dict[str, np.ndarray],
    batches: int,
    streams: int,
    window: int,
) -> Any:
    cid = f"stream-{id(hub) % 10_000}"
    state: dict[str, Any] = {}

    def run() -> dict[str, Any]:
        assert peer.stdin is not None and peer.stdout is not None
        peer.stdin.write(f"tw {hub.url} {cid} {streams}\n")
        peer.stdin.flush()
        if not state:
            hub.wait_for(streams, timeout=120)
            state["ids"] = [f"{cid}-{k}" for k in range(streams)]

        def source() -> Iterator[dict[str, np.ndarray]]:
            for _ in range(batches):
                yield data

        _run_all(
            [
                lambda c=c: hub.send_many(c, source(), window=window, timeout=120)
                for c in state["ids"]
            ]
        )
        return json.loads(peer.stdout.readline())

    return run


def _ask(peer: subprocess.Popen[str], command: str) -> dict[str, Any]:
    assert peer.stdin is not None and peer.stdout is not None
    peer.stdin.write(command + "\n")
    peer.stdin.flush()
    line = peer.stdout.readline()
    if not line:
        raise RuntimeError("the stream peer died")
    return json.loads(line)


def _stop_peer(peer: subprocess.Popen[str]) -> None:
    with contextlib.suppress(OSError):
        assert peer.stdin is not None
        peer.stdin.write("quit\n")
        peer.stdin.close()
    try:
        peer.wait(timeout=30)
    except subprocess.TimeoutExpired:
        peer.kill()


def stream_targets(rows: list[dict[str, Any]]) -> Iterator[tuple[str, bool | None, str]]:
    """``(what, met, measured)`` for every contender with a target (:data:`TARGETS`); met is
    None when DoGet was not measured."""
    base = next((r for r in rows if r["contender"] == FLIGHT), None)
    for r in rows:
        if r["contender"] not in TARGETS:
            continue
        target, p99_too = TARGETS[r["contender"]]
        what = f"{r['contender']} vs DoGet, {r['batch_bytes']:,} B batches (target >= {target:g}x"
        what += ", p99 no worse)" if p99_too else ")"
        if base is None or r["vs_flight"] is None:
            yield what, None, "not measured"
            continue
        met = r["vs_flight"] >= target
        measured = f"{r['vs_flight']:.2f}x"
        if p99_too:
            met = met and r["p99_us"] <= base["p99_us"]
            measured += f", p99 {r['p99_us']:,.0f} vs {base['p99_us']:,.0f} µs"
        yield what, met, measured


if __name__ == "__main__":
    args = sys.argv[1:]
    if args[:1] == ["peer"]:
        if args[1:2] == ["--cpu"]:
            import os

            os.sched_setaffinity(0, {int(args[2])})
        peer_main()
