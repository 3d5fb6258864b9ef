"""What sealing costs a group: allreduce over ``RANKS`` rank processes on loopback, each rank
in two groups at once (plain, and sealed with per-rank keys and certificates), the two timed
in turn within every round (the order alternating), the first round a warm-up.

    python tests/collective/seal_cost.py [ROUNDS]

Prints, per size, the median over rounds of the slowest rank's time per allreduce, plain and
sealed, the median of the rounds' sealed / plain ratios, and the CPU time all ranks spent
per allreduce (less at the mercy of other jobs on a shared machine than the wall clock).
(Run by hand; its figures are in docs/collective.md.)
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

RANKS = 4
SIZES = {"4 KiB": 4 << 10, "64 MiB": 64 << 20}
ITERATIONS = {"4 KiB": 200, "64 MiB": 2}
SRC = Path(__file__).resolve().parents[2] / "src"


def rank_main(rank: int, plain_url: str, sealed_url: str, certs: str, rounds: int) -> None:
    from tensorwire.collective import Group

    groups = {
        "plain": Group.join(plain_url, rank=rank, size=RANKS, serve=False, timeout=600),
        "sealed": Group.join(
            sealed_url, rank=rank, size=RANKS, serve=False, timeout=600, credentials=certs
        ),
    }
    times: dict[str, dict[str, list[float]]] = {
        s: {"plain": [], "sealed": [], "plain_cpu": [], "sealed_cpu": []} for s in SIZES
    }
    for r in range(rounds + 1):
        for size, nbytes in SIZES.items():
            order = ["plain", "sealed"] if r % 2 == 0 else ["sealed", "plain"]
            for name in order:
                group = groups[name]
                x = np.zeros(nbytes // 4, np.float32)  # sums stay finite
                group.barrier()
                t0, c0 = time.perf_counter(), time.process_time()
                for _ in range(ITERATIONS[size]):
                    group.allreduce(x)
                took = np.array([(time.perf_counter() - t0) / ITERATIONS[size]])
                cpu = np.array([(time.process_time() - c0) / ITERATIONS[size]])
                group.allreduce(took, "max")  # the slowest rank's
                group.allreduce(cpu, "sum")  # every rank's
                if r:
                    times[size][name].append(float(took[0]))
                    times[size][f"{name}_cpu"].append(float(cpu[0]))
    for group in groups.values():
        group.close()
    if rank == 0:
        print(json.dumps(times), flush=True)


def main(rounds: int) -> None:
    from tensorwire.collective import Rendezvous
    from tensorwire.transports.certs import make_certs

    with tempfile.TemporaryDirectory() as d:
        clients = [f"rank-{r}" for r in range(RANKS)]
        certs = make_certs(d, hosts=["127.0.0.1"], clients=clients).directory
        plain = Rendezvous("tcp://127.0.0.1:0", RANKS, timeout=600)
        sealed = Rendezvous("tcp://127.0.0.1:0", RANKS, timeout=600, credentials=certs)
        env = {**os.environ, "PYTHONPATH": str(SRC)}
        args = [plain.url, sealed.url, str(certs), str(rounds)]
        procs = [
            subprocess.Popen(
                [sys.executable, __file__, "--rank", str(r), *args],
                env=env,
                stdout=subprocess.PIPE,
                text=True,
            )
            for r in range(RANKS)
        ]
        out, _ = procs[0].communicate(timeout=3600)
        for p in procs[1:]:
            p.wait(timeout=600)
        plain.close()
        sealed.close()
    times = json.loads(out)
    print(f"allreduce float32 over {RANKS} ranks on loopback, median of {rounds} rounds")
    for size, by in times.items():
        p, s = statistics.median(by["plain"]), statistics.median(by["sealed"])
        paired = statistics.median(b / a for a, b in zip(by["plain"], by["sealed"], strict=True))
        pc, sc = statistics.median(by["plain_cpu"]), statistics.median(by["sealed_cpu"])
        print(
            f"{size:>7}: plain {p * 1e3:9.3f} ms  sealed {s * 1e3:9.3f} ms  "
            f"x{s / p:.2f} (rounds' ratios: x{paired:.2f}); CPU of all ranks: "
            f"plain {pc * 1e3:.3f} ms, sealed {sc * 1e3:.3f} ms (x{sc / pc:.2f})"
        )
        for key, values in by.items():
            print(f"    {key:>10} {[round(t * 1e3, 3) for t in values]}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--rank"]:
        a = sys.argv[2:]
        rank_main(int(a[0]), a[1], a[2], a[3], int(a[4]))
    else:
        main(int(sys.argv[1]) if len(sys.argv) > 1 else 5)
