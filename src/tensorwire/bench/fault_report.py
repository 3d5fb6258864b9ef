"""The report's section on faults (``bench fl --faults``): for each run with a fault scenario,
the rounds that changed the model, those that ended at their deadline or short of the
quorum, the run's time and final accuracy, each against the same experiment without faults.
"""

from __future__ import annotations

import html
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from tensorwire.bench.fl_results import done_experiments

# Settings that make two experiments the same one but for their faults.
_SAME = (
    "protocol",
    "model",
    "profile",
    "loss",
    "stress",
    "uplink",
    "ratio",
    "downlink",
    "rounds",
    "clients",
    "dataset",
    "rep",
    "epochs",
    "security",
    "topology",
    "links",
    "deadline",
    "quorum",
)


def _runs(run_dirs: Sequence[Path]) -> list[dict[str, Any]]:
    """One row per done experiment: its settings, its faults and what its rounds did."""
    rows = []
    for run_dir in run_dirs:
        for exp_dir in done_experiments(Path(run_dir)):
            doc = json.loads((exp_dir / "manifest.json").read_text())
            exp = doc.get("experiment", {})
            rounds = pd.read_parquet(exp_dir / "rounds.parquet")
            faults = doc.get("faults") or {}
            same = {k: json.dumps(exp.get(k), sort_keys=True) for k in _SAME}
            status = rounds["status"] if "status" in rounds else pd.Series(dtype=str)
            ended = rounds["ended"] if "ended" in rounds else pd.Series(dtype=str)
            rows.append(
                {
                    "same": tuple(sorted(same.items())),
                    "protocol": exp.get("protocol", "?"),
                    "profile": exp.get("profile", "?"),
                    "faults": exp.get("faults", "none"),
                    "events": "; ".join(faults.get("events") or []),
                    "rounds_total": int(exp.get("rounds", len(rounds))),
                    "rounds_run": len(rounds),
                    "aggregated": int((status == "aggregated").sum()),
                    "no_quorum": int((status == "no-quorum").sum()),
                    "at_deadline": int((ended == "deadline").sum()),
                    "stopped": faults.get("stopped") or "",
                    "time_s": float(rounds["round_s"].sum()) if "round_s" in rounds else None,
                    "accuracy": float(rounds["accuracy"].iloc[-1]) if len(rounds) else None,
                    "deadline_s": faults.get("deadline_s"),
                    "quorum": faults.get("quorum"),
                }
            )
    return rows


def fault_table(run_dirs: Sequence[Path]) -> pd.DataFrame:
    """Every experiment with faults beside its fault-free twin (same settings, scenario
    ``none``): rounds run / that changed the model / ended at the deadline / short of the
    quorum, time (sum of round times), final accuracy, and both against the twin (``x time``:
    the faulty run's time over the twin's; ``d acc``: accuracy points, faulty minus twin)."""
    rows = _runs(run_dirs)
    twins = {r["same"]: r for r in rows if r["faults"] == "none"}
    out = []
    for row in rows:
        if row["faults"] == "none":
            continue
        twin = twins.get(row["same"])
        out.append(
            {
                **{k: v for k, v in row.items() if k != "same"},
                "time_free_s": twin["time_s"] if twin else None,
                "accuracy_free": twin["accuracy"] if twin else None,
                "x_time": row["time_s"] / twin["time_s"] if twin and twin["time_s"] else None,
                "d_accuracy_pts": 100 * (row["accuracy"] - twin["accuracy"])
                if twin and row["accuracy"] is not None and twin["accuracy"] is not None
                else None,
            }
        )
    return pd.DataFrame(out)


def verdicts(table: pd.DataFrame) -> list[str]:
    """A sentence per faulty experiment: did every round run, what it cost, how accurate."""
    said = []
    for row in table.to_dict("records"):
        head = f"{row['protocol']} at {row['profile']}, {row['events'] or row['faults']}: "
        if row["stopped"]:
            head += f"the run stopped after round {row['rounds_run']} ({row['stopped']}); "
        else:
            head += f"all {row['rounds_total']} rounds ran"
            head += (
                f" ({row['aggregated']} changed the model, {row['no_quorum']} short of the "
                f"quorum of {row['quorum']}, {row['at_deadline']} ended at the "
                f"{row['deadline_s']:g} s deadline); "
            )
        if row.get("time_free_s") is None:
            said.append(head + "no fault-free run of the same settings to compare with.")
            continue
        said.append(
            head
            + f"{row['time_s']:.1f} s vs {row['time_free_s']:.1f} s without faults "
            + f"({row['x_time']:.2f}x), final accuracy {row['accuracy']:.3f} vs "
            + f"{row['accuracy_free']:.3f} ({row['d_accuracy_pts']:+.1f} points)."
        )
    return said


def section_html(run_dirs: Sequence[Path]) -> str:
    """The report's faults section (empty when no run has a fault scenario)."""
    table = fault_table(run_dirs)
    if table.empty:
        return ""
    columns = {
        "protocol": "protocol",
        "profile": "profile",
        "faults": "faults",
        "rounds_run": "rounds run",
        "aggregated": "changed model",
        "no_quorum": "short of quorum",
        "at_deadline": "at deadline",
        "time_s": "time s",
        "time_free_s": "fault-free s",
        "x_time": "x time",
        "accuracy": "accuracy",
        "accuracy_free": "fault-free accuracy",
        "d_accuracy_pts": "d accuracy (points)",
    }
    shown = table[[c for c in columns if c in table]].rename(columns=columns)
    parts = [
        "<section id='faults'><h2>Faults</h2>",
        "<p>Each run with faults beside the same run without (same settings and seeds). "
        "<em>time</em> is the sum of the rounds' times; <em>at deadline</em> counts rounds "
        "that ended when their deadline passed rather than when every sampled device had "
        "answered; <em>short of quorum</em> rounds kept the global model.</p>",
        "<ul>" + "".join(f"<li>{html.escape(s)}</li>" for s in verdicts(table)) + "</ul>",
        shown.to_html(index=False, float_format=lambda v: f"{v:.3f}", na_rep="–"),
        "</section>",
    ]
    return "\n".join(parts)
