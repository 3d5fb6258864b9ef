"""The medians of ``tensorwire bench scale``'s runs: one row per transport and client count,
each number the median over the runs of that case that finished, and the ratio the issue's
goal is stated in (per client time at N against that at the transport's smallest N)."""

from __future__ import annotations

import statistics
from collections import defaultdict
from typing import Any

KEYS = ("transport", "clients")
"""What names a case."""
NOT_MEDIAN = frozenset({"run", "error", "clients_error"})
"""Columns of a run's row that are not a figure to take the median of."""


def median_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per case, in the order the cases first came: ``runs`` (how many finished),
    ``failed_runs``, the median of each number over the finished runs, and
    ``per_client_ratio``: this case's median ``per_client_ms`` over that of the same
    transport's smallest client count (1.0 there; absent where either has no finished run)."""
    runs: dict[tuple[Any, ...], list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        runs[tuple(r[k] for k in KEYS)].append(r)
    out = []
    for case, group in runs.items():
        good = [r for r in group if "error" not in r]
        row: dict[str, Any] = dict(zip(KEYS, case, strict=True))
        row["runs"], row["failed_runs"] = len(good), len(group) - len(good)
        for key in dict.fromkeys(k for r in good for k in r):
            if key in NOT_MEDIAN or key in KEYS:
                continue
            values = [r[key] for r in good if isinstance(r.get(key), int | float)]
            if values:
                row[key] = statistics.median(values)
        if not good:
            row["error"] = group[-1].get("error", "")
        out.append(row)
    _ratios(out)
    return out


def _ratios(rows: list[dict[str, Any]]) -> None:
    smallest: dict[str, dict[str, Any]] = {}
    for r in rows:
        if "per_client_ms" in r and (
            r["transport"] not in smallest or r["clients"] < smallest[r["transport"]]["clients"]
        ):
            smallest[r["transport"]] = r
    for r in rows:
        base = smallest.get(r["transport"])
        if base is not None and "per_client_ms" in r and base["per_client_ms"] > 0:
            r["per_client_ratio"] = r["per_client_ms"] / base["per_client_ms"]
