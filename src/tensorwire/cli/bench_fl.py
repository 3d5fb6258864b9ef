"""``tensorwire bench fl``: the FedComm benchmark's matrix from the options, what it will
take, and its table."""

from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from tensorwire.cli.console import console, err_console

if TYPE_CHECKING:
    from tensorwire.bench.fl_matrix import Matrix
from tensorwire.cli.fl_estimate import (
    CONFIRM_ABOVE_S,
    duration_words,
    estimate_seconds,
    load_factor,
)
from tensorwire.cli.options import (
    parse_floats,
    protocols_help,
    results_dir,
    split_list,
    split_profiles,
)


def bench_fl_cmd(
    quick: Annotated[
        bool,
        typer.Option(
            help="digits, VGG-5, 4 devices, 3 rounds, every protocol, 4g (other options "
            "given still apply)."
        ),
    ] = False,
    protocols: Annotated[
        str | None,
        typer.Option(help=protocols_help()),
    ] = None,
    models: Annotated[
        str | None,
        typer.Option(help="Comma-separated: vgg5, vgg8, resnet18. Default: vgg5,vgg8."),
    ] = None,
    payload: Annotated[
        str | None,
        typer.Option(
            help="Comma-separated sizes of synthetic updates, e.g. 1MB,10MB,100MB: "
            "communication without training (a payload:<size> model each), instead of "
            "--models unless that is given too."
        ),
    ] = None,
    profiles: Annotated[
        str | None,
        typer.Option(
            help="Comma-separated link profiles: 3g, 4g, wifi, lan, none, or custom: a rate "
            "or profile and its key=value settings, e.g. 3g,20mbit,delay=30ms,loss=1% "
            "(two profiles). Default: 3g,4g,wifi."
        ),
    ] = None,
    loss: Annotated[
        str | None,
        typer.Option(help="Comma-separated packet loss fractions, e.g. 0,0.05,0.1. Default: 0."),
    ] = None,
    stress: Annotated[
        str | None,
        typer.Option(help="Comma-separated stress kinds: none, cpu, network. Default: none."),
    ] = None,
    uplink: Annotated[
        str | None,
        typer.Option(
            help="Comma-separated uplink compressors: none, fp16, bf16, int8, qsgd, topk, "
            "randomk, dgc, signsgd. Default: none."
        ),
    ] = None,
    downlink: Annotated[
        str | None,
        typer.Option(
            help="Comma-separated downlink modes: none, fp16, delta (XOR with the previous "
            "global model, zstd; lossless, and small after a sparse uplink). Default: none."
        ),
    ] = None,
    codec: Annotated[
        str | None,
        typer.Option(
            help="Comma-separated lossless codecs of the model and the updates (where --uplink "
            "/ --downlink are not lossy): auto (each tensor raw or compressed, whichever the "
            "measured link carries faster; the FL default), none, or codec ids such as lz4, "
            "zstd, blosc2. Default: auto."
        ),
    ] = None,
    security: Annotated[
        str | None,
        typer.Option(
            help="Comma-separated: none, tls (enrolled devices with per-device keys, "
            "encrypted traffic: tensorwire certs per experiment). Default: none."
        ),
    ] = None,
    topology: Annotated[
        str | None,
        typer.Option(
            help="Comma-separated: star (a shaped link per device), shared (one shaped access "
            "link in front of the server), shared-broker-near (the same, the broker on the "
            "devices' side of it). Default: star."
        ),
    ] = None,
    links: Annotated[
        list[str] | None,
        typer.Option(
            help="Per-device link profiles, one per device, e.g. 3g,4g,4g,wifi (a semicolon "
            "between custom profiles with commas); give it again for another set, 'uniform' "
            "for none. On a star they replace --profiles. Default: uniform."
        ),
    ] = None,
    faults: Annotated[
        str | None,
        typer.Option(
            help="Comma-separated fault scenarios, each none or events joined by +: "
            "kill[N]@R[-BACK] (SIGKILL N devices in round R, restarted in round BACK), "
            "hang[N]@R[-BACK] (SIGSTOP), flap[N]@R[:Ts] (links down T s), broker@R[:Ts] "
            "(restart the broker), e.g. none,kill@2-4+hang@3,broker@2. Default: none."
        ),
    ] = None,
    deadline: Annotated[
        float | None,
        typer.Option(
            min=1.0,
            help="Every round's deadline, s. Default: 600 without faults; with faults, three "
            "times a round's transfers at the slowest link plus 30 s.",
        ),
    ] = None,
    quorum: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="Updates a round needs to change the model (the run stops when fewer devices "
            "remain). Default: half the devices with faults, 1 without.",
        ),
    ] = None,
    ratio: Annotated[
        float | None, typer.Option(help="Fraction topk / randomk / dgc keep. Default: 0.01.")
    ] = None,
    rounds: Annotated[int | None, typer.Option(min=1, help="Rounds. Default: 5.")] = None,
    epochs: Annotated[
        int | None, typer.Option(min=1, help="Local epochs per round. Default: 1.")
    ] = None,
    clients: Annotated[int | None, typer.Option(min=1, help="Devices. Default: 4.")] = None,
    dataset: Annotated[
        str | None, typer.Option(help="digits, cifar10, synthetic. Default: digits.")
    ] = None,
    reps: Annotated[int | None, typer.Option(min=1, help="Repetitions. Default: 1.")] = None,
    network_mbit: Annotated[
        float | None,
        typer.Option(help="Load the network stressor offers per device, Mbit/s. Default: 250."),
    ] = None,
    out: Annotated[
        Path | None, typer.Option(help="Run directory (done experiments skipped).")
    ] = None,
    resume: Annotated[
        Path | None,
        typer.Option(help="Go on with the run in this directory, with the matrix it recorded."),
    ] = None,
    yes: Annotated[
        bool,
        typer.Option(
            "--yes",
            "-y",
            help="Start a long run without asking (a run over "
            f"{CONFIRM_ABOVE_S // 60} minutes asks first on a terminal, and without one "
            "needs --yes).",
        ),
    ] = False,
) -> None:
    """FedAvg over every protocol on the emulated testbed (FedComm): table, figures, report.

    Needs root (network namespaces shape each device's link); without, it runs unshaped on
    loopback and labels every output so. Prints the matrix's size and estimated time first.
    """
    import json

    from tensorwire.bench.fl import run_matrix
    from tensorwire.bench.fl_matrix import (
        Matrix,
        parse_links,
        protocol_name,
        registered_protocols,
    )

    if resume is not None:
        try:
            recorded = json.loads((resume / "manifest.json").read_text())["matrix"]
        except (OSError, KeyError, ValueError) as exc:
            raise typer.BadParameter(f"{resume} holds no bench fl run to resume: {exc}") from None
        matrix, out = Matrix.from_config(recorded), resume
    else:
        given = {
            "protocols": None
            if protocols in (None, "all")
            else tuple(protocol_name(p) for p in split_list(protocols)),
            "models": _models_and_payloads(models, payload),
            "profiles": split_profiles(profiles) if profiles else None,
            "losses": parse_floats(loss) if loss else None,
            "stresses": tuple(split_list(stress)) if stress else None,
            "uplinks": tuple(split_list(uplink)) if uplink else None,
            "downlinks": tuple(split_list(downlink)) if downlink else None,
            "codecs": tuple(split_list(codec)) if codec else None,
            "securities": tuple(split_list(security)) if security else None,
            "topologies": tuple(split_list(topology)) if topology else None,
            "links": tuple(parse_links(each) for each in links) if links else None,
            "faults": tuple(split_list(faults)) if faults else None,
            "deadline": deadline,
            "quorum": quorum,
            "ratio": ratio,
            "rounds": rounds,
            "epochs": epochs,
            "clients": clients,
            "dataset": dataset,
            "reps": reps,
            "network_mbit": network_mbit,
        }
        full = {
            "protocols": tuple(registered_protocols()),
            "models": ("vgg5", "vgg8"),
            "profiles": ("3g", "4g", "wifi"),
            "rounds": 5,
        }
        base = Matrix.quick().to_config() if quick else {**Matrix.quick().to_config(), **full}
        _check_fl_choices(given)
        try:
            matrix = Matrix.from_config(
                {**base, **{k: v for k, v in given.items() if v is not None}}
            )
        except ValueError as exc:
            raise typer.BadParameter(str(exc)) from None
        out = results_dir(out, "bench-fl")
    _announce(matrix, ask=not quick and resume is None and not yes)
    started = time.monotonic()
    try:
        summary = run_matrix(matrix, out, say=console.print)
    except KeyboardInterrupt:
        console.print("[yellow]interrupted[/] (Ctrl-C); experiments finished so far are kept")
        console.print(f"results so far: {out}")
        console.print(f"go on with: tensorwire bench fl --resume {out}")
        raise typer.Exit(130) from None
    _print_fl_table(out)
    for key, why in summary.failed.items():
        console.print(f"[red]failed[/] {key}: {why.splitlines()[0]}")
    console.print(
        f"{len(summary.ran)} experiment(s) run, {len(summary.resumed)} done before, "
        f"{len(summary.skipped)} skipped, {len(summary.failed)} failed; "
        f"{summary.label}; wall time {time.monotonic() - started:.0f} s"
    )
    console.print(f"report: {summary.report}")


