"""One comm between two processes, Dask's tcp:// against tensorwire+tcp://: wall time and the
CPU seconds each side spends moving the same messages, trials interleaved.

``python -m tensorwire.integrations.dask.compare_comm [--messages 40] [--frames 8]
[--frame-mib 6] [--trials 7]`` starts, per trial and protocol, a reader process (a Dask
listener on 127.0.0.1) and a writer process (a Dask comm connected to it). After one warm-up
message and its reply, the writer writes ``--messages`` messages of ``--frames`` numpy
arrays of ``--frame-mib`` MiB (random bytes: incompressible), awaiting each write as Dask's
batched sends do; the reader reads them, deserialized as a worker would, and replies. Each
side reports its process CPU seconds (all its threads) over that stretch, the writer the
wall seconds until the reply; printed are the medians per protocol and their ratio to the
first protocol's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from typing import Any

BOUND_S = 300.0
"""Seconds a trial's processes may take before they are ended."""
KEYS = (
    "wall",
    "writer_cpu",
    "reader_cpu",
    "writer_sys",
    "reader_sys",
    "writer_faults",
    "reader_faults",
)


def _usage() -> tuple[float, float, float]:
    """This process's CPU seconds (all threads), of which in the kernel, and page faults."""
    u = resource.getrusage(resource.RUSAGE_SELF)
    return u.ru_utime + u.ru_stime, u.ru_stime, float(u.ru_minflt + u.ru_majflt)


def _since(before: tuple[float, float, float], side: str) -> dict[str, float]:
    now = _usage()
    names = ("cpu", "sys", "faults")
    return {f"{side}_{k}": a - b for k, a, b in zip(names, now, before, strict=True)}


def _payload(frames: int, frame_mib: int) -> list[Any]:
    import numpy as np

    rng = np.random.default_rng(1)
    return [rng.integers(0, 255, frame_mib << 20, dtype=np.uint8) for _ in range(frames)]


async def _reader(protocol: str) -> None:
    from distributed.comm import listen
    from distributed.comm.core import CommClosedError

    done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    async def handle(comm: Any) -> None:
        count = (await comm.read())["messages"]  # the warm-up message says how many follow
        await comm.write({"op": "ready"})
        started = _usage()
        nbytes = 0
        for _ in range(count):
            msg = await comm.read()
            nbytes += sum(a.nbytes for a in msg["data"].values())
        used = _since(started, "reader")
        try:
            await comm.write({"op": "done", "nbytes": nbytes, **used})
            await comm.read()  # until the writer closes
        except CommClosedError:
            pass
        finally:
            done.set_result(None)

    from tensorwire.codecs.auto import warm_up_codec_libraries

    await asyncio.to_thread(warm_up_codec_libraries().join)  # a comm's first use starts it
    listener = await listen(f"{protocol}://127.0.0.1", handle)
    print(listener.contact_address, flush=True)
    try:
        await asyncio.wait_for(done, BOUND_S)
    finally:
        listener.stop()


async def _writer(address: str, messages: int, frames: int, frame_mib: int) -> dict[str, float]:
    from distributed.comm import connect
    from distributed.protocol import to_serialize

    from tensorwire.codecs.auto import warm_up_codec_libraries

    # as a worker's get_data reply: each array serialized by Dask's numpy serializer
    data = {str(i): to_serialize(a) for i, a in enumerate(_payload(frames, frame_mib))}
    await asyncio.to_thread(warm_up_codec_libraries().join)  # not in the measured stretch
    comm = await connect(address, timeout=30)
    await comm.write({"op": "warm-up", "messages": messages, "data": data})
    await comm.read()
    started, wall = _usage(), time.perf_counter()
    for _ in range(messages):
        await comm.write({"op": "data", "data": data})
    reply = await comm.read()
    used = _since(started, "writer")
    out = {"wall": time.perf_counter() - wall, "nbytes": reply["nbytes"], **used}
    out.update((k, v) for k, v in reply.items() if k.startswith("reader_"))
    await comm.close()
    return out


