"""The documentation's examples run as written, and its site's pages are all in the nav.

Every ```python / ```bash block of ``docs/**/*.md`` marked ``<!-- docs-test: run -->`` runs
here (the same runner as the README's, one scratch directory per page); the site itself is
built with ``mkdocs build --strict`` by scripts/test.sh.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from test_readme import BlockRunner, check_block, markdown_blocks

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGES = sorted(DOCS.rglob("*.md"))
MARKED = [
    (page, i)
    for page in PAGES
    for i, block in enumerate(markdown_blocks(page, "docs-test"))
    if block.verdict is not None
]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("page", "index"),
    [pytest.param(p, i, id=f"{p.relative_to(DOCS)}-{i}") for p, i in MARKED],
)
def test_marked_docs_examples_run(page, index, tmp_path):
    check_block(BlockRunner(markdown_blocks(page, "docs-test"), tmp_path), index)


def test_the_guides_have_runnable_examples():
    assert {p.name for p, _ in MARKED} >= {"getting-started.md", "adding-a-codec.md"}


def test_every_page_is_in_the_nav():
    """mkdocs warns (and --strict fails) on a page left out of the nav only when it builds;
    this says which one without building."""
    nav = (ROOT / "mkdocs.yml").read_text()
    listed = set(re.findall(r":\s*([\w./-]+\.md)\s*$", nav, re.MULTILINE))
    assert {str(p.relative_to(DOCS)) for p in PAGES} - listed == set()


def test_docs_link_nothing_outside_the_repository():
    outside = []
    for page in PAGES:
        for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", page.read_text()):
            inside = (page.parent / target).resolve().is_relative_to(DOCS)
            if "://" in target or target.startswith("/") or not inside:
                outside.append(f"{page.relative_to(DOCS)}: {target}")
    assert outside == []


SITE = ROOT / "build" / "site"  # where scripts/test.sh's `mkdocs build --strict` writes


def test_the_built_site_shows_no_raw_sphinx_roles_and_the_whole_api():
    """Docstrings' ``:class:`X``` are shown as code (scripts/mkdocs_roles.py), and the
    reference names every public entry point with its real signature."""
    reference = SITE / "reference" / "index.html"
    if not reference.is_file():
        pytest.skip(f"no built site at {SITE}: scripts/test.sh builds it before the tests")
    raw = re.compile(r":(?:meth|class|func|attr|mod|data|exc|obj):(?:<code>|`)")
    for page in SITE.rglob("*.html"):
        assert not raw.search(page.read_text()), f"a raw Sphinx role in {page}"
    text = re.sub(r"<[^>]+>", "", reference.read_text())
    for name in ("fl.api.serve", "fl.api.join", "register_codec", "get_codec", "HubOptions"):
        assert name.rsplit(".", 1)[-1] in text, name
    assert "Bases: _Endpoint" not in text
    assert "-&gt; BroadcastResult" in text or "-> BroadcastResult" in text
    assert "codec: Any = 'auto'" in text or "codec: Any = &#39;auto&#39;" in text
