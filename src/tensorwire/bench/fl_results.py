"""A ``bench fl`` run's results as one table: a row per experiment and round.

From each done experiment directory it takes the server's ``rounds.parquet`` (accuracy,
``comm_s``: the sum over devices of downlink + uplink wall times), ``transfers.parquet``
(both sides' records of every transfer) and ``counters.parquet`` (the testbed's counters at
every round boundary), and adds per round:

- ``lower_bound_s``: each transfer's message bytes (header + encoded tensors) over its
  link's rate, summed over transfers as ``comm_s`` is: the time the shaped links need at least;
- ``encode_s`` / ``wire_s`` / ``decode_s``: ``comm_s`` split into the senders' encoding,
  the receivers' decoding, and the rest (on the wire and in queues; also any encoding or
  decoding whose record a device did not send back);
- ``wire_bytes``: bytes the veths sent (frames, protocol overhead and resends included);
- ``retrans_segs``: TCP segments retransmitted in every namespace (the broker's included).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from tensorwire.bench.fl_matrix import codec_label

EXPERIMENTS_DIR = "experiments"
TABLE = "experiments.parquet"
# The settings that tell experiments apart (the repetition aside).
DIMENSIONS = ["protocol", "model", "profile", "loss", "stress", "codec", "epochs", "security"]


def _read(path: Path) -> pd.DataFrame:
    return pd.read_parquet(path) if path.is_file() else pd.DataFrame()


def _per_round_transfers(transfers: pd.DataFrame, rates: dict[str, float | None]) -> pd.DataFrame:
    """Per round: lower bound, and the encoding and decoding seconds of the summed transfers."""
    columns = ["round", "lower_bound_s", "encode_s", "decode_s"]
    if transfers.empty:
        return pd.DataFrame(columns=columns)
    key = ["round", "direction", "device"]
    sent = transfers[transfers["role"] == "send"].groupby(key)["encode_s"].max()
    got = transfers[transfers["role"] == "recv"].groupby(key)["decode_s"].max()
    size = transfers.groupby(key)["bytes_encoded"].max()
    each = (
        pd.concat([size, sent, got], axis=1)
        .reset_index()
        .fillna({"encode_s": 0.0, "decode_s": 0.0})
    )
    rate = each["direction"].map(lambda d: rates.get(d) or np.nan)
    each["lower_bound_s"] = each["bytes_encoded"] * 8 / rate
    return (
        each.groupby("round")
        .agg(
            lower_bound_s=("lower_bound_s", lambda s: s.sum(min_count=len(s))),
            encode_s=("encode_s", "sum"),
            decode_s=("decode_s", "sum"),
        )
        .reset_index()
    )


def _per_round_counters(counters: pd.DataFrame) -> pd.DataFrame:
    """Per round: the counters' increase since the reading before (start, or last round)."""
    columns = ["round", "retrans_segs", "tcp_out_segs", "wire_down_bytes", "wire_up_bytes"]
    if counters.empty:
        return pd.DataFrame(columns=columns)
    counters = counters.copy()
    counters["reading"] = counters.groupby(["point", "round"], sort=False).ngroup()
    tcp = counters[counters["kind"] == "tcp"]
    links = counters[counters["kind"] == "link"]
    server_end = (links["node"] == "srv") & ~links["ifname"].str.endswith("br")
    device_end = links["node"].str.startswith("dev")
    host = links["node"] == "host"  # loopback: one interface carries both directions
    per = pd.DataFrame(
        {
            "retrans_segs": tcp.groupby("reading")["tcp_retrans_segs"].sum(),
            "tcp_out_segs": tcp.groupby("reading")["tcp_out_segs"].sum(),
            "wire_down_bytes": links[server_end].groupby("reading")["tx_bytes"].sum(),
            "wire_up_bytes": links[device_end].groupby("reading")["tx_bytes"].sum(),
            "wire_host_bytes": links[host].groupby("reading")["tx_bytes"].sum(),
        }
    )
    points = counters.groupby("reading")[["point", "round"]].first()
    deltas = per.sort_index().diff().join(points)
    deltas = deltas[deltas["point"] == "round"].drop(columns="point")
    if deltas["wire_host_bytes"].notna().any():
        deltas["wire_down_bytes"] = np.nan
        deltas["wire_up_bytes"] = np.nan
    return deltas.reset_index(drop=True)


