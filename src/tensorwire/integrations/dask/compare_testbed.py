"""Dask's tcp:// against tensorwire+tcp:// with each process in its own network namespace,
behind a shaped link: :mod:`tensorwire.integrations.dask.compare` on the testbed.

``python -m tensorwire.integrations.dask.compare_testbed [--link 100mbit] [--n 14336]
[--trials 3] [--values rounded]`` (root) opens a testbed of two device namespaces, each
behind its own link shaped with ``--link`` both ways (a star), and runs per protocol a
scheduler in the server namespace and one worker in each device namespace (one thread, no
nanny): what one worker fetches from the other crosses both workers' shaped links. The
trials run from the server namespace (``compare --schedulers``), interleaved, and print
compare's table. Nothing uses the machine's own interfaces.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

SCHEDULER_PORT = 9786  # + the protocol's index, in the server namespace (fresh: free)
RUN_LIMIT_S = 3600.0  # the trials' bound


def _dask() -> str:
    return str(Path(sys.executable).with_name("dask"))


def _wait_listening(tb: Any, port: int, proc: subprocess.Popen[Any], log: Path) -> None:
    deadline = time.monotonic() + 120
    while not tb._listening(tb.node("srv"), port, "tcp"):  # polled: it says nothing else
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the scheduler on port {port} did not start: {log.read_text()}")
        time.sleep(0.2)


def main(argv: list[str] | None = None) -> None:
    from tensorwire.testbed import Testbed

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--link", default="100mbit", help="each device's link (testbed profile)")
    p.add_argument("--n", type=int, default=14336)
    p.add_argument("--trials", type=int, default=3)
    p.add_argument("--values", choices=["random", "rounded"], default="rounded")
    p.add_argument("--protocols", default="tcp,tensorwire+tcp")
    p.add_argument("--logs", type=Path, default=Path("results") / "dask-testbed")
    args = p.parse_args(argv)
    protocols = args.protocols.split(",")
    args.logs.mkdir(parents=True, exist_ok=True)
    with Testbed(devices=2, profile=args.link) as tb:
        server = tb.address("srv")
        schedulers = []
        for i, proto in enumerate(protocols):
            port = SCHEDULER_PORT + i
            log = args.logs / f"scheduler-{i}.log"
            with open(log, "wb") as out:
                sched = tb.popen(
                    "srv",
                    [_dask(), "scheduler", "--protocol", proto, "--host", server,
                     "--port", str(port), "--no-dashboard", "--dashboard-address", ":0"],
                    stdout=out, stderr=subprocess.STDOUT,
                )  # fmt: skip
            _wait_listening(tb, port, sched, log)
            address = f"{proto}://{server}:{port}"
            schedulers.append(f"{proto}={address}")
            for dev in ("dev1", "dev2"):
                with open(args.logs / f"worker-{i}-{dev}.log", "wb") as out:
                    tb.popen(
                        dev,
                        [_dask(), "worker", address, "--host", tb.address(dev),
                         "--nthreads", "1", "--no-nanny", "--memory-limit", "6GiB",
                         "--no-dashboard"],
                        stdout=out, stderr=subprocess.STDOUT,
                    )  # fmt: skip
        driver = [
            sys.executable, "-m", "tensorwire.integrations.dask.compare",
            "--n", str(args.n), "--trials", str(args.trials), "--values", args.values,
            "--protocols", args.protocols, "--schedulers", ",".join(schedulers),
            "--where", f"each worker in its namespace behind a {args.link} link",
        ]  # fmt: skip
        done = subprocess.run(tb.command("srv", driver), check=False, timeout=RUN_LIMIT_S)
    sys.exit(done.returncode)


if __name__ == "__main__":
    main()
