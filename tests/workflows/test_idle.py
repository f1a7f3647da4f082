"""What an idle executor costs, and that backing off loses no wake-up.

The statement count is the server's own: a throwaway cluster with pg_stat_statements, whose
``calls`` on the test's database count every statement of every connection of the executor
(pool, notification listener, executor-ID lock). The other tests wait on recorded state and
results, with a patience shorter than the backed-off poll interval, so that they can pass
only through a wake-up, never through a poll.
"""

from __future__ import annotations

import asyncio
import math
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import asyncpg
import pytest
from helpers import fetchval, new_dbos, pool_statements, unique_name, wait_until

from dbos_async import DBOSClient, SetEnqueueOptions, SetWorkflowID, WorkflowCancelledError
from dbos_async.testing import PgServer, with_database
from dbos_async.testing.servers import _run_as_user, find_bindir, start_local_cluster

IDLE_WINDOW = 30.0
"""Seconds of idleness whose statements are counted."""
BUDGET_PER_SECONDS = 5.0
"""At most one statement per this many seconds, across the whole idle executor."""
LONG_CAP = 3600.0
PATIENCE = 20.0
"""Less than the interval the polls have backed off to (32 s and more) in the wake-up
test: what is picked up within it was woken, not polled for."""


@pytest.fixture(scope="module")
def stats_server() -> Iterator[PgServer]:
    """A throwaway cluster that loads pg_stat_statements."""
    bindir = find_bindir()
    if bindir is None:
        pytest.skip("no PostgreSQL binaries (initdb, pg_ctl) on this machine")
    server = start_local_cluster(bindir, _run_as_user(),
                                 ["shared_preload_libraries=pg_stat_statements"])
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
async def stats_url(stats_server: PgServer) -> AsyncIterator[str]:
    """A fresh database on that cluster, with the pg_stat_statements view."""
    name = unique_name("idle")
    admin = await asyncpg.connect(stats_server.url)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    url = with_database(stats_server.url, name)
    await fetchval(url, "CREATE EXTENSION pg_stat_statements")
    yield url
    admin = await asyncpg.connect(stats_server.url)
    try:
        await admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
    finally:
        await admin.close()


# The counting statements name the view; they are left out of the counts.
_CALLS_SQL = """SELECT query, calls FROM pg_stat_statements s
                JOIN pg_database d ON d.oid = s.dbid
                WHERE d.datname = current_database()
                  AND query NOT LIKE '%pg_stat_statements%'"""


async def statement_calls(conn: asyncpg.Connection) -> dict[str, int]:
    return {row["query"]: row["calls"] for row in await conn.fetch(_CALLS_SQL)}


async def test_an_idle_executor_sends_at_most_one_statement_every_five_seconds(
        stats_url: str) -> None:
    """Default settings, a declared (empty) queue besides DBOS's internal one: once the
    polls have backed off, a window sees at most one statement per 5 s (and one more for
    the window's edges) from the listener, the lock, the pool, all together."""
    dbos = new_dbos(stats_url)
    dbos.queue("idle_jobs")

    @dbos.workflow()
    async def job() -> int:
        return 1

    conn = await asyncpg.connect(stats_url)
    try:
        async with dbos:
            runtime = dbos._current_runtime

            async def backed_off() -> bool:
                polls = (runtime.queue_poll, runtime.failover_poll)
                return all(poll is not None and poll.backed_off for poll in polls)

            await wait_until(backed_off, patience=120, what="the polls to back off")
            before = await statement_calls(conn)
            await asyncio.sleep(IDLE_WINDOW)  # the measured window, not a synchronisation
            after = await statement_calls(conn)
    finally:
        await conn.close()
    sent = {query: calls - before.get(query, 0) for query, calls in after.items()
            if calls > before.get(query, 0)}
    budget = math.ceil(IDLE_WINDOW / BUDGET_PER_SECONDS) + 1
    assert sum(sent.values()) <= budget, sent


