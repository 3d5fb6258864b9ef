"""The ``tensorwire`` command as a newcomer meets it: one-line errors (the traceback with
--debug), retries that say so, comma-separated lists, choices checked before anything starts,
and a long ``bench fl`` that says how long and asks first. Run as users run it, in a
subprocess with no terminal.
"""

from __future__ import annotations

import logging
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tensorwire.bench.fl_matrix import Matrix, registered_protocols
from tensorwire.cli.app import CONFIRM_ABOVE_S, estimate_seconds, split_profiles


@pytest.fixture(autouse=True)
def _logger_as_it_was():
    """The command sends tensorwire's logs to its own handler; other tests' caplog needs them
    back on the root logger after an in-process run."""
    logger = logging.getLogger("tensorwire")
    saved = (list(logger.handlers), logger.level, logger.propagate)
    yield
    logger.handlers[:] = saved[0]
    logger.setLevel(saved[1])
    logger.propagate = saved[2]


def tensorwire(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tensorwire", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
        check=False,
        env={k: v for k, v in os.environ.items() if k != "TENSORWIRE_DEBUG"} | {"COLUMNS": "200"},
    )


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_profiles_are_comma_separated_and_keep_their_settings(capsys):
    assert split_profiles("3g,4g") == ("3g", "4g")
    assert split_profiles("3g, 20mbit,delay=30ms,loss=1%,wifi") == (
        "3g",
        "20mbit,delay=30ms,loss=1%",
        "wifi",
    )
    assert capsys.readouterr().err == ""
    # the old separator still works, and says it is deprecated
    assert split_profiles("3g;20mbit,delay=30ms") == ("3g", "20mbit,delay=30ms")
    assert "deprecated" in capsys.readouterr().err


def test_a_runtime_error_is_one_line_and_debug_shows_the_traceback(tmp_path):
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    done = tensorwire("certs", "--out", str(blocked / "certs"))
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("error: ") and "Error" in lines[0] and "--debug" in lines[0]
    debug = tensorwire("--debug", "certs", "--out", str(blocked / "certs"))
    assert debug.returncode == 1
    assert "Traceback" in debug.stderr or "────" in debug.stderr, debug.stderr
    assert len(debug.stderr.splitlines()) > 5


def test_a_device_that_cannot_reach_its_server_says_so_while_it_retries():
    url = f"tcp://127.0.0.1:{closed_port()}"
    done = tensorwire("fl", "client", "--url", url, "--id", "1", "--timeout", "3")
    assert done.returncode == 1
    assert f"cannot reach the hub at {url}" in done.stderr
    assert "retrying (1; giving up in" in done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "TransportTimeout" in errors[0], done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--models", "vgg99"], "no model 'vgg99'; choose among vgg5, vgg8"),
        (["--dataset", "mnist"], "no dataset 'mnist'"),
        (["--protocols", "tcp,carrier-pigeon"], "protocol 'carrier-pigeon': choose among"),
        (["--profiles", "3g,5g"], "no profile '5g': name one of 3g, 4g, wifi, lan, none"),
    ],
)
def test_bench_fl_checks_its_choices_before_anything_starts(tmp_path, args, says):
    out = tmp_path / "run"
    done = tensorwire("bench", "fl", "--quick", "--out", str(out), *args)
    assert done.returncode == 2, done.stdout + done.stderr
    assert says in " ".join((done.stdout + done.stderr).split()).replace("│", "").replace("  ", " ")
    assert not out.exists()


def test_fl_run_checks_its_protocol_before_anything_starts(tmp_path):
    out = tmp_path / "run"
    done = tensorwire("fl", "run", "--protocol", "tcpp", "--out", str(out))
    assert done.returncode == 2, done.stdout + done.stderr
    said = " ".join(done.stderr.replace("│", " ").split())
    assert "no transport 'tcpp'" in said and "choose among tcp, zmq" in said
    assert "mem" not in said.split("choose among")[1]  # one process only: not for devices
    assert not out.exists()


@pytest.mark.parametrize("role", ["server", "client"])
def test_a_certs_directory_that_is_not_there_is_one_line_with_the_command(tmp_path, role):
    missing = tmp_path / "nowhere"
    args = ["--url", "tcp://127.0.0.1:0", "--certs", str(missing)]
    if role == "client":
        args += ["--id", "device-1", "--timeout", "2"]
    done = tensorwire("fl", role, *args)
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert done.returncode == 1 and len(errors) == 1, done.stderr
    command = f"tensorwire certs --out {missing}" + (
        " --clients device-1" if role == "client" else ""
    )
    assert f"{missing} does not exist: make the files with `{command}`" in errors[0]


def test_the_full_matrix_says_its_size_and_time_and_waits_for_yes(tmp_path):
    out = tmp_path / "run"
    done = tensorwire("bench", "fl", "--out", str(out))
    assert done.returncode == 1, done.stdout + done.stderr
    text = " ".join(done.stdout.split())
    protocols = len(registered_protocols())
    assert f"bench fl: {protocols * 2 * 3} experiment(s), 5 round(s) each" in text
    busy = r"(, [0-9.]+x for the other jobs sharing the CPUs)?"  # a loaded machine: longer
    assert re.search(r"\(a rough estimate" + busy + r"\);", text)
    said = "shape each device's link" in text or "needs root for network namespaces" in text
    assert said and text.count("network namespaces") == 1, text  # said once
    assert "add --yes to start it" in done.stderr
    assert not out.exists()  # nothing started


