"""Where brokers win: the report's section on topology, fan-out and mixed links.

From a ``bench fl`` run's tables (:func:`~tensorwire.bench.fl_results.collect` and
:func:`~tensorwire.bench.fl_results.collect_devices`) it makes three tables and the sentences
that say what they show:

- :func:`topology_table`: per topology and protocol, communication time per round split into
  downlink and uplink, each against concurrent tcp on the same topology (``x_tcp`` > 1: faster
  than tcp), and, on a shared topology, the bytes the shared access link carried towards the
  devices and how many copies of the model that is (the proof that a broker beyond the link
  sends it across once);
- :func:`fanout_table`: sequential unicast (FedComm's TCP server) against the concurrent
  broadcast, per topology;
- :func:`mixed_links_table`: per protocol and set of per-device links, each device's time,
  what the slowest link costs (its time over the median device's), and what a deadline that
  dropped it would have bought (when the round would have ended without its update).

:func:`section_html` puts them in one HTML fragment for ``report.html``.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import numpy as np
import pandas as pd

from tensorwire.bench.fl_results import collect, collect_devices

BASELINE = "tcp"  # the concurrent unicast every other protocol is compared with
SEQUENTIAL = "tcp-sequential"
# What one setting is, the topology, protocol and links aside.
_SETTING = ["model", "profile", "loss"]


def _per_round_split(devices: pd.DataFrame) -> pd.DataFrame:
    """Per experiment and round: the downlink and uplink times summed over devices."""
    return devices.groupby(["key", "round"])[["down_s", "up_s"]].sum(min_count=1).reset_index()


def topology_table(frame: pd.DataFrame, devices: pd.DataFrame) -> pd.DataFrame:
    """One row per topology, setting and protocol (means per round over rounds and
    repetitions): ``comm_s``, ``down_s``, ``up_s``, ``lower_bound_s``, the speed-ups over
    concurrent tcp on the same topology and setting (``x_tcp``, ``down_x_tcp``; NaN without
    a tcp run there), and on shared topologies ``shared_down_mb`` and ``shared_down_copies``."""
    if frame.empty or "topology" not in frame:
        return pd.DataFrame()
    frame = frame[frame["links"].fillna("uniform") == "uniform"]
    if frame.empty:
        return pd.DataFrame()
    split = _per_round_split(devices) if not devices.empty else pd.DataFrame()
    if not split.empty:
        frame = frame.merge(split, on=["key", "round"], how="left")
    else:
        frame = frame.assign(down_s=np.nan, up_s=np.nan)
    by = ["topology", *_SETTING, "protocol"]
    columns = {
        "comm_s": ("comm_s", "mean"),
        "down_s": ("down_s", "mean"),
        "up_s": ("up_s", "mean"),
        "lower_bound_s": ("lower_bound_s", "mean"),
        "reps": ("rep", "nunique"),
    }
    for extra in ("shared_down_bytes", "shared_down_copies"):
        if extra in frame:
            columns[extra] = (extra, "mean")
    table = frame.groupby(by, sort=False, dropna=False).agg(**columns).reset_index()
    if "shared_down_bytes" in table:
        table["shared_down_mb"] = table.pop("shared_down_bytes") / 1e6
    base = table[table["protocol"] == BASELINE].set_index(["topology", *_SETTING])
    keys = pd.MultiIndex.from_frame(table[["topology", *_SETTING]])
    for column, out in (("comm_s", "x_tcp"), ("down_s", "down_x_tcp")):
        reference = base[column].reindex(keys).to_numpy()
        table[out] = reference / table[column].to_numpy()
    return table


def fanout_table(table: pd.DataFrame) -> pd.DataFrame:
    """Per topology and setting with both: sequential unicast's time over the concurrent
    broadcast's, for the whole round (``slowdown``) and the downlink alone (``down_slowdown``)."""
    if table.empty:
        return pd.DataFrame()
    keys = ["topology", *_SETTING]
    seq = table[table["protocol"] == SEQUENTIAL].set_index(keys)
    con = table[table["protocol"] == BASELINE].set_index(keys)
    both = seq.index.intersection(con.index)
    if both.empty:
        return pd.DataFrame()
    out = pd.DataFrame(
        {
            "sequential_s": seq.loc[both, "comm_s"],
            "concurrent_s": con.loc[both, "comm_s"],
            "slowdown": seq.loc[both, "comm_s"] / con.loc[both, "comm_s"],
            "down_slowdown": seq.loc[both, "down_s"] / con.loc[both, "down_s"],
        }
    )
    return out.reset_index()


