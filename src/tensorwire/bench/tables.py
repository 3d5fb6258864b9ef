"""Benchmark results: printed as rich tables, written as CSV and Parquet (via pyarrow)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.csv
import pyarrow.parquet
from rich.console import Console
from rich.table import Table


def write_rows(rows: Sequence[dict[str, Any]], out_dir: Path, name: str) -> list[Path]:
    """Write ``rows`` to ``out_dir/name.csv`` and ``.parquet``; return the paths. A column is
    every key any row has (empty where a row has none: a failed case's ``error``, say)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    keys = list(dict.fromkeys(k for row in rows for k in row))
    table = pa.Table.from_pylist([{k: row.get(k) for k in keys} for row in rows])
    csv_path, parquet_path = out_dir / f"{name}.csv", out_dir / f"{name}.parquet"
    flat = [i for i, f in enumerate(table.schema) if not pa.types.is_nested(f.type)]
    pyarrow.csv.write_csv(table.select(flat), csv_path)  # CSV has no lists: Parquet keeps them
    pyarrow.parquet.write_table(table, parquet_path)
    return [csv_path, parquet_path]


def _fmt(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        if value != value:  # NaN: the figure does not apply (or was not measured)
            return "n/a"
        return f"{value:.3g}" if abs(value) < 1000 else f"{value:,.0f}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return str(value)


def print_table(
    rows: Sequence[dict[str, Any]],
    title: str,
    columns: Sequence[str],
    console: Console | None = None,
) -> None:
    """Print the chosen columns of ``rows`` as a table."""
    table = Table(title=title)
    for col in columns:
        table.add_column(
            col,
            justify="left" if col in ("case", "transport", "codec", "dtype", "shape") else "right",
            # A header is never cut to an ellipsis: on a narrow terminal it wraps instead.
            overflow="fold",
        )
    for row in rows:
        table.add_row(*(_fmt(row.get(c, "")) for c in columns))
    (console or Console()).print(table)