def test_the_estimate_grows_with_the_work():
    quick = Matrix.quick()
    assert 60 < estimate_seconds(quick, cores=2) < CONFIRM_ABOVE_S  # quick never asks
    longer = Matrix(protocols=quick.protocols, rounds=6)
    slower = Matrix(protocols=quick.protocols, profiles=("3g",))
    bigger = Matrix(protocols=quick.protocols, models=("vgg8",))
    for matrix in (longer, slower, bigger):
        assert estimate_seconds(matrix, cores=2) > estimate_seconds(quick, cores=2)
    assert estimate_seconds(quick, cores=8) < estimate_seconds(quick, cores=2)


def test_help_lists_the_protocols_and_says_lists_are_comma_separated():
    done = tensorwire("bench", "fl", "--help")
    text = " ".join(done.stdout.replace("│", " ").split())
    for protocol in registered_protocols():
        assert protocol in text
    assert "';'" not in text and "Comma-separated link profiles" in text
    assert "--yes" in text


def test_python_m_and_the_script_are_the_same_command():
    assert Path(sys.executable).with_name("tensorwire").exists()
    assert tensorwire("--version").stdout.startswith("tensorwire ")


def test_an_unknown_transfer_baseline_is_refused_with_the_choices(tmp_path):
    done = tensorwire("bench", "transfer", "--baselines", "pyzmq,nope", "--out", str(tmp_path))
    said = " ".join((done.stdout + done.stderr).replace("│", " ").split())
    assert done.returncode == 2, said
    assert "no baseline 'nope'; choose from:" in said and "socket (raw-socket)" in said
    assert "Traceback" not in said and "a bug?" not in said


def test_bench_transfer_checks_the_small_and_the_big_targets_from_paired_trials(capsys):
    """The verdicts are issue 12's: 128 MiB >= 0.95x and 100x100 float32 >= 0.6x the raw
    socket, each the median of per-round ratios."""
    from tensorwire.cli.bench import _print_targets

    def rows(case: dict, raw: list[float], tcp: list[float]) -> list[dict]:
        return [
            {**case, "transport": "raw-socket", "times_ms": raw},
            {**case, "transport": "tensorwire-tcp", "times_ms": tcp},
        ]

    big = rows({"case": "throughput"}, [40.0, 38.0, 41.0], [41.0, 40.0, 42.0])  # 0.95 to 0.98
    small = {"case": "gsoc", "dtype": "float32", "shape": "100x100"}
    _print_targets(big + rows(small, [0.07, 0.08, 0.07], [0.14, 0.13, 0.10]), 128)
    out = " ".join(capsys.readouterr().out.split())
    assert "128 MiB float32 (target >= 0.95x): 0.98x met" in out
    assert "100x100 float32 (target >= 0.6x): 0.62x met" in out
    _print_targets(big + rows(small, [0.07, 0.07, 0.07], [0.14, 0.14, 0.10]), 128)
    assert "100x100 float32 (target >= 0.6x): 0.50x missed" in " ".join(
        capsys.readouterr().out.split()
    )


def test_a_benchmark_says_once_that_its_hubs_are_open_and_hides_their_chatter(tmp_path):
    """Each of the benchmark's own loopback hubs would warn that it accepts ANYONE, and log
    every echo peer's join and leave: one line says it instead; --debug shows them all."""
    args = ["bench", "latency", "--round-trips", "20", "--repeat", "5", "--payloads", "4096"]
    done = tensorwire(*args, "--no-checksum-off", "--out", str(tmp_path / "quiet"))
    assert done.returncode == 0, done.stderr
    said = " ".join(done.stderr.split())
    assert said.count("its hubs listen on 127.0.0.1 for its own peers only") == 1, said
    assert "ANYONE" not in said and "joined" not in said and "left" not in said, said
    assert "tensorwire-zmq" in done.stdout  # the run itself went on as before
    loud = tensorwire("--debug", *args, "--no-checksum-off", "--out", str(tmp_path / "debug"))
    assert loud.returncode == 0, loud.stderr
    said = " ".join(loud.stderr.split())
    assert said.count("accepts ANYONE") == 2 and "'echo' joined" in said, said


def test_the_hub_chatter_filter_keeps_every_other_warning():
    from tensorwire.cli.logs import LoopbackHubChatter
    from tensorwire.transports.base import OPEN_DOOR

    def record(name: str, level: int, **extra: object) -> logging.LogRecord:
        rec = logging.LogRecord(name, level, __file__, 1, "said", None, None)
        rec.__dict__.update(extra)
        return rec

    keep = LoopbackHubChatter().filter
    assert not keep(record("tensorwire.transports", logging.INFO))  # a join or a leave
    assert not keep(record("tensorwire.transports", logging.WARNING, **{OPEN_DOOR: True}))
    assert keep(record("tensorwire.transports.tcp", logging.WARNING))  # e.g. a peer's junk
    assert keep(record("tensorwire.transports", logging.ERROR))
    assert keep(record("tensorwire.fl.server", logging.INFO))


def test_bench_transfer_says_it_once_though_its_memory_case_serves_a_hub_of_its_own(tmp_path):
    done = tensorwire(
        *("bench", "transfer", "--transports", "tcp", "--dtypes", "float32", "--shapes", "8x8"),
        *("--repeat", "1", "--big-mib", "0", "--rss-gib", "0.01", "--out", str(tmp_path)),
    )
    assert done.returncode == 0, done.stderr
    said = " ".join(done.stderr.split())
    assert said.count("its hubs listen on 127.0.0.1") == 1 and "ANYONE" not in said, said
    assert "peak RSS grew" in " ".join(done.stdout.split())  # the memory case did run