def experiment_frame(exp_dir: Path) -> pd.DataFrame:
    """One row per round of the done experiment in ``exp_dir``."""
    doc = json.loads((exp_dir / "manifest.json").read_text())
    exp = doc["experiment"]
    rates = doc.get("link_rate_bps") or {}
    rounds = _read(exp_dir / "rounds.parquet")
    frame = rounds.merge(
        _per_round_transfers(_read(exp_dir / "transfers.parquet"), rates), on="round", how="left"
    ).merge(_per_round_counters(_read(exp_dir / "counters.parquet")), on="round", how="left")
    frame["payload_bytes"] = frame["uplink_bytes"] + frame["downlink_bytes"]
    frame["wire_bytes"] = frame["wire_down_bytes"] + frame["wire_up_bytes"]
    if "wire_host_bytes" in frame:
        frame["wire_bytes"] = frame["wire_bytes"].fillna(frame.pop("wire_host_bytes"))
    frame["wire_s"] = (frame["comm_s"] - frame["encode_s"] - frame["decode_s"]).clip(lower=0.0)
    frame["comm_over_bound"] = frame["comm_s"] / frame["lower_bound_s"]
    profile = doc.get("shaping", {}).get("profile", {})
    settings: dict[str, Any] = {
        "key": doc["key"],
        **{k: exp[k] for k in ("protocol", "model", "profile", "loss", "stress", "uplink")},
        "ratio": exp["ratio"],
        "downlink": exp.get("downlink", "none"),
        "epochs": exp.get("epochs", 1),
        "security": exp.get("security", "none"),
        "codec": codec_label(exp["uplink"], exp["ratio"], exp.get("downlink", "none")),
        "rep": exp["rep"],
        "clients": exp["clients"],
        "dataset": exp["dataset"],
        "rounds_total": exp["rounds"],
        "label": doc["label"],
        "shaped": doc["shaped"],
        "rate_down_bps": rates.get("downlink"),
        "rate_up_bps": rates.get("uplink"),
        "loss_applied": profile.get("loss", 0.0),
    }
    for name, value in reversed(settings.items()):
        frame.insert(0, name, value)
    return frame


def done_experiments(run_dir: Path) -> list[Path]:
    """The experiment directories of ``run_dir`` that completed, in the matrix's order."""
    root = run_dir / EXPERIMENTS_DIR
    if not root.is_dir():
        return []
    manifest = run_dir / "manifest.json"
    order = json.loads(manifest.read_text()).get("experiments", []) if manifest.is_file() else []
    rank = {key: i for i, key in enumerate(order)}
    done = [d for d in root.iterdir() if (d / "done").is_file()]
    return sorted(done, key=lambda d: (rank.get(d.name, len(rank)), d.name))


def collect(run_dir: Path) -> pd.DataFrame:
    """Every done experiment of ``run_dir``, one row per round; also written as
    ``experiments.parquet``."""
    frames = [experiment_frame(d) for d in done_experiments(run_dir)]
    frame = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    frame.to_parquet(run_dir / TABLE, index=False)
    return frame


def summarize(frame: pd.DataFrame, by: list[str] | None = None) -> pd.DataFrame:
    """Key numbers per setting (over rounds and repetitions): communication time per round,
    its lower bound and their ratio, bytes per round, retransmissions per round, the final
    accuracy (last round, mean over repetitions) and the encode / wire / decode split."""
    by = by or [d for d in DIMENSIONS if d in frame]
    if frame.empty:
        return pd.DataFrame(columns=by)
    last = frame[frame["round"] == frame["rounds_total"]]
    grouped = frame.groupby(by, sort=False, dropna=False)
    table = grouped.agg(
        reps=("rep", "nunique"),
        comm_s=("comm_s", "mean"),
        lower_bound_s=("lower_bound_s", "mean"),
        payload_bytes=("payload_bytes", "mean"),
        wire_bytes=("wire_bytes", "mean"),
        retrans_segs=("retrans_segs", "mean"),
        encode_s=("encode_s", "mean"),
        wire_s=("wire_s", "mean"),
        decode_s=("decode_s", "mean"),
        label=("label", "first"),
    )
    sums = grouped[["comm_s", "lower_bound_s"]].sum(min_count=1)
    table["ratio"] = sums["comm_s"] / sums["lower_bound_s"]
    table["final_accuracy"] = last.groupby(by, sort=False, dropna=False)["accuracy"].mean()
    return table.reset_index()
