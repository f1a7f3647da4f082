"""Safety settings of the system database: transactions holding row locks are bounded by
``idle_transaction_timeout``, observability reads by ``observability_query_timeout``, and
``grant_permissions`` lets an application run as a least-privilege role."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest
from helpers import execute, fetch, new_dbos, unique_name

from dbos_async import (
    DBOS,
    DBOSClient,
    DBOSError,
    QueryTimeoutError,
    SetShardKey,
    SetWorkflowID,
)
from tests.integrations.test_cli import cli, failed, ok

SHARDING = pytest.mark.parametrize("sharding", [False, True], ids=["unsharded", "sharded"])
KEY = "tenant-1"


@contextlib.contextmanager
def under_key(sharding: bool) -> Any:
    """Start workflows under the test's shard key when sharded."""
    with SetShardKey(KEY) if sharding else contextlib.nullcontext():
        yield


def key_of(sharding: bool) -> str | None:
    return KEY if sharding else None


# ---- idle_in_transaction_session_timeout on every transaction that locks rows ----

RECORD_SETTING = """
CREATE TABLE settings_seen (operation text, timeout text);
CREATE FUNCTION dbos.record_idle_timeout() RETURNS trigger AS $$
BEGIN
  INSERT INTO public.settings_seen VALUES (
    CASE
      WHEN TG_OP = 'DELETE' THEN 'delete'
      WHEN NEW.status = 'CANCELLED' AND OLD.status <> 'CANCELLED' THEN 'cancel'
      WHEN NEW.status = 'ENQUEUED' AND OLD.status = 'CANCELLED' THEN 'resume'
      WHEN NEW.status = 'ENQUEUED' AND OLD.status = 'SUCCESS' THEN 'rewind'
      WHEN NEW.was_forked_from AND NOT OLD.was_forked_from THEN 'fork'
      -- A claim without a shared budget is one autocommit statement, never idle in a
      -- transaction: only the transactional claims of the queue 'jobs' are looked at.
      WHEN NEW.status = 'PENDING' AND OLD.status = 'ENQUEUED' AND OLD.queue_name = 'jobs'
        THEN 'claim'
      ELSE 'other'
    END,
    current_setting('idle_in_transaction_session_timeout'));
  RETURN NULL;
END $$ LANGUAGE plpgsql;
CREATE TRIGGER record_idle_timeout AFTER UPDATE OR DELETE ON dbos.workflow_status
  FOR EACH ROW EXECUTE FUNCTION dbos.record_idle_timeout();
"""


@SHARDING
async def test_transactions_holding_row_locks_carry_the_idle_timeout(
        database_url: str, sharding: bool) -> None:
    """A trigger records the setting each operation's transaction runs with: cancel,
    resume, fork, rewind, delete and a queue claim all run with the configured bound."""
    dbos = new_dbos(database_url, sharding=sharding, idle_transaction_timeout=7.5)
    jobs = dbos.queue("jobs", concurrency=1)  # a shared budget: claimed in a transaction
    started, release = asyncio.Event(), asyncio.Event()

    @dbos.workflow(name="waits")
    async def waits() -> str:
        started.set()
        await release.wait()
        return "done"

    @dbos.step(name="one")
    async def one() -> int:
        return 1

    @dbos.workflow(name="quick")
    async def quick() -> int:
        return await one()

    async with dbos:
        await execute(database_url, RECORD_SETTING)
        key = key_of(sharding)
        with under_key(sharding), SetWorkflowID("held"):
            held = await jobs.enqueue(waits)
        await asyncio.wait_for(started.wait(), 30)  # claimed from 'jobs' before the cancel
        with under_key(sharding), SetWorkflowID("quick"):
            assert await quick() == 1
        await dbos.cancel_workflow("held", shard_key=key)
        await dbos.resume_workflow("held", shard_key=key)
        release.set()
        assert await held.get_result() == "done"
        fork = await dbos.fork_workflow("quick", 1, shard_key=key)
        assert await fork.get_result() == 1
        rewound = await dbos.rewind_workflow("quick", 0, shard_key=key)
        assert await rewound.get_result() == 1
        await dbos.delete_workflow(fork.workflow_id, shard_key=key)

        seen = await fetch(database_url, "SELECT operation, timeout FROM settings_seen "
                           "WHERE operation <> 'other'")
        by_operation: dict[str, set[str]] = {}
        for row in seen:
            by_operation.setdefault(row["operation"], set()).add(row["timeout"])
        assert set(by_operation) == {"cancel", "resume", "fork", "rewind", "delete", "claim"}
        for operation, timeouts in by_operation.items():
            assert timeouts == {"7500ms"}, operation


