"""Ctrl-C, a wrong host and a narrow terminal, as a newcomer meets them: an interrupted
``fl run`` says after which round it stopped, where its results are and how to go on (and
going on finishes it); a device given a host name that does not resolve fails at once; help
at 80 columns shows every option whole."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import typer

from ctrl_c import heed_sigint
from tensorwire.cli.interrupts import interrupted_run
from tensorwire.fl.checkpoint import CHECKPOINTS, STATE, Checkpoint, save_checkpoint
from tensorwire.fl.results import MANIFEST


def command(*args: str) -> list[str]:
    return [sys.executable, "-m", "tensorwire", *args]


def env(columns: int = 200) -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "TENSORWIRE_DEBUG"} | {
        "COLUMNS": str(columns)
    }


def run(*args: str, timeout: float = 300, columns: int = 200) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        command(*args),
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
        check=False,
        env=env(columns),
    )


def wait_for_checkpoint(out: Path, proc: subprocess.Popen[str], timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not list((out / CHECKPOINTS).glob(f"round-*/{STATE}")):
        assert proc.poll() is None, "fl run ended before its first round"
        assert time.monotonic() < deadline, "no round finished in time"
        time.sleep(0.1)


@pytest.mark.slow
def test_ctrl_c_in_fl_run_says_where_the_results_are_and_resume_finishes_the_run(tmp_path):
    out = tmp_path / "run"
    # rounds enough that Ctrl-C, sent once the first checkpoint is seen, lands mid-run on a
    # loaded machine too (a round takes ~0.6 s; with 3 the run once ended first)
    rounds = 20
    args = ["fl", "run", "--dataset", "synthetic", "--clients", "2", "--rounds", str(rounds)]
    proc = subprocess.Popen(
        command(*args, "--out", str(out)),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        env=env(),
        start_new_session=True,  # Ctrl-C reaches the whole process group, devices included
        preexec_fn=heed_sigint,  # SIGINT as a terminal's Ctrl-C finds it
    )
    try:
        wait_for_checkpoint(out, proc)
        os.killpg(proc.pid, signal.SIGINT)
        said, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130, said
    assert "interrupted after round" in said and f"of {rounds} (Ctrl-C)" in said, said
    assert f"results so far: {out}" in said, said
    assert f"go on with: tensorwire fl run --resume {out}" in said, said
    assert "Traceback" not in said
    outcome = json.loads((out / MANIFEST).read_text())["outcome"]
    assert outcome.startswith("interrupted after round"), outcome

    again = run("fl", "run", "--resume", str(out))
    assert again.returncode == 0, again.stdout + again.stderr
    manifest = json.loads((out / MANIFEST).read_text())
    assert manifest["outcome"] == "done"
    assert manifest["resumed"], manifest  # the resumption is noted, the first manifest kept
    states = sorted((out / CHECKPOINTS).glob(f"round-*/{STATE}"))
    assert json.loads(states[-1].read_text())["round"] == rounds


def test_ctrl_c_between_a_checkpoint_and_its_callback_still_offers_the_resume(tmp_path, capsys):
    # the server writes round 1's checkpoint, then calls back; Ctrl-C in between once said
    # "no round finished" although --resume had a round to go on from (CI, stop 39)
    save_checkpoint(tmp_path, Checkpoint(round=1, config={}, model={"w": np.zeros(2)}))
    with pytest.raises(typer.Exit) as stopped, interrupted_run("fl run", tmp_path, [0], 20):
        raise KeyboardInterrupt
    said = capsys.readouterr().out
    assert stopped.value.exit_code == 130
    assert "after round 1 of 20" in said, said
    assert "nothing to resume" not in said, said
    assert f"go on with: tensorwire fl run --resume {tmp_path}" in " ".join(said.split()), said


def test_resume_from_a_directory_with_no_checkpoint_is_a_usage_error(tmp_path):
    done = run("fl", "run", "--resume", str(tmp_path), timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "holds no checkpoint" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_device_given_a_host_that_does_not_resolve_fails_at_once():
    done = run("fl", "client", "--url", "tcp://no-such-host.invalid:5555", "--id", "1")
    assert done.returncode == 1, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "UnknownHost" in errors[0], done.stderr
    assert "check the URL" in errors[0]
    assert "retrying" not in done.stderr  # failed at once, not after the default 120 s


def test_help_at_80_columns_shows_every_option_whole_and_flags_without_a_placeholder():
    for args in (["fl", "run"], ["fl", "server"], ["bench", "fl"], ["bench", "transfer"]):
        shown = run(*args, "--help", columns=80, timeout=120)
        assert shown.returncode == 0, shown.stderr
        text = shown.stdout
        assert "…" not in text, text  # nothing cut short
        assert "<bool>" not in text, text
        assert max(len(line) for line in text.splitlines()) <= 80, text
    assert "--error-feedback / --no-error-feedback" in run("fl", "run", "--help", columns=80).stdout
