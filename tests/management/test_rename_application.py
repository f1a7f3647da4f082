"""Renaming an application: every row it owns (queues, schedules, versions, workflows,
steps) moves to the new name in one transaction, on the unsharded and the sharded schema;
a refused rename moves nothing."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import asyncpg
import pytest
from helpers import fetch, fetchval, new_dbos, wait_until

from dbos_async import DBOSClient, DBOSError, SetShardKey, SetWorkflowID
from dbos_async._sysdb.statements import APPLICATION_TABLES


@dataclass
class Shared:
    url: str
    sharding: bool

    @property
    def key(self) -> str | None:
        return "tenant-a" if self.sharding else None

    def client(self, application_name: str | None = None) -> DBOSClient:
        return DBOSClient(system_database_url=self.url, application_name=application_name,
                          sharding=self.sharding, pool_size=2)


async def owners(url: str) -> dict[str, list[str | None]]:
    """The owner of every row of every table that records one, per table."""
    found: dict[str, list[str | None]] = {}
    for table in APPLICATION_TABLES:
        rows = await fetch(url, f"SELECT application_name FROM dbos.{table} "
                                "ORDER BY application_name NULLS FIRST")
        found[table] = [r["application_name"] for r in rows]
    return found


@pytest.fixture(params=[False, True], ids=["unsharded", "sharded"])
async def shared(request: pytest.FixtureRequest, database_url: str) -> AsyncIterator[Shared]:
    """A database where application "alpha" ran a workflow with a step, declared a queue,
    registered its version and a schedule, and has a workflow waiting; plus one unclaimed
    workflow."""
    setup = Shared(database_url, request.param)
    alpha = new_dbos(database_url, sharding=setup.sharding, application_name="alpha",
                     application_version="alpha-v1")
    alpha.queue("alpha-jobs")

    @alpha.step(name="double")
    async def double(x: int) -> int:
        return 2 * x

    @alpha.workflow(name="work")
    async def work(x: int) -> int:
        return await double(x)

    @alpha.workflow(name="tick")
    async def tick(scheduled_time: datetime, context: Any) -> None:
        return None

    async with alpha:
        with SetWorkflowID("done"):
            if setup.key:
                with SetShardKey(setup.key):
                    assert await work(2) == 4
            else:
                assert await work(2) == 4
        await alpha.create_schedule("yearly", tick, "0 0 1 1 *", shard_key=setup.key)
    async with setup.client("alpha") as client:
        await client.enqueue("alpha-jobs", "work", 3, workflow_id="waiting",
                             shard_key=setup.key)
    async with setup.client() as client:
        await client.enqueue("alpha-jobs", "work", 4, workflow_id="unclaimed",
                             shard_key=setup.key)
    yield setup


async def test_rename_moves_every_row_at_once(shared: Shared) -> None:
    before = await owners(shared.url)
    async with shared.client() as client:
        moved = await client.rename_application("alpha", "gamma")
    after = await owners(shared.url)
    for table in APPLICATION_TABLES:
        assert "alpha" not in after[table], table
        assert moved[table] == before[table].count("alpha") == after[table].count("gamma")
        assert after[table].count(None) == before[table].count(None)  # unclaimed stay so
    assert moved["workflow_status"] == 2 and moved["operation_outputs"] >= 1
    assert moved["queues"] == moved["workflow_schedules"] == 1

    # An executor of the new name finds the application's rows as its own.
    gamma = new_dbos(shared.url, sharding=shared.sharding, application_name="gamma",
                     application_version="alpha-v1")
    gamma.queue("alpha-jobs")

    @gamma.workflow(name="work")
    async def work(x: int) -> int:
        return x

    async with gamma:
        listed = {s.workflow_id for s in await gamma.list_workflows()}
        assert listed >= {"done", "waiting", "unclaimed"}
        assert [v.version_name for v in await gamma.list_application_versions()] == [
            "alpha-v1"]
        assert [s.schedule_name for s in await gamma.list_schedules()] == ["yearly"]


async def test_adopting_unclaimed_rows(shared: Shared) -> None:
    async with shared.client() as client:
        moved = await client.rename_application(None, "gamma", adopt_unclaimed_rows=True)
    after = await owners(shared.url)
    assert moved["workflow_status"] == 1  # "unclaimed"; alpha's rows keep their owner
    for table in APPLICATION_TABLES:
        assert None not in after[table], table
    assert "alpha" in after["workflow_status"]


async def test_refused_renames_move_nothing(shared: Shared) -> None:
    before = await owners(shared.url)
    async with shared.client() as client, shared.client("alpha") as as_alpha:
        for old, new, adopt, message in [
            ("alpha", "alpha", False, "already has that name"),
            ("alpha", "", False, "Invalid new_name: must be a non-empty string"),
            ("", "gamma", False, "Invalid old_name: must be a non-empty string"),
            (None, "gamma", False, "Nothing to rename"),
        ]:
            with pytest.raises(DBOSError, match=message):
                await client.rename_application(old, new, adopt_unclaimed_rows=adopt)
        # The client acting for the application cannot rename it under itself.
        with pytest.raises(DBOSError, match="acts for application 'alpha'"):
            await as_alpha.rename_application("alpha", "gamma")
    assert await owners(shared.url) == before


async def test_no_reader_sees_a_half_renamed_application(shared: Shared) -> None:
    """Held up on its last table (a step row another transaction locks), the rename has
    renamed nothing anyone can see; once it may go on, it has renamed everything."""
    before = await owners(shared.url)
    blocker = await asyncpg.connect(shared.url)
    try:
        blocking = blocker.transaction()
        await blocking.start()
        await blocker.execute("SELECT 1 FROM dbos.operation_outputs "
                              "WHERE application_name = 'alpha' FOR UPDATE")
        async with shared.client() as client:
            rename = asyncio.create_task(client.rename_application("alpha", "gamma"))

            async def waiting() -> bool:
                return bool(await fetchval(
                    shared.url, "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type "
                    "= 'Lock' AND query LIKE 'UPDATE %operation_outputs%'"))

            await wait_until(waiting, what="the rename to wait on the locked step row")
            assert await owners(shared.url) == before
            await blocking.rollback()
            await asyncio.wait_for(rename, 30)
    finally:
        await blocker.close()
    after = await owners(shared.url)
    assert all("alpha" not in after[table] for table in APPLICATION_TABLES)
