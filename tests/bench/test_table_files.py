"""Benchmark result files keep every column any row has: a failed case's ``error`` after a
good first row was once dropped from the CSV and Parquet files (Arrow took the first row's
keys only)."""

from __future__ import annotations

from pathlib import Path

import pyarrow.csv
import pyarrow.parquet as pq

from tensorwire.bench.tables import write_rows


def test_a_key_only_a_later_row_has_is_a_column_empty_elsewhere(tmp_path: Path) -> None:
    rows = [
        {"transport": "tcp", "clients": 10, "join_s": 0.5},
        {"transport": "mqtt", "clients": 2000, "error": "BrokerFull: 1,353 joined"},
        {"transport": "shm", "clients": 10, "join_s": 0.4, "clients_error": "c3: PeerGone"},
    ]
    csv_path, parquet_path = write_rows(rows, tmp_path, "scale")
    for table in (pq.read_table(parquet_path), pyarrow.csv.read_csv(csv_path)):
        assert table.column_names == ["transport", "clients", "join_s", "error", "clients_error"]
        got = table.to_pylist()
        assert got[1]["error"] == "BrokerFull: 1,353 joined" and got[1]["join_s"] is None
        assert got[0]["error"] in (None, "")  # CSV reads an empty string cell as ""
        assert got[2]["clients_error"] == "c3: PeerGone"
