"""The command lines of an experiment's server and devices, and the deadlines, quorum and
time limit they run under."""

from __future__ import annotations

import sys
from pathlib import Path

from tensorwire.bench.fl_matrix import Experiment, fanout_of

JOIN_TIMEOUT = 180.0  # seconds the server waits for every device (2 s of torch import each)

ROUND_TIMEOUT = 600.0  # seconds the server waits for a round's updates

ACK_TIMEOUT = 5.0  # seconds the server waits, after a round, for the counters to be read


def _python_tensorwire(*args: str) -> list[str]:
    return [sys.executable, "-m", "tensorwire", *args]


def round_deadline(exp: Experiment) -> float:
    """The deadline of each round of ``exp``: its own, else :data:`ROUND_TIMEOUT` without
    faults and :func:`fault_deadline` with."""
    if exp.deadline is not None:
        return exp.deadline
    return ROUND_TIMEOUT if exp.faults == "none" else fault_deadline(exp)


def fault_deadline(exp: Experiment) -> float:
    """A deadline a round of ``exp`` meets without faults: three times its transfers at the
    slowest link's rate (the model down and the update up), plus 30 s for training,
    evaluation and a device's start."""
    from tensorwire.fl.models import model_bytes

    size = model_bytes(exp.model) or 50_000_000
    rate = exp.link_profile().rate or 1e9
    return round(30.0 + 3 * 2 * size * 8 / rate, 1)


def round_quorum(exp: Experiment) -> int:
    """The updates a round of ``exp`` needs: its own quorum, else half the devices (at least
    one) with faults, and one without (every sampled device is waited for anyway)."""
    if exp.quorum is not None:
        return exp.quorum
    return 1 if exp.faults == "none" else max(1, -(-exp.clients // 2))


def server_command(
    exp: Experiment, url: str, exp_dir: Path, certs: Path | None = None, resume: bool = False
) -> list[str]:
    """``tensorwire fl server`` for ``exp``, writing results and progress into ``exp_dir``;
    ``resume``: going on from the last checkpoint there."""
    secured = ["--certs", str(certs)] if certs is not None else []
    secured += ["--resume", str(exp_dir)] if resume else []
    fanout = fanout_of(exp.protocol)
    fanout_args = ["--fanout", fanout] if fanout != "concurrent" else []
    return [
        *_python_tensorwire(),
        "fl",
        "server",
        "--url",
        url,
        "--dataset",
        exp.dataset,
        "--model",
        exp.model,
        "--clients",
        str(exp.clients),
        "--rounds",
        str(exp.rounds),
        "--uplink",
        exp.uplink,
        "--ratio",
        repr(exp.ratio),
        "--downlink",
        exp.downlink,
        "--codec",
        exp.codec,
        "--epochs",
        str(exp.epochs),
        "--seed",
        str(exp.rep),
        "--join-timeout",
        str(JOIN_TIMEOUT),
        "--round-timeout",
        str(round_deadline(exp)),
        "--min-updates",
        str(round_quorum(exp)),
        "--out",
        str(exp_dir),
        "--progress",
        str(exp_dir / "progress.jsonl"),
        "--progress-ack",
        str(ACK_TIMEOUT),
        *secured,
        *fanout_args,
    ]


def device_command(url: str, device: int, certs: Path | None = None) -> list[str]:
    """``tensorwire fl client`` as device ``device``, one torch thread."""
    from tensorwire.fl.run import device_command as fl_device_command

    timeout = max(JOIN_TIMEOUT, ROUND_TIMEOUT)
    return [*fl_device_command(url, device, timeout, certs), "--threads", "1"]


def experiment_limit(exp: Experiment) -> float:
    """Seconds after which an experiment is stopped as failed: join plus every round."""
    return JOIN_TIMEOUT + exp.rounds * round_deadline(exp) + 60.0
