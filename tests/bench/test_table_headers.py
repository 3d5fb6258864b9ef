"""Benchmark tables keep every header whole on a narrow terminal (#30: bench codec cut them)."""

from __future__ import annotations

import io

from rich.console import Console

from tensorwire.bench.tables import print_table


def test_headers_wrap_instead_of_being_cut_at_80_columns() -> None:
    columns = ["codec", "library_encode_ms", "encode_vs_library", "message_decode_ms"] * 3
    columns = [f"{c}{i}" for i, c in enumerate(columns)]
    buf = io.StringIO()
    print_table([dict.fromkeys(columns, 1.5)], "t", columns, Console(file=buf, width=80))
    text = buf.getvalue()
    assert "…" not in text
    header = text.split("┡")[0].split("\n", 1)[1]  # below the title
    shown = sum(ch.isalnum() for ch in header)
    assert shown == sum(ch.isalnum() for col in columns for ch in col)  # every letter is there
