"""A costly result made once for the whole test run, however many xdist workers need it.

The first worker to ask makes it, under an exclusive lock on a file in the run's shared
temporary directory, and writes it there as JSON; the others wait on the lock and read it. A
failure (or a skip) is kept too, so every test that needed the result fails (or skips) with
its message instead of making it again. Without xdist it is simply made.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest


def made_once(
    factory: pytest.TempPathFactory, name: str, make: Callable[[Path], Any]
) -> tuple[Path, Any]:
    """``(directory, make(directory))`` for the run: ``make`` writes what it makes into the
    directory it is given and returns what JSON can hold."""
    if os.environ.get("PYTEST_XDIST_WORKER") is None:
        where = factory.mktemp(name)
        return where, make(where)
    root = factory.getbasetemp().parent / "made-once"  # shared by the run's workers
    root.mkdir(exist_ok=True)
    where, result = root / name, root / f"{name}.json"
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the maker holds it until its result is written
        if not result.exists():
            where.mkdir()
            try:
                outcome = {"value": make(where)}
            except pytest.skip.Exception as exc:  # a reason that holds for every worker
                result.write_text(json.dumps({"skip": str(exc)}))
                raise
            except BaseException as exc:
                outcome = {"error": f"{type(exc).__name__}: {exc}"[:6000]}
                result.write_text(json.dumps(outcome))
                raise
            result.write_text(json.dumps(outcome))
    outcome = json.loads(result.read_text())
    if "skip" in outcome:
        pytest.skip(outcome["skip"])
    if "error" in outcome:
        pytest.fail(f"{name}, made by another worker, failed: {outcome['error']}")
    return where, outcome["value"]
