"""Protocols ranked per condition, with confidence intervals over repetitions, and a verdict.

A *condition* is one combination of the settings that vary in a run, the protocol and the
repetition aside (``3g, loss 10%``, ``wifi, resnet18``). Each experiment counts once: its
mean communication time per round, and its communication over the lower bound (summed over
its rounds), so rounds are not taken for repetitions.

- :func:`ranking_table`: per condition and series (protocol, or ``run: protocol``), the mean
  over repetitions, the half-width of its 95 % confidence interval (Student's t; NaN with one
  repetition), the rank and how many times the fastest's time it takes; protocols the
  evidence cannot tell apart (one repetition, or overlapping intervals) share a rank;
- :func:`verdicts`: per condition one sentence, e.g. ``3g, loss 10%: udp is 1.61x faster
  than tcp (95 % CI 1.43-1.80x, 3 repetitions paired)``; the ratio is the geometric mean of
  the per-repetition ratios, its interval from their logarithms, so a repetition's own load
  on the machine affects both protocols it compares. With one repetition, or an interval
  that holds 1.0, the two are "not told apart";
- :func:`section_html`: both as the report's ranking section.
"""

from __future__ import annotations

import html
import math
from typing import Any

import numpy as np
import pandas as pd

from tensorwire.bench.confidence import t95
from tensorwire.fl.config import payload_bytes
from tensorwire.testbed.profile import as_profile

BASELINE = "tcp"  # what a verdict compares the fastest with, where it ran
# The settings a condition can vary in, in the order its label names them.
CONDITION_DIMS = [
    "topology",
    "links",
    "profile",
    "loss",
    "model",
    "stress",
    "codec",
    "epochs",
    "security",
]


def condition_dims(frame: pd.DataFrame) -> list[str]:
    """The settings of :data:`CONDITION_DIMS` that take more than one value in ``frame``, and
    per-device links wherever there are some (they say what the condition is)."""
    mixed = "links" in frame and (frame["links"] != "uniform").any()
    return [
        d
        for d in CONDITION_DIMS
        if d in frame and (frame[d].nunique(dropna=False) > 1 or (d == "links" and mixed))
    ]


def _constant_dims(frame: pd.DataFrame) -> list[str]:
    """Where nothing varies, what names the one condition: the links (or the profile, with
    its loss where there is some) and the model."""
    mixed = "links" in frame and (frame["links"] != "uniform").any()
    lossy = "loss" in frame and (frame["loss"] > 0).any()
    dims = ["links" if mixed else "profile", *(["loss"] if lossy else []), "model"]
    return [d for d in dims if d in frame]


def condition_label(values: dict[str, Any]) -> str:
    """A condition as words: ``3g, loss 10%, resnet18`` (settings at their default left out
    where another names the condition)."""
    parts = []
    for dim, value in values.items():
        if dim == "loss":
            parts.append(f"loss {float(value) * 100:g}%")
        elif dim == "links":
            parts.append(f"links {value}" if value != "uniform" else "uniform links")
        elif dim == "stress":
            parts.append(f"{value} stress" if value != "none" else "no stress")
        elif dim == "codec":
            parts.append(f"codec {value}")
        elif dim == "epochs":
            parts.append(f"{value} epoch(s)")
        elif dim == "security":
            parts.append("tls" if value == "tls" else "no tls")
        else:
            parts.append(str(value))
    return ", ".join(parts) or "all experiments"