def _models_and_payloads(models: str | None, payload: str | None) -> tuple[str, ...] | None:
    """``--models`` and ``--payload`` as one models axis: each payload size as a
    ``payload:<size>`` model (``10MB`` -> ``payload:10MB``)."""
    named = split_list(models) if models else []
    sizes = [f"payload:{size}" for size in split_list(payload)] if payload else []
    return tuple(named + sizes) or None


def _check_fl_choices(given: dict) -> None:
    """Models and datasets the FL runtime has, checked before anything starts."""
    from tensorwire.fl.config import BUILTIN_MODELS, is_builtin_model
    from tensorwire.fl.data import DATASETS

    for model in given["models"] or ():
        try:
            known = is_builtin_model(model.lower() if ":" not in model else model)
        except ValueError as exc:
            raise typer.BadParameter(str(exc), param_hint="--payload") from None
        if not known:
            hint = "--payload" if model.startswith("payload:") else "--models"
            raise typer.BadParameter(
                f"no model {model!r}; choose among {', '.join(BUILTIN_MODELS)}, or give "
                "--payload sizes such as 1MB,10MB",
                param_hint=hint,
            )
    if given["dataset"] is not None and given["dataset"] not in DATASETS:
        raise typer.BadParameter(
            f"no dataset {given['dataset']!r}; choose among {', '.join(DATASETS)}",
            param_hint="--dataset",
        )