def _trial(variant: str, args: argparse.Namespace) -> dict[str, float]:
    """One trial of ``variant``: a protocol, or ``protocol@DIR`` to run both processes with
    ``DIR`` (another checkout's ``src``) first on ``PYTHONPATH``: before/after in one run."""
    protocol, _, src = variant.partition("@")
    env = dict(os.environ)
    if src:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
    me = [sys.executable, "-m", "tensorwire.integrations.dask.compare_comm"]
    reader = subprocess.Popen(
        [*me, "--role", "reader", "--protocols", protocol],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert reader.stdout is not None
        address = reader.stdout.readline().strip()
        if not address:
            raise RuntimeError(f"the {variant} reader printed no address (see its stderr)")
        sizes = ["--messages", str(args.messages), "--frames", str(args.frames)]
        writer = subprocess.run(
            [
                *me,
                "--role",
                "writer",
                "--address",
                address,
                *sizes,
                "--frame-mib",
                str(args.frame_mib),
            ],
            capture_output=True,
            text=True,
            timeout=BOUND_S,
            check=True,
            env=env,
        )
        return dict(json.loads(writer.stdout.strip().splitlines()[-1]))
    finally:
        try:
            reader.wait(timeout=30)
        except subprocess.TimeoutExpired:
            reader.kill()
            reader.wait()


def _span(values: list[float]) -> str:
    return (
        f"{min(values):.2f}-{max(values):.2f}"
        if max(values) < 100
        else f"{min(values):.0f}-{max(values):.0f}"
    )


def _print_table(runs: dict[str, list[dict[str, float]]], protocols: list[str]) -> None:
    """Per protocol the median of each measure, and its ratio to the first protocol's."""
    width = max(16, *(len(p) + 2 for p in protocols))
    print(f"{'protocol':<{width}}" + "".join(f"{k:>15}" for k in KEYS))
    base = {k: statistics.median(r[k] for r in runs[protocols[0]]) for k in KEYS}
    for proto in protocols:
        meds = {k: statistics.median(r[k] for r in runs[proto]) for k in KEYS}
        print(f"{proto:<{width}}" + "".join(f"{meds[k]:>15.3f}" for k in KEYS))
        print(
            f"{'  min-max':<{width}}"
            + "".join(f"{_span([r[k] for r in runs[proto]]):>15}" for k in KEYS)
        )
        if proto != protocols[0]:
            ratios = "".join(
                f"{meds[k] / base[k] if base[k] else float('nan'):>15.2f}" for k in KEYS
            )
            print(f"{'  / ' + protocols[0]:<{width}}" + ratios)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--messages", type=int, default=40)
    p.add_argument("--frames", type=int, default=8)
    p.add_argument("--frame-mib", type=int, default=6)
    p.add_argument("--trials", type=int, default=7)
    p.add_argument(
        "--protocols",
        default="tcp,tensorwire+tcp",
        help="comma-separated; protocol@DIR runs that one with DIR first on PYTHONPATH",
    )
    p.add_argument("--role", choices=["compare", "reader", "writer"], default="compare")
    p.add_argument("--address", help="writer: the reader's address")
    args = p.parse_args(argv)
    if args.role == "reader":
        asyncio.run(_reader(args.protocols))
        return
    if args.role == "writer":
        got = asyncio.run(_writer(args.address, args.messages, args.frames, args.frame_mib))
        print(json.dumps(got), flush=True)
        return
    protocols = args.protocols.split(",")
    runs: dict[str, list[dict[str, float]]] = {proto: [] for proto in protocols}
    for _ in range(args.trials):
        for proto in protocols:
            runs[proto].append(_trial(proto, args))
    gb = args.messages * args.frames * (args.frame_mib << 20) / 1e9
    print(
        f"{args.messages} messages x {args.frames} frames x {args.frame_mib} MiB ({gb:.2f} GB), "
        f"one comm, 2 processes, 127.0.0.1; medians of {args.trials} interleaved trials"
    )
    _print_table(runs, protocols)


if __name__ == "__main__":
    main()
