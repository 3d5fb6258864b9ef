"""About how long a ``bench fl`` matrix takes here, to decide whether to start it."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tensorwire.bench.fl_matrix import Matrix


CONFIRM_ABOVE_S = 15 * 60  # a bench fl run estimated longer asks before it starts

# Calibrated on this project's 2-core machine against whole quick runs (digits, VGG-5, 4
# devices, 3 rounds, 7 protocols at 4g): 141 s on a quiet machine (a fresh clone's
# main.sh, 2026-11-29), 143 s and 300 s with the machine shared; 203 s estimated. Each
# figure below is a quiet machine's; a busy one scales the whole (:func:`load_factor`).
QUICK_RUNS_S = (141.0, 143.0, 300.0)

_EXPERIMENT_S = 13.5  # per experiment: testbed, broker, processes, the first round's warm-up

_ROUND_S = 1.5  # per round: evaluation, aggregation, counters

# Training seconds per sample and CPU core (train_s_max of VGG-5 rounds: 1-2 s a device).
_TRAIN_S_PER_SAMPLE = {"vgg5": 0.0025, "vgg8": 0.012, "resnet18": 0.035}

BUSY_CAP = 3.0  # the most a busy machine is taken to stretch a run

_TRAIN_SAMPLES = {"digits": 1437, "synthetic": 400, "cifar10": 50000}

_MODEL_BYTES = {"vgg5": 582_346 * 4, "vgg8": 1_337_898 * 4, "resnet18": 44_734_408}


def estimate_seconds(matrix: Matrix, cores: int | None = None) -> float:
    """A rough wall time for the experiments of ``matrix``: training from the dataset's size
    and the model, transfers from the model's bytes and the profile's rate, plus a fixed cost
    per round and per experiment; loss and stress lengthen them. An estimate, to decide
    whether to start, not a measurement."""
    from tensorwire.fl.config import payload_bytes

    cores = cores or len(os.sched_getaffinity(0))
    total = 0.0
    for exp in matrix.experiments():
        model = exp.model.lower()
        payload = payload_bytes(exp.model)
        per_sample = _TRAIN_S_PER_SAMPLE.get(model, max(_TRAIN_S_PER_SAMPLE.values()))
        samples = _TRAIN_SAMPLES.get(exp.dataset, 50000) / exp.clients
        train = exp.epochs * samples * per_sample * max(1.0, exp.clients / cores)
        train = 0.0 if payload is not None else train  # a payload does not train
        rate = exp.link_profile().rate or 1e9  # per-device links: the slowest one's
        size = payload if payload is not None else _MODEL_BYTES.get(model)
        comm = 2 * (size or max(_MODEL_BYTES.values())) * 8 / rate
        comm *= 1 + 10 * exp.loss
        if exp.stress == "cpu":
            train *= 2
        elif exp.stress == "network":
            comm *= 1.5
        total += _EXPERIMENT_S + exp.rounds * (train + comm + _ROUND_S)
        total += _fault_seconds(exp)
    return total


def _fault_seconds(exp: Any) -> float:
    """What an experiment's faults add: a round that waits out its deadline for each hung
    device or flapped link, a broker's restart."""
    from tensorwire.bench.fl import round_deadline
    from tensorwire.bench.fl_faults import parse_scenario

    added = 0.0
    for event in parse_scenario(exp.faults, exp.clients, exp.rounds):
        if event.kind in ("hang", "flap"):
            added += round_deadline(exp)
        elif event.kind == "broker":
            added += 15.0
    return added


def load_factor(cores: int | None = None) -> float:
    """How much longer than on a quiet machine a run takes here now: the 1-minute load
    average over the cores, between 1 and :data:`BUSY_CAP` (runs share the cores)."""
    cores = cores or len(os.sched_getaffinity(0))
    try:
        load = os.getloadavg()[0]
    except OSError:  # no load average on this platform
        return 1.0
    return min(BUSY_CAP, max(1.0, load / cores))


def duration_words(seconds: float) -> str:
    minutes = max(1, round(seconds / 60))
    return f"{minutes} min" if minutes < 60 else f"{minutes // 60} h {minutes % 60:02d} min"
