"""Every Python block of the documentation (docs/**/*.md and README.md) runs, so the docs
cannot drift from the code; every link of the README and CONTRIBUTING.md resolves.

How a block is tested depends on its fence (CONTRIBUTING.md, "Code blocks in the docs"):

- ```` ```python ````: a program, run in a fresh directory with ``DBOS_SYSTEM_DATABASE_URL``
  set to a fresh database; a top-level ``await`` runs as in ``python -m asyncio``.
- ```` ```python {test="in:NAME"} ````: a piece of the program ``tests/doc_contexts/NAME.py``,
  put in place of its line ``...  # the block`` (indented as that line is), then run so.
- ```` ```python {test="fragment"} ````: a piece that needs more than a context gives
  (a module of its own, an application database, a server): compiled; each name it
  imports from dbos_async must exist, and each attribute of ``dbos`` and ``client``.
- ```` ```python {test="by:tests/test_x.py"} ````: a file of a larger example that the test
  module named runs (it reads the block from the page, which it names).
- A block that is only ``--8<-- "examples/NAME.py"`` shows a file the tests already run
  (tests/test_examples.py, tests/integrations/test_fastapi.py, tests/integrations/test_aiohttp.py).

Other languages (shell, output, TOML) are not run.
"""

from __future__ import annotations

import ast
import importlib
import os
import re
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CONTEXTS = Path(__file__).resolve().parent / "doc_contexts"
PAGES = sorted([*(ROOT / "docs").rglob("*.md"), ROOT / "README.md"])
FENCE = re.compile(r"^(?P<indent> *)```(?P<lang>[\w-]*) *(?:\{(?P<attrs>[^}]*)\})? *$")
ATTRIBUTE = re.compile(r'(\w+)="([^"]*)"')
SNIPPET = re.compile(r'^--8<-- "([^"]+)"$')
BLOCK_LINE = "...  # the block"
# Runs a block as `python -m asyncio` would: top-level awaits in one event loop.
RUNNER = """\
import ast, asyncio, sys
path = sys.argv[1]
code = compile(open(path).read(), path, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
result = eval(code, {"__name__": "__main__", "__file__": path})
if result is not None:
    asyncio.run(result)
"""


@dataclass(frozen=True)
class Block:
    page: Path
    line: int
    lang: str
    test: str
    source: str

    @property
    def id(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks_of(page: Path) -> list[Block]:
    found: list[Block] = []
    lines = page.read_text().splitlines()
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if opening is None:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].lstrip().startswith("```"))
        attrs = dict(ATTRIBUTE.findall(opening["attrs"] or ""))
        body = textwrap.dedent("\n".join(lines[i + 1:end]))
        found.append(Block(page, i + 1, opening["lang"], attrs.get("test", "run"), body))
        i = end + 1
    return found


PYTHON = [b for page in PAGES for b in blocks_of(page) if b.lang == "python"]


def run_program(source: str, database_url: str, cwd: Path) -> None:
    for context in CONTEXTS.glob("*.py"):
        (cwd / context.name).write_text(context.read_text())
    (cwd / "program.py").write_text(source)
    (cwd / "runner.py").write_text(RUNNER)
    env = dict(os.environ, DBOS_SYSTEM_DATABASE_URL=database_url)
    done = subprocess.run([sys.executable, "runner.py", "program.py"], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"


def in_context(block: Block) -> str:
    name = block.test.removeprefix("in:")
    context = (CONTEXTS / f"{name}.py").read_text()
    [marker] = [line for line in context.splitlines() if line.strip() == BLOCK_LINE]
    indent = marker[: len(marker) - len(marker.lstrip())]
    return context.replace(marker, textwrap.indent(block.source, indent), 1)


def check_names(source: str) -> None:
    """Each name a fragment imports from dbos_async exists, and so does each attribute it
    uses of ``dbos`` (a DBOS) and ``client`` (a DBOSClient)."""
    from dbos_async import DBOS, DBOSClient

    classes: dict[str, type] = {"dbos": DBOS, "client": DBOSClient}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("dbos_async"):
            module = importlib.import_module(node.module or "")
            for alias in node.names:
                assert hasattr(module, alias.name), f"{node.module} has no {alias.name}"
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id in classes):
            assert hasattr(classes[node.value.id], node.attr), (
                f"{classes[node.value.id].__name__} has no {node.attr}")


