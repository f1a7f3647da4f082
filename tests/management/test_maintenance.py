"""Maintenance jobs: retention deletes only terminal, old workflows; the global timeout
cancels only old in-flight ones; one executor at a time runs a job (advisory lock)."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Awaitable, Callable

import pytest
from helpers import execute, fetch, fetchval, new_dbos, wait_until

from dbos_async import DBOS, SetWorkflowID, WorkflowCancelledError
from dbos_async._sysdb.management.operations import JobConnection
from dbos_async._sysdb.statements import job_lock_key
from dbos_async._sysdb.statements.management.control import advisory_lock_key

HOUR_MS = 3_600_000


async def seed_rows(url: str, now: int) -> None:
    """Workflows in every status, old and new, each with an input, an output and a step."""
    rows = [
        ("old-success", "SUCCESS", now - 10 * HOUR_MS, now - 9 * HOUR_MS),
        ("old-error", "ERROR", now - 10 * HOUR_MS, now - 9 * HOUR_MS),
        ("old-cancelled", "CANCELLED", now - 10 * HOUR_MS, now - 9 * HOUR_MS),
        ("old-dead", "MAX_RECOVERY_ATTEMPTS_EXCEEDED", now - 10 * HOUR_MS, now - 9 * HOUR_MS),
        # Created long ago but finished recently: kept (retention counts from completion).
        ("late-finish", "SUCCESS", now - 10 * HOUR_MS, now - 60_000),
        ("old-pending", "PENDING", now - 10 * HOUR_MS, None),
        ("old-enqueued", "ENQUEUED", now - 10 * HOUR_MS, None),
        ("old-delayed", "DELAYED", now - 10 * HOUR_MS, None),
        ("new-success", "SUCCESS", now - 60_000, now - 30_000),
        ("new-pending", "PENDING", now - 60_000, None),
    ]
    for workflow_id, status, created, completed in rows:
        await execute(url, """INSERT INTO dbos.workflow_status
                                (workflow_uuid, status, name, created_at, updated_at,
                                 completed_at, queue_name)
                              VALUES ($1, $2, 'seeded', $3, $3, $4, $5)""",
                      workflow_id, status, created, completed,
                      "q" if status in ("ENQUEUED", "DELAYED") else None)
        await execute(url, "INSERT INTO dbos.workflow_input (workflow_uuid, inputs) "
                      "VALUES ($1, '{}')", workflow_id)
        await execute(url, "INSERT INTO dbos.workflow_output (workflow_uuid, output) "
                      "VALUES ($1, '1')", workflow_id)
        await execute(url, """INSERT INTO dbos.operation_outputs
                                (workflow_uuid, function_id, function_name, output)
                              VALUES ($1, 0, 'step', '1')""", workflow_id)
        await execute(url, """INSERT INTO dbos.workflow_events (workflow_uuid, key, value)
                              VALUES ($1, 'k', '1')""", workflow_id)


async def ids_in(url: str, table: str) -> set[str]:
    return {r["workflow_uuid"] for r in await fetch(url, f"SELECT workflow_uuid FROM dbos.{table}")}


async def test_retention_deletes_only_terminal_old_workflows(database_url: str) -> None:
    dbos = new_dbos(database_url)
    async with dbos:
        now = int(time.time() * 1000)
        await seed_rows(database_url, now)
        deleted = await dbos.garbage_collect(now - HOUR_MS, batch_size=2)
        assert deleted == 4
        kept = {"late-finish", "old-pending", "old-enqueued", "old-delayed", "new-success",
                "new-pending"}
        for table in ("workflow_status", "workflow_input", "workflow_output",
                      "operation_outputs", "workflow_events"):
            assert await ids_in(database_url, table) == kept, table
        assert await dbos.garbage_collect(now - HOUR_MS) == 0


async def test_global_timeout_cancels_old_in_flight_workflows(database_url: str) -> None:
    dbos = new_dbos(database_url)
    started = asyncio.Event()

    @dbos.step(name="forever")
    async def forever() -> None:
        started.set()
        await asyncio.sleep(60)

    @dbos.workflow(name="running")
    async def running() -> None:
        await forever()

    async with dbos:
        now = int(time.time() * 1000)
        await seed_rows(database_url, now)
        with SetWorkflowID("live"):
            handle = await dbos.start_workflow(running)
        await asyncio.wait_for(started.wait(), 10)
        cutoff = int(time.time() * 1000) + 1  # the live workflow is older than this
        # Only the old ones and the live one: the seeded new PENDING one is newer than an hour.
        await execute(database_url, "UPDATE dbos.workflow_status SET created_at = $1 "
                      "WHERE workflow_uuid = 'new-pending'", cutoff + 1000)
        cancelled = await dbos.global_timeout(cutoff)
        assert cancelled is not None
        assert set(cancelled) == {"old-pending", "old-enqueued", "old-delayed", "live"}
        try:
            async with asyncio.timeout(10):
                await handle.get_result()
            raise AssertionError("the live workflow was not cancelled")
        except WorkflowCancelledError:
            pass
        statuses = {r["workflow_uuid"]: r["status"] for r in await fetch(
            database_url, "SELECT workflow_uuid, status FROM dbos.workflow_status")}
        assert statuses["new-pending"] == "PENDING"
        assert statuses["old-success"] == "SUCCESS" and statuses["old-error"] == "ERROR"
        for wid in cancelled:
            assert statuses[wid] == "CANCELLED"


async def test_two_executors_never_run_a_job_at_once(database_url: str) -> None:
    await execute(database_url, """CREATE TABLE job_runs (
        executor text, started timestamptz, finished timestamptz)""")
    a = new_dbos(database_url, executor_id="a")
    b = new_dbos(database_url, executor_id="b")
    async with a, b:
        async def attempt(name: str, executor: DBOS,
                          while_running: Callable[[], Awaitable[None]] | None = None) -> bool:
            async def job(conn: JobConnection) -> None:
                await conn.execute("INSERT INTO job_runs VALUES ($1, clock_timestamp(), NULL)",
                                   name)
                if while_running is not None:
                    await while_running()
                await asyncio.sleep(0.03)
                await conn.execute("UPDATE job_runs SET finished = clock_timestamp() "
                                   "WHERE executor = $1 AND finished IS NULL", name)

            ran, _ = await executor._system_database.run_locked("test_job", job)
            return ran

        # Each runs the job while the other is refused, in turn.
        refused: list[bool] = []

        async def other_tries(name: str, executor: DBOS) -> None:
            refused.append(not await attempt(name, executor))

        assert await attempt("a", a, lambda: other_tries("b", b))
        assert await attempt("b", b, lambda: other_tries("a", a))
        assert refused == [True, True]

        # Then both at once, many times: whatever each gets, never two runs overlapping.
        async def loop(name: str, executor: DBOS) -> list[bool]:
            results = []
            for _ in range(15):
                results.append(await attempt(name, executor))
                await asyncio.sleep(0.005)
            return results

        ra, rb = await asyncio.gather(loop("a", a), loop("b", b))
        runs = await fetch(database_url,
                           "SELECT executor, started, finished FROM job_runs ORDER BY started")
        assert len(runs) == 2 + sum(ra) + sum(rb)
        for earlier, later in itertools.pairwise(runs):
            assert earlier["finished"] is not None
            assert earlier["finished"] <= later["started"], (earlier, later)

        # While one executor holds the retention lock, the other skips the job.
        holding = asyncio.Event()
        release = asyncio.Event()

        async def hold(conn: JobConnection) -> None:
            holding.set()
            await release.wait()

        holder = asyncio.create_task(a._system_database.run_locked("retention", hold))
        await asyncio.wait_for(holding.wait(), 10)
        assert await b.garbage_collect(0) is None
        assert await b.global_timeout(0) == []  # another job, another lock
        release.set()
        assert (await holder)[0]
        assert await b.garbage_collect(0) == 0


async def test_the_lock_key_is_per_schema_application_and_job() -> None:
    assert job_lock_key("dbos", None, "retention") != job_lock_key("other", None, "retention")
    assert job_lock_key("dbos", None, "retention") != job_lock_key("dbos", None,
                                                                   "global_timeout")
    assert job_lock_key("dbos", "a", "retention") != job_lock_key("dbos", "b", "retention")
    # Named as DBOS Transact names it, so both SDKs' executors of one application share it.
    assert job_lock_key("dbos", "a", "retention") == advisory_lock_key(
        "dbos.background_job.dbos.a.retention")
    assert job_lock_key("dbos", None, "retention") == advisory_lock_key(
        "dbos.background_job.dbos..retention")
    assert -(2 ** 63) <= job_lock_key("dbos", None, "retention") < 2 ** 63


async def test_configured_retention_runs_in_the_background(database_url: str) -> None:
    now = int(time.time() * 1000)
    setup = new_dbos(database_url)
    async with setup:
        await seed_rows(database_url, now)
    dbos = new_dbos(database_url, retention_hours=1.0, maintenance_interval=0.05,
                    global_timeout_hours=5.0)
    async with dbos:
        async def cleaned() -> bool:
            return int(await fetchval(
                database_url,
                "SELECT count(*) FROM dbos.workflow_status WHERE workflow_uuid LIKE 'old-%'"
                " AND status <> 'CANCELLED'")) == 0

        await wait_until(cleaned, what="the retention and timeout jobs")
        # The old in-flight ones were cancelled by the timeout (and are deleted a round later).
        remaining = await ids_in(database_url, "workflow_status")
        assert {"late-finish", "new-success", "new-pending"} <= remaining


@pytest.mark.parametrize("sharding", [False, True], ids=["unsharded", "sharded"])
async def test_jobs_touch_only_their_application_and_unclaimed_rows(
        database_url: str, sharding: bool) -> None:
    """App A's retention and global timeout act on A's rows and unclaimed ones; app B's
    old rows (which A's listing does not show) are left alone."""
    a = new_dbos(database_url, application_name="app-a", application_version="va",
                 sharding=sharding)
    b = new_dbos(database_url, application_name="app-b", application_version="vb",
                 sharding=sharding, executor_id="other")
    now = int(time.time() * 1000)
    old = now - 10 * HOUR_MS
    async with a, b:
        key_column, key_value = ("shard_key, ", "'t1', ") if sharding else ("", "")
        for owner in ("app-a", "app-b", None):
            tag = owner or "unclaimed"
            for status in ("SUCCESS", "PENDING"):
                await execute(database_url, f"""INSERT INTO dbos.workflow_status
                        ({key_column}workflow_uuid, status, name, created_at, updated_at,
                         completed_at, application_name)
                        VALUES ({key_value}$1, $2, 'seeded', $3, $3, $4, $5)""",
                              f"{tag}-{status.lower()}", status, old,
                              old if status == "SUCCESS" else None, owner)
        assert {s.workflow_id for s in await a.list_workflows()} == {
            "app-a-success", "app-a-pending", "unclaimed-success", "unclaimed-pending"}

        assert await a.garbage_collect(now - HOUR_MS) == 2
        cancelled = await a.global_timeout(now - HOUR_MS)
        assert sorted(cancelled or []) == ["app-a-pending", "unclaimed-pending"]
        statuses = {r["workflow_uuid"]: r["status"] for r in await fetch(
            database_url, "SELECT workflow_uuid, status FROM dbos.workflow_status")}
        assert statuses == {"app-b-success": "SUCCESS", "app-b-pending": "PENDING",
                            "app-a-pending": "CANCELLED", "unclaimed-pending": "CANCELLED"}

        # Each application's job has its own lock: A holding its retention lock does not
        # keep B's retention from running.
        holding = asyncio.Event()
        release = asyncio.Event()

        async def hold(conn: JobConnection) -> None:
            holding.set()
            await release.wait()

        holder = asyncio.create_task(a._system_database.run_locked("retention", hold))
        await asyncio.wait_for(holding.wait(), 10)
        try:
            assert await b.garbage_collect(now - HOUR_MS) == 1
            assert await a.garbage_collect(now - HOUR_MS) is None
        finally:
            release.set()
            await holder