async def test_wake_ups_reach_a_backed_off_executor(database_url: str) -> None:
    """With every poll backed off beyond the patience: another executor starting work
    (its failover scans), a cancel and an enqueue by a client (another process's
    notifications), an enqueue here (an in-process wake-up) and a DELAYED workflow coming
    due are each acted upon."""
    dbos = new_dbos(database_url, idle_poll_max_interval=LONG_CAP, failover_after=2.0)
    queue = dbos.queue("jobs", polling_interval=1.0)
    step_started = asyncio.Event()

    @dbos.step()
    async def long_step() -> None:
        step_started.set()
        await asyncio.sleep(3600)

    @dbos.workflow(name="long")
    async def long() -> None:
        await long_step()

    @dbos.workflow(name="job")
    async def job(x: int) -> int:
        return x + 1

    peer = new_dbos(database_url, executor_id="peer")

    @peer.workflow(name="peer_job")
    async def peer_job() -> str:
        return "peer"

    async with dbos, DBOSClient(system_database_url=database_url) as client:
        runtime = dbos._current_runtime
        with SetWorkflowID("long-1"):
            running = await dbos.start_workflow(long)
        await asyncio.wait_for(step_started.wait(), PATIENCE)
        # Due a little after the polls have backed off (1 + 2 + 4 + 8 + 16 s).
        with SetEnqueueOptions(delay=40.0):
            delayed = await queue.enqueue(job, 0)

        async def backed_off() -> bool:
            polls = (runtime.queue_poll, runtime.cancellation.backoff, runtime.failover_poll)
            return all(poll is not None and poll.interval > PATIENCE for poll in polls)

        await wait_until(backed_off, patience=120, what="the polls to back off")
        scans = runtime.failover_scans
        async with peer:
            assert await peer_job() == "peer"

            async def scanned() -> bool:
                return runtime.failover_scans > scans

            await wait_until(scanned, patience=PATIENCE, what="a failover scan")
        await client.cancel_workflow("long-1")
        with pytest.raises(WorkflowCancelledError):
            await asyncio.wait_for(running.get_result(), PATIENCE)
        remote = await client.enqueue("jobs", "job", 1)
        assert await asyncio.wait_for(remote.get_result(), PATIENCE) == 2
        local = await queue.enqueue(job, 2)
        assert await asyncio.wait_for(local.get_result(), PATIENCE) == 3
        assert await asyncio.wait_for(delayed.get_result(), 120) == 1


async def test_a_writer_that_does_not_notify_is_picked_up_after_the_backoff(
        database_url: str) -> None:
    """A workflow enqueued by plain SQL with no notification at all (the writer's session
    fires no trigger, as where the enqueue trigger is missing) while the queue watcher has
    backed off to its cap is found by its next poll, and runs."""
    dbos = new_dbos(database_url, idle_poll_max_interval=1.0)
    dbos.queue("raw", polling_interval=0.1)

    @dbos.workflow(name="raw_job")
    async def raw_job(x: Any) -> str:
        return f"ran {x}"

    async with dbos:
        poll = dbos._current_runtime.queue_poll
        assert poll is not None

        async def backed_off() -> bool:
            return poll.backed_off

        await wait_until(backed_off, what="the queue watcher to back off")
        workflow_id = str(uuid.uuid4())
        conn = await asyncpg.connect(database_url)
        try:
            # Triggers off for this session (a superuser's setting): no NOTIFY at all.
            await conn.execute("SET session_replication_role = replica")
            await conn.fetchval("SELECT dbos.enqueue_workflow($1, $2, ARRAY['7'::json], "
                                "workflow_id => $3)", "raw_job", "raw", workflow_id)
        finally:
            await conn.close()
        handle = await dbos.retrieve_workflow(workflow_id)
        assert await asyncio.wait_for(handle.get_result(), PATIENCE) == "ran 7"


SHORT_PATIENCE = 5.0
"""Less than the interval the queue watcher has backed off to (6.4 s and more) in the
raw-insert test: what starts within it was woken by the insert's commit, not polled for."""


