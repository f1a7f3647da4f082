"""mypy checks a start_workflow call's arguments against the workflow's signature."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

PROGRAM = """
from dbos_async import DBOS, WorkflowHandle

dbos = DBOS()

@dbos.workflow()
async def greet(name: str, times: int = 1) -> str:
    return name * times

@dbos.step
async def shout(name: str) -> str:
    return name.upper()

@dbos.workflow
async def loud(name: str) -> str:
    return await shout(name)

async def main() -> None:
    handle: WorkflowHandle[str] = await dbos.start_workflow(greet, "a", times=2)
    result: str = await handle.get_result()
    direct: str = await greet("b")
    bare: str = await loud(await shout("c"))
    {extra}
"""


def run_mypy(tmp_path: Path, extra: str) -> subprocess.CompletedProcess[str]:
    source = tmp_path / "program.py"
    source.write_text(PROGRAM.format(extra=extra))
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", str(source)],
        capture_output=True, text=True, timeout=300,
    )


def test_wrong_arguments_are_rejected(tmp_path: Path) -> None:
    good = run_mypy(tmp_path, "pass")
    assert good.returncode == 0, good.stdout
    bad = run_mypy(tmp_path, 'await dbos.start_workflow(greet, 3, times="x")')
    assert bad.returncode == 1
    assert 'Argument 2 to "start_workflow" of "DBOS" has incompatible type "int"' in bad.stdout
    assert '"times"' in bad.stdout
    wrong_result = run_mypy(
        tmp_path, "h = await dbos.start_workflow(greet, 'a')\n    n: int = await h.get_result()"
    )
    assert wrong_result.returncode == 1
    assert "Incompatible types in assignment" in wrong_result.stdout


def test_bare_decorators_keep_the_signature(tmp_path: Path) -> None:
    bad = run_mypy(tmp_path, "n: int = await loud('a')\n    await dbos.start_workflow(loud, 3)")
    assert bad.returncode == 1
    assert "Incompatible types in assignment" in bad.stdout
    assert 'Argument 2 to "start_workflow" of "DBOS" has incompatible type "int"' in bad.stdout