def mixed_links_table(devices: pd.DataFrame) -> pd.DataFrame:
    """One row per topology, protocol and set of links (means per round): the slowest
    device's and the median device's communication time, what the slowest costs
    (``straggler_x``: slowest over median; ``straggler_s``: the difference), each device's
    mean time in ``per_device`` (``device-1 (3g) 12.1 s, ...``), and from when the server had
    each update: ``round_s`` (the last update's arrival after the round's first send) and
    ``without_slowest_s`` (the last but the slowest device's: when a deadline or a quorum
    that did without that device could have ended the round; ``drop_saves_s`` the
    difference)."""
    if devices.empty:
        return pd.DataFrame()
    rows = []
    by = ["topology", "protocol", "links", *[c for c in ("model", "loss") if c in devices]]
    for keys, group in devices.groupby(by, sort=False):
        topology, protocol, links, *rest = keys
        setting = dict(zip(by[3:], rest, strict=True))
        each = group.groupby(["device", "link"], sort=True)["comm_s"].mean()
        slowest = float(each.max())
        median = float(each.median())
        # each is indexed by (device, link) pairs, which pandas' stubs type as Hashable
        slowest_device, slowest_link = cast(tuple[str, str], each.idxmax())
        ends = _round_ends(group, slowest_device)
        rows.append(
            {
                "topology": topology,
                "protocol": protocol,
                "links": links,
                **setting,
                "slowest_device": slowest_device,
                "slowest_link": slowest_link,
                "slowest_s": slowest,
                "median_s": median,
                "straggler_s": slowest - median,
                "straggler_x": slowest / median if median > 0 else np.nan,
                **ends,
                "per_device": ", ".join(
                    f"{d} ({lk}) {s:.2f} s" for (d, lk), s in zip(each.index, each, strict=True)
                ),
            }
        )
    return pd.DataFrame(rows)


def _round_ends(group: pd.DataFrame, slowest: str) -> dict[str, float]:
    """Means over an experiment set's rounds of when the last update arrived (``round_s``),
    when the last but ``slowest``'s did (``without_slowest_s``), and their difference."""
    if "finished_s" not in group or group["finished_s"].isna().all():
        return {"round_s": np.nan, "without_slowest_s": np.nan, "drop_saves_s": np.nan}
    per = group.groupby(["key", "round"])
    last = per["finished_s"].max()
    rest = group[group["device"] != slowest].groupby(["key", "round"])["finished_s"].max()
    with_all, without = float(last.mean()), float(rest.reindex(last.index).mean())
    return {
        "round_s": with_all,
        "without_slowest_s": without,
        "drop_saves_s": with_all - without,
    }


def verdicts(table: pd.DataFrame, fanout: pd.DataFrame, mixed: pd.DataFrame) -> list[str]:
    """Short sentences, computed from the tables: who beats tcp where and by how much, what
    sequential unicast costs, and what the slowest link costs each protocol."""
    said = []
    row: Any  # itertuples() types every field as any scalar; these columns are numbers or text
    for row in table.itertuples():
        if row.protocol in (BASELINE, SEQUENTIAL) or not np.isfinite(row.x_tcp):
            continue
        copies = getattr(row, "shared_down_copies", np.nan)
        crossing = (
            f"; the model crossed the shared link {copies:.2f} times per round"
            if isinstance(copies, float) and np.isfinite(copies)
            else ""
        )
        faster = "faster" if row.x_tcp >= 1 else "slower"
        factor = row.x_tcp if row.x_tcp >= 1 else 1 / row.x_tcp
        said.append(
            f"{row.topology}, {row.profile}: {row.protocol} is {factor:.2f}x {faster} than "
            f"concurrent tcp ({row.comm_s:.2f} s vs {row.comm_s * row.x_tcp:.2f} s of "
            f"communication per round; downlink alone {row.down_x_tcp:.2f}x){crossing}."
        )
    for row in fanout.itertuples():
        said.append(
            f"{row.topology}, {row.profile}: sequential unicast (FedComm's tcp server) takes "
            f"{row.slowdown:.2f}x the concurrent broadcast's time ({row.sequential_s:.2f} s vs "
            f"{row.concurrent_s:.2f} s per round; downlink alone {row.down_slowdown:.2f}x)."
        )
    for row in mixed.itertuples():
        if row.links == "uniform":
            continue
        said.append(
            f"{row.topology}, links {row.links}"
            + (f", {row.model}" if "model" in mixed and mixed["model"].nunique() > 1 else "")
            + f": with {row.protocol} the slowest device "
            f"({row.slowest_device} on {row.slowest_link}) spends {row.slowest_s:.2f} s per "
            f"round communicating, {row.straggler_x:.2f}x the median device's "
            f"{row.median_s:.2f} s (+{row.straggler_s:.2f} s)"
            + (
                f"; the round took {row.round_s:.2f} s, and a deadline or quorum that did "
                f"without it could have ended it at {row.without_slowest_s:.2f} s "
                f"({row.drop_saves_s:.2f} s sooner)."
                if np.isfinite(row.round_s) and np.isfinite(row.without_slowest_s)
                else "."
            )
        )
    return said


