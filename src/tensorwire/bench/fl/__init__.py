"""``tensorwire bench fl``: the FedComm benchmark, FedAvg runs on the emulated testbed.

For each :class:`~tensorwire.bench.fl_matrix.Experiment` the links get the experiment's
profile and loss (and each device its own link, with ``links``), on a testbed of the
experiment's topology (a new one when the topology changes); a broker (mqtt, amqp) starts
inside the server namespace, or in the switch's on ``shared-broker-near``; the FL server runs
as its own process there (``tensorwire fl server``) and each device as its own process in its
namespace (``tensorwire fl client``, one torch thread); a stressor loads the devices or their
links for the run, bounded in time. The server appends an event per round to
``progress.jsonl`` and waits for an acknowledgement, and in between this process reads the
testbed's counters, so each round's retransmissions and link bytes are exactly its own.

A run directory holds ``manifest.json`` and ``experiments/<key>/``, each with
``manifest.json``, ``rounds.parquet``, ``transfers.parquet``, ``counters.parquet``,
``progress.jsonl``, ``logs/`` and, once complete, ``done``: a rerun skips those. Then
``experiments.parquet``, ``figures/`` and ``report.html`` are made from all of them.
Where no network namespaces can be made the run goes on :class:`LoopbackTestbed`, and every
output says "unshaped loopback".

One module per step: :mod:`.feasibility` (what can run here), :mod:`.endpoints` (URLs and
brokers), :mod:`.commands` (the processes' command lines and deadlines), :mod:`.experiment`
(one experiment) and :mod:`.runner` (the matrix).
"""

from tensorwire.bench.fl.commands import (
    ACK_TIMEOUT,
    JOIN_TIMEOUT,
    ROUND_TIMEOUT,
    device_command,
    experiment_limit,
    fault_deadline,
    round_deadline,
    round_quorum,
    server_command,
)
from tensorwire.bench.fl.endpoints import (
    PACE,
    SERVER_PORT,
    Endpoints,
    device_rates,
    endpoints,
    enrol,
    hub_tls,
    min_rate,
)
from tensorwire.bench.fl.experiment import (
    DEVICE_EXIT_GRACE,
    DONE,
    FAILED,
    POLL,
    ExperimentFailed,
    ProgressReader,
    run_experiment,
)
from tensorwire.bench.fl.feasibility import (
    choose_testbed,
    fault_problem,
    protocol_problem,
    skip_reasons,
)
from tensorwire.bench.fl.runner import RunSummary, run_label, run_matrix

__all__ = [
    "ACK_TIMEOUT",
    "DEVICE_EXIT_GRACE",
    "DONE",
    "FAILED",
    "JOIN_TIMEOUT",
    "PACE",
    "POLL",
    "ROUND_TIMEOUT",
    "SERVER_PORT",
    "Endpoints",
    "ExperimentFailed",
    "ProgressReader",
    "RunSummary",
    "choose_testbed",
    "device_command",
    "device_rates",
    "endpoints",
    "enrol",
    "experiment_limit",
    "fault_deadline",
    "fault_problem",
    "hub_tls",
    "min_rate",
    "protocol_problem",
    "round_deadline",
    "round_quorum",
    "run_experiment",
    "run_label",
    "run_matrix",
    "server_command",
    "skip_reasons",
]