async def test_a_stalled_lock_holder_loses_its_session_and_its_locks(database_url: str) -> None:
    """A transaction that stalls holding a workflow's row lock is ended by PostgreSQL, so a
    cancel waiting for that lock goes through."""
    dbos = new_dbos(database_url, idle_transaction_timeout=0.2)
    release = asyncio.Event()

    @dbos.workflow(name="waits")
    async def waits() -> None:
        await release.wait()

    async with dbos:
        with SetWorkflowID("locked"):
            handle = await dbos.start_workflow(waits)
        locked = asyncio.Event()

        async def stall() -> None:
            async with dbos._system_database.locking_transaction() as conn:
                await conn.execute("SELECT 1 FROM dbos.workflow_status "
                                   "WHERE workflow_uuid = 'locked' FOR UPDATE")
                locked.set()
                await asyncio.Event().wait()  # a caller that froze mid-transaction

        holder = asyncio.create_task(stall())
        await asyncio.wait_for(locked.wait(), 30)
        async with DBOSClient(system_database_url=database_url) as client:
            # Blocks on the row lock until the server ends the stalled session.
            await asyncio.wait_for(client.cancel_workflow("locked"), 60)
        holder.cancel()
        with contextlib.suppress(asyncio.CancelledError, asyncpg.PostgresError,
                                 asyncpg.InterfaceError):
            await holder
        status = await dbos.get_workflow_status(handle.workflow_id)
        assert status is not None and status.status == "CANCELLED"
        release.set()


# ---- statement_timeout on observability reads ----


@contextlib.asynccontextmanager
async def tables_locked(url: str, *tables: str) -> AsyncIterator[None]:
    """Hold ACCESS EXCLUSIVE locks on these tables: any read of them waits until released."""
    conn = await asyncpg.connect(url)
    try:
        async with conn.transaction():
            for table in tables:
                await conn.execute(f"LOCK TABLE dbos.{table} IN ACCESS EXCLUSIVE MODE")
            yield
    finally:
        await conn.close()


@SHARDING
async def test_observability_reads_stop_at_their_timeout(database_url: str,
                                                         sharding: bool) -> None:
    dbos = new_dbos(database_url, sharding=sharding, observability_query_timeout=0.05)

    @dbos.workflow(name="noop")
    async def noop() -> int:
        return 1

    async with dbos:
        with under_key(sharding), SetWorkflowID("listed"):
            assert await noop() == 1
        key = key_of(sharding)
        async with tables_locked(database_url, "workflow_status", "operation_outputs"):
            # Bounded here too, so a read left uncapped fails the test instead of hanging it.
            with pytest.raises(QueryTimeoutError, match="observability_query_timeout") as caught:
                await asyncio.wait_for(dbos.list_workflows(), 30)
            assert caught.value.timeout_seconds == 0.05
            assert "listing workflows" in str(caught.value).lower()
            for read in (dbos.list_queued_workflows(),
                         dbos.list_workflow_steps("listed", shard_key=key),
                         dbos.queue_depths()):
                with pytest.raises(QueryTimeoutError, match="observability_query_timeout"):
                    await asyncio.wait_for(read, 30)
        # Once the tables are free, the same reads work again.
        assert [s.workflow_id for s in await dbos.list_workflows()] == ["listed"]
        assert len(await dbos.list_workflow_steps("listed", shard_key=key)) == 0


async def test_the_client_reads_with_its_own_timeout(database_url: str) -> None:
    async with new_dbos(database_url):
        pass
    async with DBOSClient(system_database_url=database_url,
                          observability_query_timeout=0.05) as client:
        async with tables_locked(database_url, "workflow_status"):
            with pytest.raises(QueryTimeoutError, match="observability_query_timeout"):
                await asyncio.wait_for(client.list_workflows(), 30)
        assert await client.list_workflows() == []


async def test_the_timeouts_are_validated() -> None:
    for setting in ("idle_transaction_timeout", "observability_query_timeout"):
        with pytest.raises(DBOSError, match=setting):
            DBOS(system_database_url="postgresql://localhost/x", **{setting: -1})
        with pytest.raises(DBOSError, match=setting):
            DBOS(system_database_url="postgresql://localhost/x", **{setting: 3_000_000})


# ---- grant_permissions: an application running as a least-privilege role ----


@contextlib.asynccontextmanager
async def login_role(url: str) -> AsyncIterator[tuple[str, str]]:
    """A fresh LOGIN role with no privileges of its own, and the URL connecting as it;
    dropped afterwards with everything granted to it in this database."""
    role = unique_name("app_role")
    await execute(url, f'CREATE ROLE "{role}" LOGIN')
    parts = urlsplit(url)
    role_url = urlunsplit(parts._replace(netloc=f"{role}@{parts.hostname}:{parts.port}"))
    try:
        yield role, role_url
    finally:
        await execute(url, f'DROP OWNED BY "{role}"; DROP ROLE "{role}"')