async def test_a_raw_insert_wakes_a_backed_off_executor_at_its_commit(
        database_url: str) -> None:
    """A workflow inserted ENQUEUED by plain SQL through asyncpg (the rows the dbos
    package's client writes; the writer sends no notification) while the queue watcher
    waits longer than the patience is started within it: the enqueue trigger announces
    the row at the commit. So does a client's enqueue, which sends no NOTIFY of its own."""
    dbos = new_dbos(database_url, idle_poll_max_interval=LONG_CAP)
    dbos.queue("raw", polling_interval=0.1)

    @dbos.workflow(name="raw_job")
    async def raw_job(x: Any) -> str:
        return f"ran {x}"

    async with dbos:
        poll = dbos._current_runtime.queue_poll
        assert poll is not None

        async def backed_off() -> bool:
            return poll.interval > SHORT_PATIENCE

        await wait_until(backed_off, what="the queue watcher to back off")
        workflow_id = str(uuid.uuid4())
        conn = await asyncpg.connect(database_url)
        try:
            async with conn.transaction():
                await conn.execute(
                    """INSERT INTO dbos.workflow_status (workflow_uuid, status, name,
                           queue_name, created_at, updated_at, recovery_attempts, owner_xid,
                           serialization)
                       VALUES ($1, 'ENQUEUED', 'raw_job', 'raw', $2, $2, 0, $3,
                               'portable_json')""",
                    workflow_id, int(time.time() * 1000), str(uuid.uuid4()))
                await conn.execute(
                    "INSERT INTO dbos.workflow_input (workflow_uuid, inputs) VALUES ($1, $2)",
                    workflow_id, '{"positionalArgs": [7], "namedArgs": {}}')
        finally:
            await conn.close()
        handle = await dbos.retrieve_workflow(workflow_id)
        assert await asyncio.wait_for(handle.get_result(), SHORT_PATIENCE) == "ran 7"

        async with DBOSClient(system_database_url=database_url) as client:
            await wait_until(backed_off, what="the queue watcher to back off again")
            async with pool_statements(client) as sent:
                enqueued = await client.enqueue("raw", "raw_job", 8)
                notifications = client._peer().system_database.notifications
                assert notifications is not None
                await notifications.flush()  # whatever the notifier still holds, sent now
            assert await asyncio.wait_for(enqueued.get_result(), SHORT_PATIENCE) == "ran 8"
        notifies = [(text, args) for text, args in sent
                    if "pg_notify" in text and "dbos_enqueue_channel" in repr(args)]
        assert not notifies, notifies


async def test_an_update_back_to_enqueued_wakes_a_backed_off_executor_at_its_commit(
        database_url: str) -> None:
    """A workflow moved back to ENQUEUED by a plain UPDATE (as the dbos package resumes a
    cancelled workflow; the writer sends no notification) while the queue watcher waits
    longer than the patience is started within it: the update trigger announces it."""
    dbos = new_dbos(database_url, idle_poll_max_interval=LONG_CAP)
    dbos.queue("raw", polling_interval=0.1)

    @dbos.workflow(name="raw_job")
    async def raw_job(x: Any) -> str:
        return f"ran {x}"

    async with dbos:
        poll = dbos._current_runtime.queue_poll
        assert poll is not None

        async def backed_off() -> bool:
            return poll.interval > SHORT_PATIENCE

        workflow_id = str(uuid.uuid4())
        conn = await asyncpg.connect(database_url)
        try:
            async with conn.transaction():
                await conn.execute(
                    """INSERT INTO dbos.workflow_status (workflow_uuid, status, name,
                           queue_name, created_at, updated_at, recovery_attempts,
                           serialization)
                       VALUES ($1, 'CANCELLED', 'raw_job', 'raw', $2, $2, 0,
                               'portable_json')""",
                    workflow_id, int(time.time() * 1000))
                await conn.execute(
                    "INSERT INTO dbos.workflow_input (workflow_uuid, inputs) VALUES ($1, $2)",
                    workflow_id, '{"positionalArgs": [9], "namedArgs": {}}')
            await wait_until(backed_off, what="the queue watcher to back off")
            await conn.execute("UPDATE dbos.workflow_status SET status = 'ENQUEUED' "
                               "WHERE workflow_uuid = $1", workflow_id)
        finally:
            await conn.close()
        handle = await dbos.retrieve_workflow(workflow_id)
        assert await asyncio.wait_for(handle.get_result(), SHORT_PATIENCE) == "ran 9"
