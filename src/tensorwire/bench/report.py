"""``report.html`` for ``bench fl`` runs: one run's, or a comparison of several.

The page is self-contained (figures embedded as base64 PNG; the SVGs sit beside it in
``figures/``) and says on top how the links were made: shaped in network namespaces with
each profile's rate and loss, or "unshaped loopback".
"""

from __future__ import annotations

import base64
import html
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from tensorwire.bench.fl_figures import FigureFile, draw_figures
from tensorwire.bench.fl_matrix import MIXED
from tensorwire.bench.fl_results import (
    DIMENSIONS,
    TABLE,
    collect,
    collect_devices,
    device_frame,
    experiment_frame,
    summarize,
)
from tensorwire.testbed.profile import as_profile

REPORT = "report.html"
SUMMARY = "summary.html"  # the ranking, the verdicts and the figure of comm / bound alone
FIGURES_DIR = "figures"
# Columns of the key-numbers table, with headers, after the settings that vary.
KEY_NUMBERS = {
    "reps": "reps",
    "comm_s": "comm time / round (s)",
    "lower_bound_s": "lower bound / round (s)",
    "ratio": "comm / bound",
    "payload_MB": "message MB / round",
    "wire_MB": "link MB / round",
    "retrans_segs": "TCP retrans / round",
    "final_accuracy_pct": "final accuracy (%)",
    "encode_s": "encode (s)",
    "wait_s": "wait (s)",
    "wire_s": "wire (s)",
    "decode_s": "decode (s)",
}
_CSS = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1200px; color: #222; }
table { border-collapse: collapse; margin: 1em 0; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: right; }
th { background: #f2f2f2; } td.text { text-align: left; }
.label { padding: 0.6em 1em; border-radius: 4px; background: #e8f1fb; margin: 1em 0; }
.label.unshaped { background: #fdecea; font-weight: bold; }
figure { margin: 2em 0; } figure img { max-width: 100%; }
figcaption { color: #555; font-size: 0.9em; }
code { background: #f4f4f4; padding: 0 0.2em; }
"""


def load_run(run_dir: Path) -> tuple[dict[str, Any], pd.DataFrame]:
    """A run's manifest and its per-round table (rebuilt from the experiment directories,
    or read from ``experiments.parquet`` when they are gone); or one experiment's, when
    ``run_dir`` is an experiment directory."""
    manifest_path = run_dir / "manifest.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.is_file() else {}
    if "experiment" in manifest and (run_dir / "rounds.parquet").is_file():
        frame = experiment_frame(run_dir)
    elif (run_dir / "experiments").is_dir():
        frame = collect(run_dir)
    elif (run_dir / TABLE).is_file():
        frame = pd.read_parquet(run_dir / TABLE)
    else:
        raise FileNotFoundError(
            f"{run_dir} holds no bench fl results (no experiments/ nor {TABLE})"
        )
    return manifest, frame


def key_numbers(frame: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    """The table of key numbers per setting, in display units (MB, %)."""
    table = summarize(frame, by)
    if table.empty:
        return table
    table["payload_MB"] = table.pop("payload_bytes") / 1e6
    table["wire_MB"] = table.pop("wire_bytes") / 1e6
    table["final_accuracy_pct"] = table.pop("final_accuracy") * 100
    return table


def varying(frame: pd.DataFrame, dims: list[str]) -> list[str]:
    """The ones of ``dims`` that take more than one value in ``frame`` (protocol always)."""
    return [d for d in dims if d in frame and (d == "protocol" or frame[d].nunique() > 1)]


def shown_settings(doc: dict[str, Any]) -> dict[str, Any]:
    """A run's matrix (or an experiment's settings) as the report lists them: the network
    stressor's load only where a run has network stress (elsewhere nothing offered it)."""
    config = dict(doc.get("matrix") or doc.get("experiment") or {})
    stresses = config.get("stresses", [config.get("stress", "none")])
    if "network" not in stresses:
        config.pop("network_mbit", None)
    return config


def _label_html(manifests: dict[str, dict[str, Any]], frame: pd.DataFrame) -> str:
    parts = []
    for run, doc in manifests.items():
        mine = frame[frame["run"] == run] if "run" in frame else frame
        prefix = f"<b>{html.escape(run)}</b>: " if len(manifests) > 1 else ""
        if not doc.get("shaped", True) or (not mine.empty and not mine["shaped"].all()):
            parts.append(
                f'<p class="label unshaped">{prefix}unshaped loopback: no network namespaces '
                "could be made, so every node ran on 127.0.0.1 and no link was shaped; the "
                "profiles named below were not applied.</p>"
            )
            continue
        profiles = []
        for profile in dict.fromkeys(mine["profile"]) if not mine.empty else []:
            losses = sorted(set(mine.loc[mine["profile"] == profile, "loss"]))
            loss = ", ".join(f"{x * 100:g}%" for x in losses)
            profiles.append(f"{html.escape(_describe(profile, mine))} (loss {loss})")
        caps = doc.get("capabilities", {})
        how = "loss by netem" if caps.get("netem", {}).get("available") else "loss by nftables"
        parts.append(
            f'<p class="label">{prefix}links shaped in network namespaces (rate by tbf, {how}),'
            f" both directions; profiles: {'; '.join(profiles) or 'none'}.</p>"
        )
    return "\n".join(parts)


def _describe(profile: str, frame: pd.DataFrame) -> str:
    """A profile in words; a star whose devices have links of their own (``mixed``) by its
    devices' links: ``each device its own link: 3g,4g,4g,wifi``."""
    if profile == MIXED:
        links = dict.fromkeys(frame.loc[frame["profile"] == profile, "links"].astype(str))
        return f"each device its own link: {'; '.join(links)}"
    return as_profile(profile).describe()


def _table_html(table: pd.DataFrame, headers: dict[str, str]) -> str:
    cols = [c for c in headers if c in table.columns]
    head = "".join(f"<th>{html.escape(headers[c])}</th>" for c in cols)
    body = []
    for row in table[cols].itertuples(index=False):
        cells = []
        for value in row:
            if isinstance(value, bool) or not isinstance(value, int | float):
                text, cls = str(value), ' class="text"'
            elif isinstance(value, float):
                text, cls = ("n/a" if pd.isna(value) else f"{value:.3g}"), ""
            else:
                text, cls = f"{value:,}", ""
            cells.append(f"<td{cls}>{html.escape(text)}</td>")
        body.append(f"<tr>{''.join(cells)}</tr>")
    return f"<table><tr>{head}</tr>{''.join(body)}</table>"


def _figure_html(fig: FigureFile, out_dir: Path) -> str:
    data = base64.b64encode(fig.png.read_bytes()).decode()
    svg = fig.svg.relative_to(out_dir)
    return (
        f'<figure id="fig-{fig.name}" data-figure="{fig.name}">'
        f"<h3>{html.escape(fig.title)}</h3>"
        f'<img alt="{fig.name}" src="data:image/png;base64,{data}">'
        f"<figcaption>{html.escape(fig.caption)} (<code>{fig.name}</code>, "
        f'<a href="{svg}">SVG</a>)</figcaption></figure>'
    )


def _runs_html(manifests: dict[str, dict[str, Any]]) -> str:
    rows = []
    for run, doc in manifests.items():
        versions = ", ".join(f"{k} {v}" for k, v in (doc.get("versions") or {}).items() if v)
        host = doc.get("host") or {}
        testbed = doc.get("testbed") or {}
        seconds = doc.get("seconds")
        rows.append(
            {
                "run": run,
                "created": doc.get("created", ""),
                "testbed": f"{testbed.get('kind', '?')} ({testbed.get('mode', '?')})"
                if testbed
                else doc.get("label", "?"),
                "host": f"{host.get('platform', '?')}, {host.get('cpus', '?')} CPUs",
                "git commit": (doc.get("git_commit") or "")[:12],
                "versions": versions,
                "seconds": float(seconds) if seconds is not None else float("nan"),
            }
        )
    table = pd.DataFrame(rows)
    return _table_html(table, {c: c for c in table.columns})


def _problems_html(manifests: dict[str, dict[str, Any]]) -> str:
    items = []
    for run, doc in manifests.items():
        prefix = f"{run}: " if len(manifests) > 1 else ""
        for kind in ("skipped", "failed"):
            for key, why in (doc.get(kind) or {}).items():
                items.append(
                    f"<li>{html.escape(prefix)}{kind} <code>{html.escape(key)}</code>: "
                    f"{html.escape(str(why)[:600])}</li>"
                )
    return f"<h2>Skipped and failed</h2><ul>{''.join(items)}</ul>" if items else ""


def render(
    manifests: dict[str, dict[str, Any]],
    frame: pd.DataFrame,
    figures: list[FigureFile],
    out: Path,
    run_dirs: Sequence[Path] = (),
) -> str:
    """The report page for ``manifests`` (run name -> manifest) and their table; the
    topology / fan-out / mixed-link section from ``run_dirs`` when they have one."""
    from tensorwire.bench.fault_report import section_html as faults_html
    from tensorwire.bench.fl_ranking import section_html as ranking_html
    from tensorwire.bench.topology_report import section_html

    dims = (["run"] if len(manifests) > 1 else []) + DIMENSIONS
    by = varying(frame, dims) if not frame.empty else []
    table = key_numbers(frame, by) if not frame.empty else pd.DataFrame()
    headers = {d: d for d in by} | KEY_NUMBERS | {"label": "label"}
    title = "tensorwire bench fl" + (" — comparison" if len(manifests) > 1 else "")
    single = next(iter(manifests.values())) if len(manifests) == 1 else {}
    if "experiment" in single:
        title += f" — experiment {single.get('key', '')}"
    settings = "".join(
        f"<p>{html.escape(run)}: <code>{html.escape(json.dumps(shown_settings(doc)))}</code></p>"
        for run, doc in manifests.items()
    )
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>{_CSS}</style></head><body>
<h1>{html.escape(title)}</h1>
<p>FedAvg over each protocol on the emulated testbed (FedComm's method). Communication time is
the sum over devices of each round's downlink and uplink transfer times (first byte encoded to
last tensor decoded); its lower bound is each transfer's message bytes over its link's rate,
summed the same way. Written {time.strftime("%Y-%m-%d %H:%M:%S")}.</p>
{_label_html(manifests, frame)}
{ranking_html(frame) if not frame.empty else ""}
<h2>Key numbers</h2>
<p>Means per round over rounds and repetitions; final accuracy after the last round.
Communication time per round is split four ways, each summed over transfers as it is, the same
on every protocol: <b>encode</b>, the senders' CPU time encoding; <b>wait</b>, from the end of
encoding to a message's first byte arriving (a fan-out's queue, a broker's store and forward,
the link's delay); <b>wire</b>, from the first byte arriving to the last, decoding left out
(the bytes crossing the link); <b>decode</b>, the receivers' CPU time decoding (header,
checksums, codecs; never the wait for bytes). TCP retransmissions are n/a for protocols whose
data is not TCP's (udp, quic resend by themselves).</p>
{_table_html(table, headers) if not table.empty else "<p>No experiment has completed.</p>"}
{section_html(run_dirs)}
{faults_html(run_dirs)}
<h2>Figures</h2>
{"".join(_figure_html(f, out) for f in figures) or "<p>No figures: no data.</p>"}
{_problems_html(manifests)}
<h2>Runs</h2>
{_runs_html(manifests)}
<h3>Settings</h3>
{settings}
</body></html>
"""


def _devices(run_dirs: list[Path], several: bool) -> pd.DataFrame:
    """The per-device rows of every run (of an experiment directory, its own), with the
    ``series`` the figures draw them as."""
    frames = []
    for name, run_dir in zip(_run_names(run_dirs), run_dirs, strict=True):
        if (run_dir / "experiments").is_dir():
            mine = collect_devices(run_dir)
        elif (run_dir / "transfers.parquet").is_file() and (run_dir / "done").is_file():
            mine = device_frame(run_dir)
        else:
            continue
        if not mine.empty:
            protocol = mine["protocol"].astype(str)
            frames.append(
                mine.assign(run=name, series=f"{name}: " + protocol if several else protocol)
            )
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def render_summary(
    manifests: dict[str, dict[str, Any]], frame: pd.DataFrame, figures: list[FigureFile], out: Path
) -> str:
    """``summary.html``: for people who compare, the protocols ranked per condition with
    confidence intervals, the verdicts, and the figures of communication over its bound and
    against the update's size."""
    from tensorwire.bench.fl_ranking import section_html as ranking_html

    shown = [f for f in figures if f.name in ("comm_over_bound", "comm_time_payload")]
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>tensorwire bench fl — summary</title>
<style>{_CSS}</style></head><body>
<h1>tensorwire bench fl — summary</h1>
<p>Which protocol is fastest where: communication time per round (the sum over devices of
each round's downlink and uplink transfer times), ranked per condition. The whole report,
with every figure and table, is <a href="{REPORT}">{REPORT}</a>.</p>
{_label_html(manifests, frame) if not frame.empty else ""}
{ranking_html(frame) if not frame.empty else "<p>No experiment has completed.</p>"}
{"".join(_figure_html(f, out) for f in shown)}
</body></html>
"""


def _run_names(run_dirs: list[Path]) -> list[str]:
    names: list[str] = []
    for d in run_dirs:
        name, n = d.resolve().name, 2
        while name in names:
            name, n = f"{d.resolve().name}-{n}", n + 1
        names.append(name)
    return names


def build_report(run_dirs: list[Path], out_dir: Path | None = None) -> Path:
    """Rebuild the table, figures and ``report.html`` of one run (in its directory), or
    compare several (into ``out_dir``, required then); return the report's path."""
    if not run_dirs:
        raise ValueError("give at least one run directory")
    if len(run_dirs) > 1 and out_dir is None:
        raise ValueError("comparing several runs needs an output directory")
    out = out_dir or run_dirs[0]
    manifests: dict[str, dict[str, Any]] = {}
    frames = []
    for name, run_dir in zip(_run_names(run_dirs), run_dirs, strict=True):
        manifest, frame = load_run(run_dir)
        manifests[name] = manifest
        if not frame.empty:
            frames.append(frame.assign(run=name))
    frame = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    devices = _devices(run_dirs, len(run_dirs) > 1)
    if not frame.empty:
        several = len(run_dirs) > 1
        series = frame["protocol"].astype(str)
        frame["series"] = frame["run"] + ": " + series if several else series
    out.mkdir(parents=True, exist_ok=True)
    figures = draw_figures(frame, out / FIGURES_DIR, devices)
    path = out / REPORT
    path.write_text(render(manifests, frame, figures, out, run_dirs))
    (out / SUMMARY).write_text(render_summary(manifests, frame, figures, out))
    if len(run_dirs) > 1 and not frame.empty:
        frame.to_parquet(out / TABLE, index=False)
    return path