@pytest.mark.parametrize("block", [b for b in PYTHON
                                   if b.test == "run" and not SNIPPET.match(b.source.strip())],
                         ids=lambda b: b.id)
def test_a_program_block_runs(block: Block, database_url: str, tmp_path: Path) -> None:
    run_program(block.source, database_url, tmp_path)


@pytest.mark.parametrize("block", [b for b in PYTHON if b.test.startswith("in:")],
                         ids=lambda b: b.id)
def test_a_block_runs_in_its_context(block: Block, database_url: str, tmp_path: Path) -> None:
    run_program(in_context(block), database_url, tmp_path)


@pytest.mark.parametrize("block", [b for b in PYTHON if b.test == "fragment"],
                         ids=lambda b: b.id)
def test_a_fragment_compiles_and_its_imports_exist(block: Block) -> None:
    compile(block.source, block.id, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    check_names(block.source)


def test_every_python_block_is_tested() -> None:
    """A block is a program, a piece of a context, a fragment, or a file the tests run."""
    for block in PYTHON:
        snippet = SNIPPET.match(block.source.strip())
        if snippet:
            path = ROOT / snippet[1]
            assert path.parent == ROOT / "examples" and path.is_file(), block.id
        else:
            assert block.test in {"run", "fragment"} or block.test.startswith(("in:", "by:")), (
                f"{block.id}: unknown test={block.test!r}")
            if block.test.startswith("in:"):
                assert (CONTEXTS / f"{block.test[3:]}.py").is_file(), block.id
            if block.test.startswith("by:"):
                runner = ROOT / block.test[3:]
                named = {str(block.page.relative_to(ROOT)), block.page.name}
                assert any(name in runner.read_text() for name in named), (
                    f"{block.id}: {runner} does not read this page")


def test_the_fence_form_is_one_the_test_reads() -> None:
    """A Python fence with options the pattern misses would go untested."""
    for page in PAGES:
        for number, line in enumerate(page.read_text().splitlines(), 1):
            if line.lstrip().startswith("```python"):
                assert FENCE.match(line), f"{page.relative_to(ROOT)}:{number}: {line.strip()}"


@pytest.mark.parametrize("name", ["README.md", "CONTRIBUTING.md"])
def test_the_links_of_the_top_level_pages_resolve(name: str) -> None:
    """Every relative link of the README and CONTRIBUTING.md names a file of the repository
    (the docs' own links are checked by the strict build), and a link into a page names a
    heading of that page."""
    links = re.findall(r"\]\(([^)\s]+)\)", (ROOT / name).read_text())
    assert links
    for link in links:
        if link.startswith(("http://", "https://", "mailto:")):
            continue
        path, _, anchor = link.partition("#")
        target = ROOT / path if path else ROOT / name
        assert target.is_file(), f"{name} links to {link}, which does not exist"
        if anchor:
            assert anchor in anchors_of(target), f"{name} links to {link}: no such heading"


def anchors_of(page: Path) -> set[str]:
    """The anchors of a page's headings, as GitHub and the site (mkdocs.yml) make them."""
    anchors = set()
    inside = False
    for line in page.read_text().splitlines():
        if line.lstrip().startswith("```"):
            inside = not inside
        elif not inside and line.startswith("#"):
            text = line.lstrip("#").strip().lower().replace("`", "")
            anchors.add(re.sub(r"[^\w\- ]", "", text).replace(" ", "-"))
    return anchors
