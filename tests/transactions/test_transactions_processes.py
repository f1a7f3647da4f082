"""Transactions with real processes: kill -9 at random points, a SIGSTOPped zombie.

Workers (``tests/helpers/transaction_worker.py``) run workflows of three transactions, each
inserting ``(workflow, step, pid)`` into ``effects`` and adding one to ``counter`` in the
transaction, on the system database or on an application database.

- kill -9: each cycle a worker recovers what the last one left, starts more workflows and is
  SIGKILLed after a random delay (before, during or after commits: many transactions are in
  flight); a last worker drains. Every workflow ends ``SUCCESS`` with every step
  checkpointed, and every transaction's effect is there exactly once: one ``effects`` row
  per (workflow, step), ``counter`` equal to their number.
- zombie: a worker's transaction runs its SQL and stops (SIGSTOP) before committing; its
  executor ID lock's session ends (as across a partition), a live executor takes the
  workflow over and finishes it; the zombie resumes and commits nothing.
"""

from __future__ import annotations

import asyncio
import random
import signal
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from helpers import (
    advisory_lock_holder,
    execute,
    fetch,
    fetchval,
    wait_no_connections,
    wait_until,
    workflow_row,
)
from helpers import transaction_worker as tw

WORKER = Path(__file__).resolve().parents[1] / "helpers" / "transaction_worker.py"
CYCLES = 6
PER_CYCLE = 6


async def spawn(system_url: str, app_url: str, on: str, cycle: int, count: int,
                stderr: Path, executor_id: str = "txn-executor") -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable, str(WORKER), system_url, app_url, on, str(cycle), str(count),
        executor_id, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=stderr.open("wb"))


def tail(path: Path) -> str:
    return path.read_text(errors="replace")[-3000:]


async def expect(proc: asyncio.subprocess.Process, expected: str, stderr: Path) -> str:
    assert proc.stdout is not None
    line = (await asyncio.wait_for(proc.stdout.readline(), 120)).decode().strip()
    if not line.startswith(expected):
        await proc.wait()
        raise AssertionError(f"worker said {line!r}, exit {proc.returncode}: {tail(stderr)}")
    return line


@pytest.fixture
async def app_url(create_database: Callable[[], Awaitable[str]]) -> str:
    return await create_database()


@pytest.mark.parametrize("on", ["system", "application"])
async def test_kill_nine_at_random_points_leaves_each_effect_once(
        database_url: str, app_url: str, on: str, tmp_path: Path) -> None:
    await kill_cycles(database_url, app_url, on, tmp_path, CYCLES)


async def kill_cycles(database_url: str, app_url: str, on: str, tmp_path: Path,
                      cycles: int) -> int:
    """``cycles`` kill -9 cycles, a drain, and the checks; returns how many kills landed
    while workflows were running (the chaos suite runs more cycles)."""
    effects_url = database_url if on == "system" else app_url
    await execute(effects_url, tw.TABLES)
    stderr = tmp_path / "worker.err"
    pending_at_kill = 0
    for cycle in range(cycles):
        proc = await spawn(database_url, app_url, on, cycle, PER_CYCLE, stderr)
        await expect(proc, "ready", stderr)
        await asyncio.sleep(random.uniform(0.0, 0.25))  # a random point, not a wait
        proc.kill()
        await proc.wait()
        for url in {database_url, app_url}:
            await wait_no_connections(url, tw.connection_name(cycle), patience=60)
        pending_at_kill += bool(await fetchval(
            database_url, "SELECT count(*) FROM dbos.workflow_status WHERE status = 'PENDING'"))
    last = await spawn(database_url, app_url, on, cycles, 0, stderr)
    await expect(last, "drained", stderr)
    await last.wait()
    assert pending_at_kill > 0, "no kill landed while workflows were running"

    total = cycles * PER_CYCLE
    statuses = await fetch(database_url, "SELECT status, count(*) AS n "
                                         "FROM dbos.workflow_status GROUP BY status")
    assert {r["status"]: r["n"] for r in statuses} == {"SUCCESS": total}
    assert await fetchval(database_url, "SELECT count(*) FROM dbos.operation_outputs "
                                        "WHERE function_name = 'effect'") == total * tw.STEPS
    duplicated = await fetch(effects_url, "SELECT workflow_id, step_id, count(*) FROM effects "
                                          "GROUP BY 1, 2 HAVING count(*) <> 1")
    assert duplicated == []
    assert await fetchval(effects_url, "SELECT count(*) FROM effects") == total * tw.STEPS
    assert await fetchval(effects_url, "SELECT n FROM counter") == total * tw.STEPS
    return pending_at_kill


@pytest.mark.parametrize("on", ["system", "application"])
async def test_a_stopped_zombie_commits_nothing_after_the_take_over(
        database_url: str, app_url: str, on: str, tmp_path: Path) -> None:
    effects_url = database_url if on == "system" else app_url
    await execute(effects_url, tw.TABLES)
    stderr = tmp_path / "zombie.err"
    zombie = await spawn(database_url, app_url, on, 90, -1, stderr, "zombie-executor")
    await expect(zombie, "inside", stderr)
    zombie.send_signal(signal.SIGSTOP)
    assert zombie.stdin is not None
    zombie.stdin.write(b"go\n")  # read once it runs again
    # The taker: the same workflow, another executor, failover on; the zombie's transaction
    # holds the counter row until its session ends (idle_transaction_timeout).
    taker, _ = tw.build(database_url, app_url, on, 91, "taker", failover_after=0.2,
                        idle_transaction_timeout=2.0)
    async with taker:
        key = taker.system_database.sql.executor_lock_key("zombie-executor")
        holder = await advisory_lock_holder(database_url, key)
        assert holder is not None
        await execute(database_url, "SELECT pg_terminate_backend($1::integer, 10000::bigint)",
                      holder)

        async def taken_and_done() -> bool:
            row = await workflow_row(database_url, "zombie")
            return row is not None and row["executor_id"] == "taker" \
                and row["status"] == "SUCCESS"

        await wait_until(taken_and_done, patience=120, what="the take-over")
    zombie.send_signal(signal.SIGCONT)
    said = await expect(zombie, "", stderr)
    await zombie.wait()
    rows = await fetch(effects_url, "SELECT step_id, pid FROM effects ORDER BY step_id")
    assert [r["step_id"] for r in rows] == list(range(tw.STEPS)), said
    assert zombie.pid not in {r["pid"] for r in rows}
    assert await fetchval(effects_url, "SELECT n FROM counter") == tw.STEPS