def _html_table(frame: pd.DataFrame, columns: dict[str, str], digits: int = 2) -> str:
    shown = frame[[c for c in columns if c in frame]].rename(columns=columns)
    return shown.to_html(index=False, float_format=lambda v: f"{v:.{digits}f}", na_rep="–")


def section_html(run_dirs: Sequence[Path]) -> str:
    """The report's section on topology, fan-out and mixed links for ``run_dirs`` (empty
    when no run has more than one topology, a sequential baseline or per-device links)."""
    frames = [collect(Path(d)) for d in run_dirs]
    nonempty = [f for f in frames if not f.empty]
    frame = pd.concat(nonempty, ignore_index=True) if nonempty else None
    device_frames = [collect_devices(Path(d)) for d in run_dirs]
    devices = [f for f in device_frames if not f.empty]
    if frame is None or frame.empty or not devices:
        return ""
    device_table = pd.concat(devices, ignore_index=True)
    interesting = (
        frame["topology"].nunique() > 1
        or (frame["protocol"] == SEQUENTIAL).any()
        or (frame["links"] != "uniform").any()
    )
    if not interesting:
        return ""
    table = topology_table(frame, device_table)
    fanout = fanout_table(table)
    mixed = mixed_links_table(device_table)
    parts = ["<section id='topology'><h2>Topology, fan-out and mixed links</h2>"]
    parts.append(
        "<p>Times are per round, summed over devices (downlink: from the server's first "
        "encoded byte to the device's last decoded tensor, so a device waiting for its turn in "
        "a sequential fan-out counts that wait). <em>x tcp</em> is concurrent tcp's time on the "
        "same topology over this protocol's: above 1, faster than tcp. <em>copies</em> is how "
        "many times the model's bytes crossed the shared access link per round, from its byte "
        "counters.</p>"
    )
    parts.append(
        "<ul>"
        + "".join(f"<li>{html.escape(s)}</li>" for s in verdicts(table, fanout, mixed))
        + "</ul>"
    )
    if not table.empty:
        parts.append(
            _html_table(
                table,
                {
                    "topology": "topology",
                    "profile": "profile",
                    "protocol": "protocol",
                    "comm_s": "comm s",
                    "down_s": "down s",
                    "up_s": "up s",
                    "lower_bound_s": "bound s",
                    "x_tcp": "x tcp",
                    "down_x_tcp": "down x tcp",
                    "shared_down_mb": "shared link MB down",
                    "shared_down_copies": "copies",
                    "reps": "reps",
                },
            )
        )
    if not fanout.empty:
        parts.append("<h3>Sequential unicast vs concurrent broadcast (tcp)</h3>")
        parts.append(
            _html_table(
                fanout,
                {
                    "topology": "topology",
                    "profile": "profile",
                    "sequential_s": "sequential s",
                    "concurrent_s": "concurrent s",
                    "slowdown": "sequential / concurrent",
                    "down_slowdown": "downlink only",
                },
            )
        )
    if not mixed.empty:
        parts.append("<h3>Per-device time</h3>")
        parts.append(
            _html_table(
                mixed,
                {
                    "topology": "topology",
                    "links": "links",
                    "model": "model",
                    "protocol": "protocol",
                    "slowest_device": "slowest",
                    "slowest_link": "its link",
                    "slowest_s": "slowest s",
                    "median_s": "median s",
                    "straggler_x": "slowest / median",
                    "round_s": "round s",
                    "without_slowest_s": "without it s",
                    "per_device": "each device",
                },
            )
        )
    parts.append("</section>")
    return "\n".join(parts)