@SHARDING
async def test_an_executor_runs_as_a_granted_least_privilege_role(
        database_url: str, sharding: bool) -> None:
    async with new_dbos(database_url, sharding=sharding, application_version="v1") as owner, \
            login_role(database_url) as (role, role_url):
        # Without the grant the role cannot even read the schema.
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await fetch(role_url, "SELECT 1 FROM dbos.workflow_status")
        await owner.grant_permissions(role)

        app = new_dbos(role_url, sharding=sharding, application_version="v1",
                       executor_id="least-privilege")
        jobs = app.queue("jobs", concurrency=2)

        @app.step(name="double")
        async def double(x: int) -> int:
            return 2 * x

        @app.workflow(name="work")
        async def work(x: int) -> int:
            await app.set_event("seen", x)
            return await double(x)

        async with app:
            with under_key(sharding):
                assert await work(2) == 4
                handle = await jobs.enqueue(work, 5)
            assert await handle.get_result() == 10
            assert {s.status for s in await app.list_workflows()} == {"SUCCESS"}
            await app.cancel_workflow(handle.workflow_id, shard_key=key_of(sharding))

        for statement in ("DROP TABLE dbos.workflow_status",
                          "ALTER TABLE dbos.workflow_status ADD COLUMN x int",
                          "DROP SCHEMA dbos CASCADE"):
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                await execute(role_url, statement)
        assert await fetch(database_url, "SELECT 1 FROM dbos.workflow_status LIMIT 1")


async def test_a_role_that_cannot_add_the_enqueue_trigger_starts_without_it(
        database_url: str, caplog: pytest.LogCaptureFixture) -> None:
    """On a schema without the enqueue trigger (as the dbos package makes it), a
    least-privilege role's executor cannot add it: it says so and starts, and its own
    enqueues wake its claim loops by themselves."""
    async with new_dbos(database_url) as owner, login_role(database_url) as (role, role_url):
        await owner.grant_permissions(role)
        await execute(database_url,
                      "DROP TRIGGER dbos_async_enqueue_trigger ON dbos.workflow_status")
        app = new_dbos(role_url, executor_id="least-privilege")
        jobs = app.queue("jobs")

        @app.workflow(name="work")
        async def work(x: int) -> int:
            return 2 * x

        with caplog.at_level("WARNING", logger="dbos_async._sysdb.migrations"):
            async with app:
                assert not app._system_database.enqueue_trigger
                handle = await jobs.enqueue(work, 5)
                assert await asyncio.wait_for(handle.get_result(), 30) == 10
    assert any("Could not add dbos_async's enqueue trigger" in r.getMessage()
               for r in caplog.records)
    assert not await fetch(database_url, "SELECT 1 FROM pg_trigger "
                                         "WHERE tgname = 'dbos_async_enqueue_trigger'")


async def test_a_role_that_cannot_add_the_depth_samples_table_starts_without_it(
        database_url: str, caplog: pytest.LogCaptureFixture) -> None:
    """On a schema without the depth samples table, a least-privilege role's executor
    cannot add it: it says so and starts, samples nothing, and its queues' depth history
    is worked back."""
    async with new_dbos(database_url) as owner, login_role(database_url) as (role, role_url):
        await owner.grant_permissions(role)
        await execute(database_url, "DROP TABLE dbos.dbos_async_depth_samples")
        app = new_dbos(role_url, executor_id="least-privilege")
        jobs = app.queue("jobs")

        @app.workflow(name="work")
        async def work(x: int) -> int:
            return 2 * x

        with caplog.at_level("WARNING", logger="dbos_async._sysdb.migrations"):
            async with app:
                assert not app._system_database.depth_samples_table
                handle = await jobs.enqueue(work, 5)
                assert await asyncio.wait_for(handle.get_result(), 30) == 10
                history = await app.get_queue_depth_history(minutes=2)
                assert [(d.waiting, d.measured) for d in history
                        if d.queue_name == "jobs"] == [(0, False), (0, True)]
    assert any("Could not add dbos_async's queue depth samples table" in r.getMessage()
               for r in caplog.records)
    assert not await fetch(database_url, "SELECT 1 FROM pg_class "
                                         "WHERE relname = 'dbos_async_depth_samples'")


async def test_grant_refuses_unknown_and_invalid_roles(database_url: str) -> None:
    async with new_dbos(database_url) as owner, login_role(database_url) as (role, role_url):
        with pytest.raises(DBOSError, match="does not exist"):
            await owner.grant_permissions(unique_name("nobody"))
        for bad in ("", "x" * 64, "a\x00b"):
            with pytest.raises(DBOSError, match="Invalid role name"):
                await owner.grant_permissions(bad)
        # Nothing was granted by the refused calls; a client can grant too.
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await fetch(role_url, "SELECT 1 FROM dbos.workflow_status")
        async with DBOSClient(system_database_url=database_url) as client:
            await client.grant_permissions(role)
        assert await fetch(role_url, "SELECT 1 FROM dbos.workflow_status") == []


async def test_the_cli_grants_a_role(database_url: str) -> None:
    async with new_dbos(database_url), login_role(database_url) as (role, role_url):
        out = ok(await cli("grant", role, "--url", database_url))
        assert role in out
        assert await fetch(role_url, "SELECT 1 FROM dbos.workflow_status") == []
        message = failed(await cli("grant", unique_name("nobody"), "--url", database_url))
        assert "does not exist" in message
