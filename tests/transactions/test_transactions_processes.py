"""Transactions with real processes: kill -9 at random points, a SIGSTOPped zombie.

Workers (``tests/helpers/transaction_worker.py``) run workflows of three transactions, each
inserting ``(workflow, step, pid)`` into ``effects`` and adding one to ``counter`` in the
transaction, on the system database or on an application database.

- kill -9: each cycle a worker recovers what the last one left, starts more workflows and is
  SIGKILLed after a random delay (before, during or after commits: many transactions are in
  flight); a last worker drains. Every workflow ends ``SUCCESS`` with every step
  checkpointed, and every transaction's effect is there exactly once: one ``effects`` row
  per (workflow, step), ``counter`` equal to their number.
- kill -9 between the two commits: an application database's commit held (a deferred
  trigger waits on a lock) while the worker is killed, then let through; recovery finds the
  record and the effect stays once.
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

import asyncpg
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


async def test_kill_nine_between_the_two_commits_leaves_the_effect_once(
        database_url: str, app_url: str, tmp_path: Path) -> None:
    """The kill point between an application database's commit and the system database's:
    the worker's first transaction commits on the application database while a deferred
    trigger holds that commit on a lock the test has; the worker is killed -9 there, its
    system-database transaction (the fence, with the checkpoint) ends with its session, then
    the test lets the commit land. The record is there, the checkpoint is not; the next
    worker recovers the workflow: every effect once, every checkpoint there."""
    await execute(app_url, tw.TABLES)
    await execute(app_url, """
        CREATE FUNCTION hold() RETURNS trigger LANGUAGE plpgsql AS $$
          BEGIN PERFORM pg_advisory_xact_lock(4243); RETURN NULL; END $$;
        CREATE CONSTRAINT TRIGGER held AFTER INSERT ON effects
          DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION hold()""")
    stderr = tmp_path / "worker.err"
    holder = await asyncpg.connect(app_url)
    try:
        await holder.execute("SELECT pg_advisory_lock(4243)")
        proc = await spawn(database_url, app_url, "application", 0, 1, stderr)
        await expect(proc, "ready", stderr)

        async def commit_held() -> bool:
            return bool(await fetchval(app_url, "SELECT count(*) FROM pg_locks "
                                                "WHERE NOT granted AND locktype = 'advisory'"))

        await wait_until(commit_held, what="the worker's commit to wait on the trigger")
        proc.kill()
        await proc.wait()

        async def system_sessions_gone() -> bool:
            return not await fetchval(
                database_url, "SELECT count(*) FROM pg_stat_activity WHERE "
                              "application_name = $1 AND datname = current_database()",
                tw.connection_name(0))

        await wait_until(system_sessions_gone, patience=60,
                         what="the killed worker's system-database sessions to end")
        await holder.execute("SELECT pg_advisory_unlock(4243)")
        await wait_no_connections(app_url, tw.connection_name(0), patience=60)
    finally:
        await holder.close()
    # Between the two commits: the application's record and effect, no checkpoint.
    assert [tuple(r) for r in await fetch(
        app_url, "SELECT workflow_id, step_id FROM dbos.datasource_outputs")] == [("w0-0", 0)]
    assert await fetchval(app_url, "SELECT count(*) FROM effects") == 1
    assert await fetchval(database_url, "SELECT count(*) FROM dbos.operation_outputs") == 0

    last = await spawn(database_url, app_url, "application", 1, 0, stderr)
    await expect(last, "drained", stderr)
    await last.wait()
    row = await workflow_row(database_url, "w0-0")
    assert row is not None and row["status"] == "SUCCESS"
    assert await fetchval(database_url, "SELECT count(*) FROM dbos.operation_outputs "
                                        "WHERE function_name = 'effect'") == tw.STEPS
    rows = await fetch(app_url, "SELECT step_id, count(*) AS n FROM effects GROUP BY 1 "
                                "ORDER BY 1")
    assert [(r["step_id"], r["n"]) for r in rows] == [(i, 1) for i in range(tw.STEPS)]
    assert await fetchval(app_url, "SELECT n FROM counter") == tw.STEPS


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
        key = taker._system_database.sql.executor_lock_key("zombie-executor")
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