def _announce(matrix: Matrix, ask: bool) -> None:
    """Say what a bench fl run holds, what it needs and about how long it takes; for a long
    one, ask (on a terminal) or stop unless --yes was given."""
    from tensorwire.bench.fl import protocol_problem
    from tensorwire.testbed import probe_capabilities

    experiments = matrix.experiments()
    problems = {p: protocol_problem(p) for p in matrix.protocols}
    runnable = [e for e in experiments if problems[e.protocol] is None]
    left_out = sorted(p for p, why in problems.items() if why)
    kept = tuple(p for p in matrix.protocols if problems[p] is None)
    seconds = estimate_seconds(dataclasses.replace(matrix, protocols=kept)) if kept else 0.0
    busy = load_factor()
    seconds *= busy
    how = "a rough estimate" + (
        f", {busy:.1f}x for the other jobs sharing the CPUs" if busy > 1.05 else ""
    )
    caps = probe_capabilities()
    if caps.mode is None:
        why = "; ".join(caps[n].reason for n in ("root", "userns", "netns") if n in caps.items)
        where = (
            f"it needs root for network namespaces, and has none here ({why}): "
            "an unshaped loopback run"
        )
    else:
        where = f"network namespaces ({caps.mode}) shape each device's link"
    skipped = len(experiments) - len(runnable)
    console.print(
        f"bench fl: {len(experiments)} experiment(s), {matrix.rounds} round(s) each"
        + (f", {skipped} left out ({', '.join(left_out)})" if left_out else "")
        + f"; about {duration_words(seconds)} here ({how}); {where}."
    )
    if not ask or seconds <= CONFIRM_ABOVE_S:
        return
    if sys.stdin.isatty():
        typer.confirm("Start it?", abort=True)
        return
    err_console.print(
        f"error: this run would take about {duration_words(seconds)}: add --yes to start it, "
        "or narrow it (--protocols, --models, --profiles, --rounds; --quick is the short one)"
    )
    raise typer.Exit(1)


TABLE_NOTE = (
    "comm s/round: each device's downlink and uplink transfer times (from the first byte "
    "encoded to the last tensor decoded) added up over the devices, not how long a round "
    "took (their transfers overlap). bound s/round: the least those transfers can take, each "
    "message's bytes over its link's shaped rate, added up the same way; comm/bound: how far "
    "above it (1.0 is the link's full rate). Means over rounds and repetitions. TCP "
    "retrans n/a: the protocol's data is not TCP's (udp and quic resend by themselves)."
)


def _print_fl_table(run_dir: Path) -> None:
    """The comparison table of a bench fl run, one row per setting."""
    import json

    import pandas as pd

    from tensorwire.bench.fl_results import DIMENSIONS, TABLE
    from tensorwire.bench.report import key_numbers, varying
    from tensorwire.bench.tables import print_table

    frame = pd.read_parquet(run_dir / TABLE) if (run_dir / TABLE).is_file() else pd.DataFrame()
    if frame.empty:
        console.print("no experiment completed")
        return
    by = varying(frame, DIMENSIONS)
    table = key_numbers(frame, by)
    names = {
        "comm_s": "comm s/round (sum over devices)",
        "lower_bound_s": "bound s/round (sum over devices)",
        "ratio": "comm/bound",
        "payload_MB": "MB/round",
        "wire_MB": "link MB/round",
        "retrans_segs": "TCP retrans/round",
        "final_accuracy_pct": "final acc %",
    }
    rows = [
        {str(k): v for k, v in r.items()} for r in table.rename(columns=names).to_dict("records")
    ]
    labels = list(dict.fromkeys(frame["label"]))
    if len(labels) > 1:  # one per profile: the run's own label says it shorter
        labels = [json.loads((run_dir / "manifest.json").read_text()).get("label", "")]
    print_table(rows, f"FedAvg communication ({labels[0]})", [*by, *names.values()], console)
    console.print(TABLE_NOTE)
