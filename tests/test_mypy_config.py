"""mypy checks every tensorwire module: no override may switch its errors off (issue 14)."""

from __future__ import annotations

import tomllib
from pathlib import Path

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


def _overrides() -> list[dict]:
    config = tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))
    return config["tool"]["mypy"].get("overrides", [])


def test_no_module_has_its_type_errors_ignored() -> None:
    silenced = [o["module"] for o in _overrides() if o.get("ignore_errors")]
    assert silenced == [], f"mypy overrides with ignore_errors: {silenced}"


def test_only_third_party_modules_may_lack_types() -> None:
    for override in _overrides():
        modules = override["module"]
        modules = [modules] if isinstance(modules, str) else modules
        ours = [m for m in modules if m.split(".")[0] == "tensorwire"]
        assert ours == [], f"an override covers tensorwire modules: {ours}"
