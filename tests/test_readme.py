"""README.md runs as written, top to bottom: every ```python and ```bash block in it is marked
``<!-- readme-test: run -->`` and run here, in order, in one scratch directory (with ``.venv``
linked in, so ``.venv/bin/tensorwire`` works as it does in a clone), or marked
``<!-- readme-test: skip REASON -->`` and reported as skipped with that reason.

A block without a marker fails: nobody can add a README example that no test runs.
"""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
BLOCK_TIMEOUT = 300  # seconds one block may take
_FENCE = re.compile(
    r"(?:<!--\s*(?P<tag>[\w-]+):\s*(?P<verdict>run|skip)\b\s*(?P<reason>.*?)\s*-->\s*\n)?"
    r"^```(?P<lang>[\w+-]*)[^\n]*\n(?P<code>.*?)^```\s*$",
    re.MULTILINE | re.DOTALL,
)


@dataclasses.dataclass(frozen=True)
class Block:
    """One fenced code block of a Markdown file, with its test marker (None: unmarked)."""

    path: Path
    line: int
    lang: str
    code: str
    verdict: str | None
    reason: str

    @property
    def where(self) -> str:
        return f"{self.path.name}:{self.line}"


def markdown_blocks(path: Path, tag: str) -> list[Block]:
    """The ```python and ```bash blocks of ``path``, with the ``<!-- TAG: run|skip ... -->``
    marker each has right above it."""
    text = path.read_text()
    blocks = []
    for m in _FENCE.finditer(text):
        if m["lang"] not in ("python", "bash"):
            continue
        marked = m["tag"] == tag
        blocks.append(
            Block(
                path,
                text.count("\n", 0, m.start("code")),
                m["lang"],
                m["code"],
                m["verdict"] if marked else None,
                m["reason"] if marked else "",
            )
        )
    return blocks


class BlockRunner:
    """Runs the runnable blocks of one file in order, in one scratch directory, each at most
    once; a block's test first runs every runnable block above it."""

    def __init__(self, blocks: list[Block], workdir: Path) -> None:
        self.blocks = blocks
        self.workdir = workdir
        self.results: dict[int, subprocess.CompletedProcess[str]] = {}
        (workdir / ".venv").symlink_to(Path(sys.executable).parents[1], target_is_directory=True)

    def run_through(self, index: int) -> subprocess.CompletedProcess[str]:
        for i, block in enumerate(self.blocks[: index + 1]):
            if i in self.results or block.verdict != "run":
                continue
            self.results[i] = done = self._run(i, block)
            if i < index and done.returncode != 0:  # its output says why (it passed alone?)
                pytest.fail(
                    f"{block.where}, a block above this one, exited {done.returncode}\n"
                    f"--- stdout\n{done.stdout[-2000:]}\n--- stderr\n{done.stderr[-3000:]}"
                )
        return self.results[index]

    def _run(self, i: int, block: Block) -> subprocess.CompletedProcess[str]:
        if block.lang == "python":
            script = self.workdir / f"block{i}.py"
            script.write_text(block.code)
            argv = [sys.executable, str(script)]
        else:
            argv = ["bash", "-euo", "pipefail", "-c", block.code]
        env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
        return subprocess.run(
            argv,
            cwd=self.workdir,
            env=env,
            capture_output=True,
            text=True,
            timeout=BLOCK_TIMEOUT,
            check=False,
        )


def check_block(runner: BlockRunner, index: int) -> None:
    """The test of block ``index``: skipped with its reason, or run (with those above it)."""
    block = runner.blocks[index]
    assert block.verdict is not None, (
        f"{block.where}: a ```{block.lang} block without a test marker; put "
        "<!-- readme-test: run --> or <!-- readme-test: skip REASON --> right above it"
    )
    if block.verdict == "skip":
        assert block.reason, f"{block.where}: a skipped block must say why"
        pytest.skip(f"{block.where}: {block.reason}")
    done = runner.run_through(index)
    assert done.returncode == 0, (
        f"{block.where} exited {done.returncode}\n--- stdout\n{done.stdout[-3000:]}"
        f"\n--- stderr\n{done.stderr[-3000:]}"
    )


BLOCKS = markdown_blocks(README, "readme-test")


@pytest.fixture(scope="module")
def readme(tmp_path_factory) -> BlockRunner:
    return BlockRunner(BLOCKS, tmp_path_factory.mktemp("readme"))


def _marks(block: Block) -> list[pytest.MarkDecorator]:
    long = block.verdict == "run" and re.search(r"tensorwire (fl|bench)\b", block.code)
    return [pytest.mark.slow] if long else []


@pytest.mark.parametrize(
    "index",
    [pytest.param(i, id=b.where, marks=_marks(b)) for i, b in enumerate(BLOCKS)],
)
def test_readme_block_runs_as_written(readme, index):
    check_block(readme, index)


def test_the_first_two_commands_are_main_and_test():
    first = BLOCKS[0].code.splitlines()
    assert [line.split("#")[0].strip() for line in first[:2]] == [
        "bash scripts/main.sh",
        "bash scripts/test.sh",
    ]


def test_every_python_block_is_run():
    # skipping is for commands that need root, other hosts or hours, never for the API
    assert [b.where for b in BLOCKS if b.lang == "python" and b.verdict != "run"] == []


def test_no_link_that_breaks_off_the_repository():
    """PyPI shows the README without the repository beside it: a relative link or image
    would break there, so the README names files in `code` and links nothing relative."""
    targets = re.findall(r"!?\[[^\]]*\]\(([^)]+)\)", README.read_text())
    assert [t for t in targets if not t.startswith(("https://", "http://", "#"))] == []


def test_the_checker_fails_unmarked_and_failing_blocks(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(
        "<!-- readme-test: run -->\n```bash\necho made > made.txt\n```\n\n"
        "<!-- readme-test: run -->\n```python\nassert open('made.txt').read() == 'made\\n'\n"
        "raise SystemExit(3)\n```\n\n"
        "```python\nprint('no marker')\n```\n\n"
        "<!-- readme-test: skip -->\n```bash\ntrue\n```\n"
    )
    blocks = markdown_blocks(page, "readme-test")
    assert [(b.lang, b.verdict) for b in blocks] == [
        ("bash", "run"),
        ("python", "run"),
        ("python", None),
        ("bash", "skip"),
    ]
    runner = BlockRunner(blocks, tmp_path)
    check_block(runner, 0)
    with pytest.raises(AssertionError, match="exited 3"):  # it ran after the block above it
        check_block(runner, 1)
    with pytest.raises(AssertionError, match="without a test marker"):
        check_block(runner, 2)
    with pytest.raises(AssertionError, match="must say why"):
        check_block(runner, 3)