def experiment_table(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per experiment: its settings, ``condition`` (a label), ``series``, ``rep``,
    ``comm_s`` (mean per round) and ``ratio`` (communication over the lower bound)."""
    if frame.empty:
        return pd.DataFrame()
    dims = condition_dims(frame) or _constant_dims(frame)
    series = frame["series"] if "series" in frame else frame["protocol"]
    frame = frame.assign(series=series.astype(str))
    by = [c for c in ("run", "key") if c in frame]
    sums = frame.groupby(by, sort=False)[["comm_s", "lower_bound_s"]].sum(min_count=1)
    table = frame.groupby(by, sort=False).agg(
        series=("series", "first"),
        protocol=("protocol", "first"),
        rep=("rep", "first"),
        comm_s=("comm_s", "mean"),
        lower_bound_s=("lower_bound_s", "mean"),
        **{d: (d, "first") for d in dims},
    )
    table["ratio"] = sums["comm_s"] / sums["lower_bound_s"]
    table["condition"] = (
        [
            condition_label({d: getattr(row, d) for d in dims})
            for row in table[dims].itertuples(index=False)
        ]
        if dims
        else "all experiments"
    )
    return table.reset_index().sort_values(dims, key=_setting_order, kind="stable")


def _setting_order(values: pd.Series) -> pd.Series:
    """Sort keys for a setting's values: numbers as numbers, payloads by size, anything else
    in the order it first appears (the matrix's)."""
    if values.name == "loss":
        return values.astype(float)
    if values.name == "profile":  # slowest link first
        rates = values.map(_rate)
        if rates.notna().all():
            return rates
    sizes = values.map(lambda v: _payload_size(str(v)))
    if sizes.notna().all():
        return sizes
    first = {v: i for i, v in enumerate(dict.fromkeys(values))}
    return values.map(first)


def _rate(profile: Any) -> float:
    try:
        rate = as_profile(str(profile)).rate
    except ValueError:
        return np.nan
    return float(rate) if rate is not None else np.inf


def _payload_size(model: str) -> float:
    try:
        size = payload_bytes(model)
    except ValueError:
        return np.nan
    return float(size) if size is not None else np.nan


def _interval(values: pd.Series) -> tuple[float, float, int]:
    """Mean, 95 % CI half-width (NaN under two values) and count of ``values``."""
    values = values.dropna()
    n = len(values)
    if n == 0:
        return np.nan, np.nan, 0
    half = t95(n) * float(values.std()) / math.sqrt(n) if n >= 2 else np.nan
    return float(values.mean()), half, n


def ranking_table(frame: pd.DataFrame) -> pd.DataFrame:
    """Per condition (in the run's order) and series, fastest first: ``reps``, ``comm_s``
    and ``comm_ci`` (mean communication time per round over repetitions and its 95 % CI
    half-width), ``ratio`` and ``ratio_ci`` (over the lower bound), ``rank`` and
    ``x_fastest`` (this series' time over the condition's fastest). A series not told apart
    from the one before it (either has one repetition, or their intervals overlap) shares its
    rank, and ``tied`` says it shares one."""
    each = experiment_table(frame)
    if each.empty:
        return pd.DataFrame()
    rows = []
    for condition, group in each.groupby("condition", sort=False):
        for series, mine in group.groupby("series", sort=False):
            comm, comm_ci, n = _interval(mine["comm_s"])
            ratio, ratio_ci, _ = _interval(mine["ratio"])
            rows.append(
                {
                    "condition": condition,
                    "series": series,
                    "reps": n,
                    "comm_s": comm,
                    "comm_ci": comm_ci,
                    "ratio": ratio,
                    "ratio_ci": ratio_ci,
                }
            )
    table = pd.DataFrame(rows)
    order = {c: i for i, c in enumerate(dict.fromkeys(table["condition"]))}
    table = table.sort_values(
        ["condition", "comm_s"], key=lambda s: s.map(order) if s.name == "condition" else s
    )
    table = table.reset_index(drop=True)
    table["rank"] = _shared_ranks(table)
    table["tied"] = table.duplicated(["condition", "rank"], keep=False)
    fastest = table.groupby("condition", sort=False)["comm_s"].transform("min")
    table["x_fastest"] = table["comm_s"] / fastest
    return table


def told_apart(a: Any, b: Any) -> bool:
    """Whether rows ``a`` and ``b`` (``reps``, ``comm_s``, ``comm_ci``) differ beyond the
    noise: two or more repetitions each and 95 % intervals that do not overlap."""
    if a.reps < 2 or b.reps < 2 or not (np.isfinite(a.comm_ci) and np.isfinite(b.comm_ci)):
        return False
    low, high = (a, b) if a.comm_s <= b.comm_s else (b, a)
    return bool(low.comm_s + low.comm_ci < high.comm_s - high.comm_ci)


def _shared_ranks(table: pd.DataFrame) -> list[int]:
    """Ranks in ``table``'s order (fastest first per condition): one more than the rows
    before for a row told apart from the one before it, else that one's rank."""
    ranks: list[int] = []
    previous: Any = None
    for i, row in enumerate(table.itertuples(index=False)):
        if previous is None or previous.condition != row.condition:
            first, previous = i, row
            ranks.append(1)
            continue
        ranks.append(i - first + 1 if told_apart(previous, row) else ranks[-1])
        previous = row
    return ranks


def paired_ratio(slow: pd.DataFrame, fast: pd.DataFrame) -> tuple[float, float, float, int]:
    """``slow``'s time over ``fast``'s (experiment rows with ``rep`` and ``comm_s``), paired by
    repetition: the geometric mean of the per-repetition ratios and its 95 % CI (low, high;
    NaN with one pair), and the number of pairs. Unpaired, where no repetition is in both:
    the ratio of the means, no interval."""
    a = slow.groupby("rep")["comm_s"].mean()
    b = fast.groupby("rep")["comm_s"].mean()
    common = a.index.intersection(b.index)
    if len(common) == 0:
        return float(a.mean() / b.mean()), np.nan, np.nan, 0
    logs = np.log(a[common].to_numpy() / b[common].to_numpy())
    n = len(logs)
    centre = float(np.exp(logs.mean()))
    if n < 2:
        return centre, np.nan, np.nan, n
    half = t95(n) * float(logs.std(ddof=1)) / math.sqrt(n)
    return centre, float(np.exp(logs.mean() - half)), float(np.exp(logs.mean() + half)), n


def verdicts(frame: pd.DataFrame) -> list[str]:
    """Per condition with two or more series: the fastest against tcp (or, where tcp is the
    fastest or did not run, against the runner-up), the factor and its 95 % CI."""
    each = experiment_table(frame)
    ranking = ranking_table(frame)
    said = []
    for condition, ranked in ranking.groupby("condition", sort=False):
        if len(ranked) < 2:
            continue
        names = ranked["series"].tolist()
        fastest = names[0]
        other = BASELINE if BASELINE in names and fastest != BASELINE else names[1]
        rows = each[each["condition"] == condition]
        factor, low, high, pairs = paired_ratio(
            rows[rows["series"] == other], rows[rows["series"] == fastest]
        )
        digits = 3 if factor < 1.1 else 2  # 1.004x, not 1.00x
        measured = f"{fastest} measured {factor:.{digits}f}x faster"
        if pairs < 2:
            said.append(
                f"{condition}: {fastest} and {other} not told apart: one repetition, no "
                f"confidence interval ({measured}; --reps 3 or more can tell them apart)."
            )
            continue
        d = 3 if high < 1.1 else 2
        ci = f"CI {low:.{d}f}-{high:.{d}f}x"
        if low <= 1.0:
            said.append(
                f"{condition}: {fastest} and {other} not told apart at 95 % ({measured}; "
                f"{ci} over {pairs} repetitions paired)."
            )
        else:
            said.append(
                f"{condition}: {fastest} is {factor:.{digits}f}x faster than {other} "
                f"(95 % {ci}, {pairs} repetitions paired)."
            )
    return said


def _cell(mean: float, half: float, digits: int = 3) -> str:
    if not np.isfinite(mean):
        return "–"
    text = f"{mean:.{digits}g}"
    return text + (f" ± {half:.2g}" if np.isfinite(half) else "")


def section_html(frame: pd.DataFrame) -> str:
    """The report's ranking section: verdicts, then a table per condition."""
    ranking = ranking_table(frame)
    if ranking.empty or ranking["series"].nunique() < 2:
        return ""  # one protocol alone: no ranking (an experiment's own report)
    rows = []
    row: Any  # itertuples() types every field as any scalar; these are numbers or text
    for row in ranking.itertuples(index=False):
        rows.append(
            "<tr>"
            + "".join(
                f"<td{cls}>{html.escape(text)}</td>"
                for text, cls in (
                    (str(row.condition) if row.rank == 1 else "", ' class="text"'),
                    (f"{row.rank}=" if row.tied else str(row.rank), ""),
                    (str(row.series), ' class="text"'),
                    (_cell(row.comm_s, row.comm_ci), ""),
                    (f"{row.x_fastest:.2f}", ""),
                    (_cell(row.ratio, row.ratio_ci), ""),
                    (str(row.reps), ""),
                )
            )
            + "</tr>"
        )
    head = "".join(
        f"<th>{h}</th>"
        for h in (
            "condition",
            "rank",
            "protocol",
            "comm time / round (s) ± 95 % CI",
            "x fastest",
            "comm / bound ± 95 % CI",
            "reps",
        )
    )
    said = "".join(f"<li>{html.escape(s)}</li>" for s in verdicts(frame))
    return (
        "<section id='ranking'><h2>Ranking per condition</h2>"
        "<p>Each experiment counts once (its mean per round); ± is the half-width of the 95 % "
        "confidence interval of the mean over repetitions (Student's t), shown only where a "
        "setting has two or more. A verdict's factor is the geometric mean of the "
        "per-repetition ratios of the two protocols' times, its interval from their "
        "logarithms. Protocols the evidence cannot tell apart (one repetition, or "
        "overlapping intervals) share a rank, marked =.</p>"
        f"<ul class='verdicts'>{said}</ul>"
        f"<table><tr>{head}</tr>{''.join(rows)}</table></section>"
    )
