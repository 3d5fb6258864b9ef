"""A whole matrix: each experiment not done yet, on a testbed of its topology, then the
run's table, figures and report."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from rich.markup import escape

from tensorwire.bench.fl.experiment import DONE, FAILED, run_experiment
from tensorwire.bench.fl.feasibility import choose_testbed, skip_reasons
from tensorwire.bench.fl_matrix import Matrix
from tensorwire.errors import TensorwireError
from tensorwire.testbed import (
    probe_capabilities,
)
from tensorwire.testbed.base import BaseTestbed


@dataclasses.dataclass
class RunSummary:
    """What :func:`run_matrix` did: experiments run now (``ran``), found done from before
    (``resumed``), skipped with a reason, failed with a reason; the report's path."""

    out_dir: Path
    label: str
    ran: list[str] = dataclasses.field(default_factory=list)
    resumed: list[str] = dataclasses.field(default_factory=list)
    skipped: dict[str, str] = dataclasses.field(default_factory=dict)
    failed: dict[str, str] = dataclasses.field(default_factory=dict)
    report: Path | None = None
    seconds: float = 0.0


def run_label(testbed: BaseTestbed) -> str:
    """What a whole run is labelled with: shaped namespaces, or "unshaped loopback"."""
    return "shaped links in network namespaces" if testbed.shaped else testbed.label


def _by_reason(skipped: dict[str, str]) -> dict[str, list[str]]:
    reasons: dict[str, list[str]] = {}
    for key, why in skipped.items():
        reasons.setdefault(why, []).append(key.split("_", 1)[0])
    return {why: list(dict.fromkeys(keys)) for why, keys in reasons.items()}


def _run_manifest(
    matrix: Matrix, testbed: BaseTestbed, summary: RunSummary, started: float
) -> dict[str, Any]:
    from tensorwire.fl.results import manifest

    caps = probe_capabilities()
    return manifest(
        {
            "kind": "bench-fl",
            "matrix": matrix.to_config(),
            "label": run_label(testbed),
            "shaped": testbed.shaped,
            "testbed": {
                "kind": type(testbed).__name__,
                "mode": getattr(testbed, "mode", "loopback"),
                "devices": testbed.devices,
                "server_address": testbed.server_address,
            },
            "capabilities": caps.to_config(),
            "experiments": [e.key for e in matrix.experiments()],
            "skipped": summary.skipped,
            "failed": summary.failed,
            "seconds": time.time() - started,
        }
    )


def run_matrix(
    matrix: Matrix,
    out_dir: Path,
    *,
    say: Callable[[str], None] = print,
    show_progress: bool = True,
) -> RunSummary:
    """Run every experiment of ``matrix`` not done yet in ``out_dir``, then combine the
    results, draw the figures and write the report. Ctrl-C stops after cleaning up; run
    again with the same ``out_dir`` to go on where it stopped."""
    from tensorwire.bench.fl_results import EXPERIMENTS_DIR
    from tensorwire.bench.report import build_report

    started = time.time()
    out_dir.mkdir(parents=True, exist_ok=True)
    with _testbeds(matrix.clients, say) as testbed_for:
        testbed = testbed_for(matrix.topologies[0])
        summary = RunSummary(out_dir=out_dir, label=run_label(testbed))
        summary.skipped = skip_reasons(matrix, testbed)
        for why, keys in _by_reason(summary.skipped).items():
            say(f"[yellow]skip[/] {len(keys)} experiment(s) ({', '.join(keys)}): {escape(why)}")
        manifest_path = out_dir / "manifest.json"
        manifest_path.write_text(
            json.dumps(_run_manifest(matrix, testbed, summary, started), indent=2, default=str)
        )
        todo = [e for e in matrix.experiments() if e.key not in summary.skipped]
        with _progress(show_progress) as bar:
            task = bar.add_task("experiments", total=len(todo))
            for exp in todo:
                exp_dir = out_dir / EXPERIMENTS_DIR / exp.key
                if (exp_dir / DONE).is_file():
                    summary.resumed.append(exp.key)
                    bar.advance(task)
                    continue
                what = f"{exp.protocol} {exp.model} {exp.profile}"
                what += f" loss {exp.loss:g}" if exp.loss else ""
                what += f" {exp.stress} stress" if exp.stress != "none" else ""
                what += f" up {exp.codec_label}" if exp.codec_label != "none" else ""
                bar.update(task, description=f"{what}: starting")

                def show(r: int, what: str = what, total: int = exp.rounds) -> None:
                    bar.update(task, description=f"{what}: round {r}/{total}")

                try:
                    testbed = testbed_for(exp.topology)
                    run_experiment(
                        testbed, exp, exp_dir, network_mbit=matrix.network_mbit, on_round=show
                    )
                except (TensorwireError, OSError) as exc:
                    summary.failed[exp.key] = str(exc)
                    (exp_dir / FAILED).write_text(str(exc) + "\n")
                    say(f"[red]failed[/] {exp.key}: {str(exc)[:2000]}")
                else:
                    summary.ran.append(exp.key)
                    _experiment_report(exp_dir, say)
                bar.advance(task)
        summary.seconds = time.time() - started
        manifest_path.write_text(
            json.dumps(_run_manifest(matrix, testbed, summary, started), indent=2, default=str)
        )
    summary.report = build_report([out_dir])
    summary.seconds = time.time() - started
    return summary


@contextlib.contextmanager
def _testbeds(devices: int, say: Callable[[str], None]) -> Iterator[Callable[[str], BaseTestbed]]:
    """A function of a topology giving an open testbed of it: the one open now if it has
    that topology, else (the open one closed first) a new one; all closed at the end."""
    current: list[BaseTestbed] = []

    def testbed_for(topology: str) -> BaseTestbed:
        if current and getattr(current[0], "topology", "star") in (topology, None):
            return current[0]
        if current and not current[0].shaped:
            return current[0]  # loopback has no topology: those experiments are skipped
        if current:
            current.pop().close()
        current.append(choose_testbed(devices, say, topology).open())
        return current[0]

    try:
        yield testbed_for
    finally:
        if current:
            current.pop().close()


def _experiment_report(exp_dir: Path, say: Callable[[str], None]) -> None:
    """The experiment's own figures and ``report.html`` in its directory. Its results are
    already written, so a report that cannot be drawn is said, and the matrix goes on."""
    from tensorwire.bench.report import build_report

    try:
        build_report([exp_dir])
    except Exception as exc:  # drawing is not worth the rest of the matrix
        say(f"[yellow]no report[/] for {exp_dir.name}: {type(exc).__name__}: {exc}")


@contextlib.contextmanager
def _progress(show: bool) -> Iterator[Any]:
    from tensorwire.bench.progress import progress_bar

    bar = progress_bar()
    if not show:
        bar.disable = True
    with bar:
        yield bar
