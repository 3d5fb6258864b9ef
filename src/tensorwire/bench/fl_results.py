"""A ``bench fl`` run's results as one table: a row per experiment and round.

From each done experiment directory it takes the server's ``rounds.parquet`` (accuracy,
``comm_s``: the sum over devices of downlink + uplink wall times), ``transfers.parquet``
(both sides' records of every transfer) and ``counters.parquet`` (the testbed's counters at
every round boundary), and adds per round:

- ``lower_bound_s``: each transfer's message bytes (header + encoded tensors) over the rate
  of the slowest link on its way (its device's own, or the shared one), summed over transfers
  as ``comm_s`` is: the time the shaped links need at least, each transfer alone on them;
- ``encode_s`` / ``wait_s`` / ``wire_s`` / ``decode_s``: ``comm_s`` split four ways, the
  same on every protocol: ``encode_s`` the senders' CPU encoding; ``wire_s`` the receivers'
  time from a message's first byte arriving to its last, less decoding (the bytes crossing
  the link); ``decode_s`` the receivers' CPU decoding (header, checksums, codecs; never the
  wait for bytes); ``wait_s`` the rest: from the end of encoding to the first byte arriving
  (a fan-out's queue, a broker's store and forward, the link's delay), and any part whose
  record a device did not send back;
- ``wire_bytes``: bytes the veths sent (frames, protocol overhead and resends included);
- ``retrans_segs``: TCP segments retransmitted in every namespace (the broker's included);
  NaN (n/a) for a protocol whose data is not TCP's (udp, quic: they resend themselves);
- on a shared topology, ``shared_down_bytes`` / ``shared_up_bytes``: bytes the shared access
  link carried towards the devices / the server, and ``shared_down_copies``: how many copies
  of the model crossed it per round (4 when a server unicasts to 4 devices, 1 when a broker
  beyond it fans out).

:func:`device_frame` gives a row per device and round (its link, downlink and uplink time).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from tensorwire.bench.fl_matrix import codec_label, transport_of

EXPERIMENTS_DIR = "experiments"
TABLE = "experiments.parquet"
# The settings that tell experiments apart (the repetition aside).
DIMENSIONS = [
    "topology",
    "links",
    "protocol",
    "model",
    "profile",
    "loss",
    "stress",
    "codec",
    "epochs",
    "security",
]


def _read(path: Path) -> pd.DataFrame:
    return pd.read_parquet(path) if path.is_file() else pd.DataFrame()


def _per_round_transfers(
    transfers: pd.DataFrame,
    rates: dict[str, float | None],
    device_rates: dict[str, dict[str, float | None]] | None = None,
) -> pd.DataFrame:
    """Per round: lower bound, and the encoding and decoding seconds of the summed transfers.
    ``device_rates`` (device -> direction -> bits/s), where given, are each device's way."""
    columns = ["round", "lower_bound_s", "encode_s", "wire_s", "decode_s"]
    if transfers.empty:
        return pd.DataFrame(columns=columns)
    for part in ("encode_s", "wire_s", "decode_s"):  # records that lack a part: 0 s of it
        if part not in transfers:
            transfers = transfers.assign(**{part: 0.0})
    key = ["round", "direction", "device"]
    sent = transfers[transfers["role"] == "send"].groupby(key)["encode_s"].max()
    got = transfers[transfers["role"] == "recv"].groupby(key)[["wire_s", "decode_s"]].max()
    size = transfers.groupby(key)["bytes_encoded"].max()
    each = (
        pd.concat([size, sent, got], axis=1)
        .reset_index()
        .fillna({"encode_s": 0.0, "wire_s": 0.0, "decode_s": 0.0})
    )
    if device_rates:
        rate = pd.Series(
            [
                (device_rates.get(dev) or {}).get(d) or np.nan
                for dev, d in zip(each["device"], each["direction"], strict=True)
            ],
            index=each.index,
            dtype=float,
        )
    else:
        rate = each["direction"].map(lambda d: rates.get(d) or np.nan)
    each["lower_bound_s"] = each["bytes_encoded"] * 8 / rate
    return (
        each.groupby("round")
        .agg(
            lower_bound_s=("lower_bound_s", lambda s: s.sum(min_count=len(s))),
            encode_s=("encode_s", "sum"),
            wire_s=("wire_s", "sum"),
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
    if "role" in links and links["role"].fillna("").ne("").any():
        role = links["role"].fillna("")
        server_end, device_end = role == "port", role == "device"
    else:  # counters from before link roles: a star, its bridge in the server namespace
        server_end = (links["node"] == "srv") & ~links["ifname"].str.endswith("br")
        device_end = links["node"].str.startswith("dev")
        role = pd.Series("", index=links.index)
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
    if (role == "shared-server").any():
        shared = links.assign(role=role).groupby(["reading", "role"])["tx_bytes"].sum()
        per["shared_down_bytes"] = shared.xs("shared-server", level="role")
        per["shared_up_bytes"] = shared.xs("shared-switch", level="role")
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
    transfers = _read(exp_dir / "transfers.parquet")
    per_device = doc.get("device_rate_bps")
    frame = rounds.merge(
        _per_round_transfers(transfers, rates, per_device), on="round", how="left"
    ).merge(_per_round_counters(_read(exp_dir / "counters.parquet")), on="round", how="left")
    frame["payload_bytes"] = frame["uplink_bytes"] + frame["downlink_bytes"]
    if "shared_down_bytes" in frame:
        # one model's bytes: the downlink's message bytes over the devices it went to
        devices: pd.Series = frame["round"].map(_downlink_messages(transfers))
        one = frame["downlink_bytes"] / devices.replace(0, np.nan)
        frame["shared_down_copies"] = frame["shared_down_bytes"] / one
    frame["wire_bytes"] = frame["wire_down_bytes"] + frame["wire_up_bytes"]
    if "wire_host_bytes" in frame:
        frame["wire_bytes"] = frame["wire_bytes"].fillna(frame.pop("wire_host_bytes"))
    parts = frame["encode_s"] + frame["wire_s"] + frame["decode_s"]
    frame["wait_s"] = (frame["comm_s"] - parts).clip(lower=0.0)
    if not _over_tcp(exp["protocol"]):
        frame["retrans_segs"] = np.nan  # its data is not TCP's: the counters say nothing of it
    frame["comm_over_bound"] = frame["comm_s"] / frame["lower_bound_s"]
    profile = doc.get("shaping", {}).get("profile", {})
    settings: dict[str, Any] = {
        "key": doc["key"],
        **{k: exp[k] for k in ("protocol", "model", "profile", "loss", "stress", "uplink")},
        "ratio": exp["ratio"],
        "downlink": exp.get("downlink", "none"),
        "epochs": exp.get("epochs", 1),
        "security": exp.get("security", "none"),
        # every codec of the run in one label (lossless none: recorded before it was an axis)
        "codec": codec_label(
            exp["uplink"], exp["ratio"], exp.get("downlink", "none"), exp.get("codec", "none")
        ),
        "lossless": exp.get("codec", "none"),
        "rep": exp["rep"],
        "clients": exp["clients"],
        "dataset": exp["dataset"],
        "rounds_total": exp["rounds"],
        "label": doc["label"],
        "shaped": doc["shaped"],
        "rate_down_bps": rates.get("downlink"),
        "rate_up_bps": rates.get("uplink"),
        "loss_applied": profile.get("loss", 0.0),
        "topology": doc.get("topology", exp.get("topology", "star")),
        "links": ",".join(exp.get("links") or ()) or "uniform",
        "fanout": doc.get("fanout", "concurrent"),
    }
    for name, value in reversed(settings.items()):
        frame.insert(0, name, value)
    return frame


def _over_tcp(protocol: str) -> bool:
    """Whether ``protocol``'s data crosses the links as TCP (True for one not registered
    here: the counters are kept)."""
    try:
        return transport_of(protocol).over_tcp
    except KeyError:
        return True


def _downlink_messages(transfers: pd.DataFrame) -> dict[int, int]:
    """Round -> how many devices the server sent the model to (its send records)."""
    if transfers.empty:
        return {}
    sent = transfers[
        (transfers["side"] == "server")
        & (transfers["role"] == "send")
        & (transfers["direction"] == "downlink")
    ]
    counts = sent.groupby("round")["device"].nunique()
    return {int(r): int(n) for r, n in zip(counts.index, counts, strict=True)}


def device_frame(exp_dir: Path) -> pd.DataFrame:
    """One row per device and round of the done experiment in ``exp_dir``: its link
    (``link``, ``rate_bps``: its way's slowest rate), ``down_s`` (its downlink wall time as
    the device saw it, from the server's first encoded byte: a sequential fan-out's wait
    included), ``up_s`` (its update's), ``comm_s`` (both), ``finished_s`` (when the server
    had its update: seconds after the round's first model byte went out; training and any
    wait included) and the settings that tell experiments apart."""
    doc = json.loads((exp_dir / "manifest.json").read_text())
    exp = doc["experiment"]
    transfers = _read(exp_dir / "transfers.parquet")
    columns = ["round", "device", "down_s", "up_s", "comm_s"]
    if transfers.empty:
        return pd.DataFrame(columns=columns)
    seconds = transfers["e2e_s"].fillna(transfers["wall_s"]) if "e2e_s" in transfers else None
    transfers = transfers.assign(seconds=seconds if seconds is not None else transfers["wall_s"])
    recv = transfers[transfers["role"] == "recv"]
    per = recv.pivot_table(
        index=["round", "device"], columns="direction", values="seconds", aggfunc="max"
    )
    frame = pd.DataFrame(
        {
            "down_s": per.get("downlink", pd.Series(np.nan, index=per.index)),
            "up_s": per.get("uplink", pd.Series(np.nan, index=per.index)),
        }
    ).reset_index()
    frame["comm_s"] = frame["down_s"].fillna(0.0) + frame["up_s"].fillna(0.0)
    frame["finished_s"] = _finished(transfers, frame)
    links = list(exp.get("links") or ())
    rates = doc.get("device_rate_bps") or {}

    def number(device: str) -> int:
        tail = device.rsplit("-", 1)[-1]
        return int(tail) if tail.isdigit() else 0

    frame["link"] = [
        links[number(d) - 1] if 0 < number(d) <= len(links) else exp["profile"]
        for d in frame["device"]
    ]
    frame["rate_bps"] = [
        min([r for r in (rates.get(d) or {}).values() if r] or [np.nan]) for d in frame["device"]
    ]
    settings = {
        "key": doc["key"],
        "protocol": exp["protocol"],
        "topology": doc.get("topology", "star"),
        "links": ",".join(links) or "uniform",
        "profile": exp["profile"],
        "model": exp["model"],
        "loss": exp["loss"],
        "rep": exp["rep"],
        "label": doc["label"],
    }
    for name, value in reversed(settings.items()):
        frame.insert(0, name, value)
    return frame


def _finished(transfers: pd.DataFrame, frame: pd.DataFrame) -> pd.Series:
    """Per row of ``frame`` (round, device): when the server had the device's update, in
    seconds after the round's first downlink send started (the server's clock for both)."""
    if "started_at" not in transfers:
        return pd.Series(np.nan, index=frame.index)
    server = transfers[transfers["side"] == "server"]
    sends = server[(server["role"] == "send") & (server["direction"] == "downlink")]
    start = sends.groupby("round")["started_at"].min()
    got = server[(server["role"] == "recv") & (server["direction"] == "uplink")]
    end = (got["started_at"] + got["wall_s"]).groupby([got["round"], got["device"]]).max()
    keys = pd.MultiIndex.from_frame(frame[["round", "device"]])
    return pd.Series(
        end.reindex(keys).to_numpy() - start.reindex(frame["round"]).to_numpy(),
        index=frame.index,
        dtype=float,
    )


def collect_devices(run_dir: Path) -> pd.DataFrame:
    """:func:`device_frame` of every done experiment of ``run_dir``, in one table."""
    frames = [device_frame(d) for d in done_experiments(run_dir)]
    frames = [f for f in frames if not f.empty]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


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
    accuracy (last round, mean over repetitions) and the encode / wait / wire / decode
    split."""
    by = by or [d for d in DIMENSIONS if d in frame]
    if frame.empty:
        return pd.DataFrame(columns=by)
    if "wait_s" not in frame:  # a table written before waiting was told apart
        frame = frame.assign(wait_s=np.nan)
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
        wait_s=("wait_s", "mean"),
        wire_s=("wire_s", "mean"),
        decode_s=("decode_s", "mean"),
        label=("label", "first"),
    )
    for extra in ("shared_down_bytes", "shared_up_bytes", "shared_down_copies"):
        if extra in frame:
            table[extra] = grouped[extra].mean()
    sums = grouped[["comm_s", "lower_bound_s"]].sum(min_count=1)
    table["ratio"] = sums["comm_s"] / sums["lower_bound_s"]
    table["final_accuracy"] = last.groupby(by, sort=False, dropna=False)["accuracy"].mean()
    return table.reset_index()
