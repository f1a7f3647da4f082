"""Every example runs, twice: the second run returns recorded results without re-running steps."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
from helpers import wait_until

from dbos_async import SetWorkflowID
from dbos_async.testing import TestClock

# The web services run until stopped: tests/integrations/test_fastapi.py and
# tests/integrations/test_aiohttp.py start them as servers and drive them over HTTP.
SERVICES = {"fastapi_app", "aiohttp_app"}
EXAMPLES = sorted(p for p in (Path(__file__).parent.parent / "examples").glob("*.py")
                  if p.stem not in SERVICES)


def run_example(path: Path, database_url: str, cwd: Path) -> str:
    env = dict(os.environ, DBOS_SYSTEM_DATABASE_URL=database_url)
    done = subprocess.run(
        [sys.executable, str(path)], env=env, cwd=cwd, capture_output=True, text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.parametrize("example", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_example_runs_and_replays(example: Path, database_url: str, tmp_path: Path) -> None:
    first = run_example(example, database_url, tmp_path)
    second = run_example(example, database_url, tmp_path)
    assert first.strip(), "the example printed nothing"
    # The second run returns the recorded result and runs no step again.
    assert first.splitlines()[-1] == second.splitlines()[-1]
    if example.stem == "quickstart":
        assert first.count("step ") == 3
        assert "step " not in second
        assert "is SUCCESS" in second
    if example.stem == "order_pipeline":
        assert first.count("charging") == 1
        assert "charging" not in second
        assert second.splitlines()[-1] == "order-7 shipped with receipt-order-7"
    if example.stem == "transactions":
        assert first.count("transaction: inserting") == 1
        assert "inserting" not in second and "confirming" not in second
        assert second.splitlines()[-1] == "order-1 confirmed, 1 order(s) in all"
    if example.stem == "repair":
        # Reserved once (the fork replayed it), charged once (by the fork).
        assert first.count("reserving stock") == 1 and first.count("charging") == 1
        assert "reserving" not in second and "charging" not in second
        assert "order-9 failed: card declined" in second
        assert second.splitlines()[-1] == (
            "order-9-retry (forked from order-9): reserved order-9, charged order-9")
    if example.stem == "steps_and_waits":
        assert second.splitlines()[-1] == "globex:95 came first (globex asked), fee 9"
    if example.stem == "metrics":
        # The executor counted the run and its retry; the database counts the workflow
        # on both runs (the second ran nothing, so its executor counted nothing).
        assert 'dbos_step_retries_total{dbos_step_name="charge"} 1.0' in first
        assert 'dbos_workflow_completed_total{dbos_workflow_name="checkout"} 1.0' in first
        assert "dbos_workflow_completed_total" not in second
        for run in (first, second):
            assert "last hour: 1 checkout SUCCESS" in run
            assert ('dbos_recent_workflows{dbos_workflow_name="checkout",'
                    'dbos_workflow_status="SUCCESS"} 1.0') in run
    if example.stem == "replay_check":
        assert "DIVERGES order-1 (checkout, SUCCESS): step 1: recorded ship, new code " \
            "calls ship_fast" in first
        assert "version 2-unpatched: 0 of 2 workflows replay" in second
        assert second.splitlines()[-1] == "version 2: 2 of 2 workflows replay"


def load_example(name: str) -> ModuleType:
    path = Path(__file__).parent.parent / "examples" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"example_{name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def test_order_pipeline_waits_on_a_test_clock(database_url: str) -> None:
    """The order pipeline's durable waits (the approval's 30 s timeout, the sleep before
    shipping) pass when the test moves its clock, not in real time."""
    example = load_example("order_pipeline")
    clock = TestClock()
    example.dbos.configure(system_database_url=database_url, clock=clock)
    async with example.dbos:
        with SetWorkflowID("unapproved"):
            unapproved = await example.dbos.start_workflow(example.fulfil, "unapproved")
        with SetWorkflowID("approved"):
            approved = await example.dbos.start_workflow(example.fulfil, "approved")
        await clock.wait_for_timers(2)  # both wait for their approval
        await clock.advance(seconds=29)
        await example.dbos.send("approved", "approved", topic="approval")

        async def paid() -> bool:
            return await example.dbos.get_event("approved", "status") == "paid"

        await wait_until(paid, what="the approved order to be paid")
        # Paid, then asleep before shipping: done only once the clock has moved on.
        await clock.wait_for_timers(2)
        assert (await approved.get_status()).status == "PENDING"
        await clock.advance(seconds=1)
        assert await unapproved.get_result() == "unapproved rejected"
        assert await approved.get_result() == "approved shipped with receipt-approved"


def test_the_readme_first_workflow_runs_and_logs_where_its_database_is(
        database_url: str, tmp_path: Path) -> None:
    """The first example of the README, as written there: it runs, and the logging it sets
    up shows the system database it uses."""
    readme = (Path(__file__).parent.parent / "README.md").read_text()
    section = readme.split("## A first workflow", 1)[1]
    program = section.split("```python", 1)[1].split("\n", 1)[1].split("```", 1)[0]
    (tmp_path / "shop.py").write_text(program)
    env = dict(os.environ, DBOS_SYSTEM_DATABASE_URL=database_url)
    done = subprocess.run([sys.executable, "shop.py"], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["shipment-o-1", "order-o-2 shipment-o-2"]
    (started,) = [line for line in done.stderr.splitlines()
                  if line.startswith("INFO:dbos_async:DBOS shop started: ")]
    assert "system database postgresql://" in started
    assert started.endswith("/" + database_url.rsplit("/", 1)[1]), started
