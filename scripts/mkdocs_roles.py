"""A mkdocs hook: Sphinx cross-reference roles in docstrings (``:class:`Hub```, ``:meth:`~a.b.c```)
rendered as code, as Sphinx shows them, instead of as raw text. mkdocstrings renders the role's
target as ``<code>``; this drops the role in front of it, and a leading ``~`` keeps only the
last name."""

from __future__ import annotations

import re
from typing import Any

ROLE = re.compile(
    r":(?:py:)?(?:meth|class|func|attr|mod|data|exc|obj|const|term|ref):<code>(~?)([^<]*)</code>"
)


def _code(match: re.Match[str]) -> str:
    short, target = match.group(1), match.group(2)
    shown = target.rsplit(".", 1)[-1] if short else target.lstrip(".")
    return f"<code>{shown}</code>"


def on_page_content(html: str, **_: Any) -> str:
    return ROLE.sub(_code, html)
