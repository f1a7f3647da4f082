"""Transactions (``@dbos.transaction()``): the user's SQL and its checkpoint commit
together, on the system database and on application databases, against a real PostgreSQL.

Recovery inside one process is simulated as in test_workflows.py: an instance exits with
``shutdown_grace_period=0`` while a workflow waits, leaving it PENDING, and a second one
with the same executor ID recovers it. Real process kills, zombies and races between
processes are in test_transactions_processes.py.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg
import pytest
from helpers import (
    execute,
    fetch,
    fetchval,
    new_dbos,
    pool_statements,
    step_rows,
    take_executor_id_away,
    wait_until,
    workflow_row,
)
from helpers.cluster import Cluster

from dbos_async import (
    DBOS,
    ConfigurationError,
    DatabaseUnavailableError,
    DBOSClient,
    DBOSError,
    SetWorkflowID,
    SetWorkflowTimeout,
    TransactionError,
    WorkflowCancelledError,
    transaction_connection,
)
from tests.integrations.test_cli import cli, failed, ok

ORDERS = "CREATE TABLE IF NOT EXISTS orders (id text PRIMARY KEY, amount int NOT NULL)"


async def _orders(url: str) -> list[tuple[str, int]]:
    return [(r["id"], r["amount"]) for r in await fetch(url, "SELECT * FROM orders ORDER BY id")]


@pytest.fixture
async def app_url(create_database: Callable[[], Awaitable[str]]) -> str:
    url = await create_database()
    await execute(url, ORDERS)
    return url


def _ordering(dbos: DBOS, data_source: str | None,
              suffix: str = "") -> tuple[Any, Any, dict[str, int]]:
    """A workflow whose transaction inserts an order, and the count of the transaction's
    runs (bodies that reached the end, committed or not)."""
    runs = {"n": 0}

    @dbos.transaction(data_source=data_source, name=f"insert_order{suffix}")
    async def insert_order(order_id: str, amount: int) -> int:
        conn = transaction_connection()
        await conn.execute("INSERT INTO orders VALUES ($1, $2)", order_id, amount)
        runs["n"] += 1
        return int(await conn.fetchval("SELECT count(*) FROM orders"))

    @dbos.workflow(name=f"place{suffix}")
    async def place(order_id: str, amount: int) -> int:
        return await insert_order(order_id, amount)

    return insert_order, place, runs


@pytest.mark.parametrize("on", ["system", "application"])
async def test_transaction_commits_once_and_replays(database_url: str, app_url: str,
                                                    on: str) -> None:
    url = database_url if on == "system" else app_url
    if on == "system":
        await execute(database_url, ORDERS)
    dbos = new_dbos(database_url)
    source = None if on == "system" else "shop"
    if source:
        dbos.data_source("shop", app_url)
    _, place, runs = _ordering(dbos, source)
    async with dbos:
        with SetWorkflowID("wf-1"):
            assert await place("o1", 10) == 1
        # The same ID again: the recorded result, no second run.
        with SetWorkflowID("wf-1"):
            assert await place("o1", 10) == 1
    assert runs["n"] == 1
    assert await _orders(url) == [("o1", 10)]
    steps = await step_rows(database_url, "wf-1")
    assert [s.function_name for s in steps] == ["insert_order"]
    if source:
        rows = await fetch(app_url, "SELECT workflow_id, step_id, output, error, serialization"
                                    " FROM dbos.datasource_outputs")
        assert [(r["workflow_id"], r["step_id"], r["error"]) for r in rows] == [("wf-1", 0, None)]
        assert rows[0]["output"] == "1" and rows[0]["serialization"] == "portable_json"


async def test_recovered_workflow_replays_the_transaction(database_url: str,
                                                          app_url: str) -> None:
    """A workflow interrupted after its transaction replays it on recovery: no SQL runs."""
    gate = asyncio.Event()
    runs = {"n": 0}

    def register(dbos: DBOS) -> Any:
        dbos.data_source("shop", app_url)

        @dbos.transaction(data_source="shop", name="insert")
        async def insert(order_id: str) -> int:
            runs["n"] += 1
            await transaction_connection().execute("INSERT INTO orders VALUES ($1, 1)",
                                                   order_id)
            return runs["n"]

        @dbos.step(name="wait")
        async def wait() -> None:
            await gate.wait()

        @dbos.workflow(name="place_then_wait")
        async def place_then_wait(order_id: str) -> int:
            count = await insert(order_id)
            await wait()
            return count

        return place_then_wait

    first = new_dbos(database_url, shutdown_grace_period=0)
    workflow = register(first)
    async with first:
        with SetWorkflowID("wf-r"):
            await first.start_workflow(workflow, "o1")
        await wait_until(lambda: _step_count(database_url, "wf-r", 1))
    second = new_dbos(database_url)
    register(second)
    gate.set()
    async with second:
        assert await (await second.retrieve_workflow("wf-r")).get_result() == 1
    assert runs["n"] == 1
    assert await _orders(app_url) == [("o1", 1)]


async def _step_count(url: str, workflow_id: str, count: int) -> bool:
    return len(await step_rows(url, workflow_id)) >= count


@pytest.mark.parametrize("on", ["system", "application"])
async def test_sql_error_is_recorded_with_its_sqlstate(database_url: str, app_url: str,
                                                       on: str) -> None:
    if on == "system":
        await execute(database_url, ORDERS)
    url = database_url if on == "system" else app_url
    await execute(url, "INSERT INTO orders VALUES ('taken', 1)")
    dbos = new_dbos(database_url)
    source = None if on == "system" else "shop"
    if source:
        dbos.data_source("shop", app_url)
    _, place, runs = _ordering(dbos, source)
    async with dbos:
        for _ in range(2):  # the first run, then the recorded failure
            with SetWorkflowID("wf-e"), pytest.raises(TransactionError) as raised:
                await place("taken", 5)
            assert raised.value.sqlstate == "23505"
            assert "duplicate key" in str(raised.value)
    assert runs["n"] == 0
    steps = await step_rows(database_url, "wf-e")
    assert len(steps) == 1 and steps[0].error is not None
    assert await _orders(url) == [("taken", 1)]


@pytest.mark.parametrize("on", ["system", "application"])
async def test_serialization_failure_is_retried_in_a_new_transaction(
        database_url: str, app_url: str, on: str) -> None:
    """A concurrent update of a row this SERIALIZABLE transaction read fails it (40001);
    the transaction runs again, new, and commits."""
    url = database_url if on == "system" else app_url
    await execute(url, "CREATE TABLE IF NOT EXISTS counter (n int)")
    await execute(url, "INSERT INTO counter VALUES (0)")
    dbos = new_dbos(database_url)
    source = None if on == "system" else "shop"
    if source:
        dbos.data_source("shop", app_url)
    attempts = {"n": 0}

    @dbos.transaction(data_source=source)
    async def increment() -> int:
        conn = transaction_connection()
        attempts["n"] += 1
        seen = await conn.fetchval("SELECT n FROM counter")
        if attempts["n"] == 1:  # another writer commits in between, once
            await execute(url, "UPDATE counter SET n = n + 100")
        await conn.execute("UPDATE counter SET n = $1", seen + 1)
        return int(seen) + 1

    @dbos.workflow()
    async def count() -> int:
        return await increment()

    async with dbos:
        assert await count() == 101
    assert attempts["n"] == 2
    assert await fetchval(url, "SELECT n FROM counter") == 101


@pytest.mark.parametrize("on", ["system", "application"])
async def test_a_deadlock_is_retried_in_a_new_transaction(
        database_url: str, app_url: str, on: str, caplog: pytest.LogCaptureFixture) -> None:
    """The transaction updates row a; the test's own transaction, holding row b, then waits
    for a; the transaction goes for b: a deadlock, which the server breaks by failing the
    transaction (its deadlock_timeout is the shorter). It runs again, new, and commits, with
    the retry logged as a step's."""
    caplog.set_level(logging.WARNING, logger="dbos_async")
    url = database_url if on == "system" else app_url
    await execute(url, "CREATE TABLE pair (k text PRIMARY KEY, n int NOT NULL);"
                       "INSERT INTO pair VALUES ('a', 0), ('b', 0)")
    dbos = new_dbos(database_url)
    source = None if on == "system" else "shop"
    if source:
        dbos.data_source("shop", app_url)
    holder = await asyncpg.connect(url)
    await holder.execute("BEGIN; UPDATE pair SET n = n + 10 WHERE k = 'b'")
    attempts = {"n": 0}
    holder_done: list[asyncio.Task[None]] = []

    async def holder_takes_a() -> None:
        await holder.execute("UPDATE pair SET n = n + 10 WHERE k = 'a'")  # after the victim
        await holder.execute("COMMIT")

    @dbos.transaction(data_source=source, name="both", isolation="READ COMMITTED")
    async def both() -> int:
        conn = transaction_connection()
        attempts["n"] += 1
        if attempts["n"] == 1:  # this side detects the deadlock first, and is failed
            await conn.execute("SET LOCAL deadlock_timeout = '10ms'")
        await conn.execute("UPDATE pair SET n = n + 1 WHERE k = 'a'")
        if attempts["n"] == 1:
            holder_done.append(asyncio.create_task(holder_takes_a()))
            await wait_until(lambda: _lock_waiters(url), what="the holder to wait for a")
        await conn.execute("UPDATE pair SET n = n + 1 WHERE k = 'b'")
        return attempts["n"]

    @dbos.workflow()
    async def pairing() -> int:
        return await both()

    try:
        async with dbos:
            with SetWorkflowID("wf-d"):
                assert await pairing() == 2
            await holder_done[0]
    finally:
        await holder.close()
    assert attempts["n"] == 2
    rows = await fetch(url, "SELECT k, n FROM pair ORDER BY k")
    assert [tuple(r) for r in rows] == [("a", 11), ("b", 11)]
    retried = [r.getMessage() for r in caplog.records if "retrying" in r.getMessage()]
    assert len(retried) == 1
    assert "Step both of workflow wf-d failed (attempt 1 of 11)" in retried[0]
    assert "40P01" in retried[0]


@pytest.mark.parametrize("on", ["system", "application"])
async def test_conflicts_past_max_retries_are_raised_and_recorded(
        database_url: str, app_url: str, on: str) -> None:
    """Another writer updates the row this SERIALIZABLE transaction read, every time: after
    ``max_retries`` retries the serialization failure is raised as a TransactionError, and
    recorded, so the workflow run again raises it without running the SQL."""
    url = database_url if on == "system" else app_url
    await execute(url, "CREATE TABLE counter (n int); INSERT INTO counter VALUES (0)")
    dbos = new_dbos(database_url)
    source = None if on == "system" else "shop"
    if source:
        dbos.data_source("shop", app_url)
    attempts = {"n": 0}

    @dbos.transaction(data_source=source, name="contended", max_retries=2)
    async def contended() -> int:
        conn = transaction_connection()
        attempts["n"] += 1
        seen = await conn.fetchval("SELECT n FROM counter")
        await execute(url, "UPDATE counter SET n = n + 100")  # another writer commits
        await conn.execute("UPDATE counter SET n = $1", seen + 1)
        return int(seen) + 1

    @dbos.workflow()
    async def count() -> int:
        return await contended()

    async with dbos:
        for _ in range(2):  # the run, then the recorded failure
            with SetWorkflowID("wf-m"), pytest.raises(TransactionError) as raised:
                await count()
            assert raised.value.sqlstate == "40001"
            assert "could not serialize access" in str(raised.value)
    assert attempts["n"] == 3  # the first and max_retries more, none on replay
    assert await fetchval(url, "SELECT n FROM counter") == 300  # the other writer's only
    steps = await step_rows(database_url, "wf-m")
    assert [(s.function_name, s.error is not None) for s in steps] == [("contended", True)]
    if source:
        assert await fetchval(app_url, "SELECT count(*) FROM dbos.datasource_outputs") == 0


@pytest.mark.parametrize("isolation", ["READ COMMITTED", "REPEATABLE READ", "SERIALIZABLE"])
async def test_isolation_level_and_read_only(database_url: str, app_url: str,
                                             isolation: str) -> None:
    dbos = new_dbos(database_url)
    dbos.data_source("shop", app_url)

    @dbos.transaction(data_source="shop", isolation=isolation, read_only=True)  # type: ignore[arg-type]
    async def settings() -> list[str]:
        conn = transaction_connection()
        return [await conn.fetchval("SHOW transaction_isolation"),
                await conn.fetchval("SHOW transaction_read_only")]

    @dbos.transaction(data_source="shop", read_only=True)
    async def write() -> None:
        await transaction_connection().execute("INSERT INTO orders VALUES ('x', 1)")

    @dbos.workflow()
    async def check() -> list[str]:
        return await settings()

    @dbos.workflow()
    async def try_write() -> None:
        await write()

    async with dbos:
        assert await check() == [isolation.lower(), "on"]
        with pytest.raises(TransactionError) as raised:
            await try_write()
        assert raised.value.sqlstate == "25006"  # read_only_sql_transaction
    assert await _orders(app_url) == []


async def test_outside_a_workflow_it_is_a_plain_transaction(database_url: str,
                                                            app_url: str) -> None:
    dbos = new_dbos(database_url)
    dbos.data_source("shop", app_url)
    insert_order, _, runs = _ordering(dbos, "shop")
    async with dbos:
        assert await insert_order("o1", 3) == 1
        assert await insert_order("o2", 4) == 2  # not a replay: it runs each time
        with pytest.raises(TransactionError) as raised:
            await insert_order("o1", 5)
        assert raised.value.sqlstate == "23505"
    assert runs["n"] == 2
    assert await fetchval(app_url, "SELECT count(*) FROM dbos.datasource_outputs") == 0


async def test_clear_errors(database_url: str, app_url: str) -> None:
    with pytest.raises(DBOSError, match="only available inside"):
        transaction_connection()
    dbos = new_dbos(database_url)
    dbos.data_source("shop", app_url)
    with pytest.raises(DBOSError, match="isolation must be one of"):
        dbos.transaction(isolation="CHAOS")(_noop)  # type: ignore[arg-type]
    with pytest.raises(DBOSError, match="already registered"):
        dbos.data_source("shop", app_url)
    with pytest.raises(ConfigurationError, match="Data source 'bad': the URL"):
        dbos.data_source("bad", "postgresql://host:notaport/db")

    @dbos.transaction(data_source="shop")
    async def inner() -> None:
        pass

    @dbos.transaction(data_source="shop")
    async def outer() -> None:
        await inner()

    @dbos.workflow()
    async def nested() -> None:
        await outer()

    async with dbos:
        with pytest.raises(DBOSError, match="do not nest"):
            await nested()
        with pytest.raises(DBOSError, match="Register data sources before entering"):
            dbos.data_source("other", app_url)

    unknown = new_dbos(database_url)

    @unknown.transaction(data_source="nowhere")
    async def lost() -> None:
        pass

    with pytest.raises(ConfigurationError, match="'nowhere', which is not registered"):
        async with unknown:
            pass


async def _noop() -> None:
    pass


@pytest.mark.parametrize("how", ["cancel", "deadline"])
@pytest.mark.parametrize("on", ["system", "application"])
async def test_cancel_reaches_a_transaction_waiting_on_a_lock(database_url: str,
                                                              app_url: str, on: str,
                                                              how: str) -> None:
    url = database_url if on == "system" else app_url
    if on == "system":
        await execute(database_url, ORDERS)
    await execute(url, "INSERT INTO orders VALUES ('o1', 1)")
    dbos = new_dbos(database_url)
    source = None if on == "system" else "shop"
    if source:
        dbos.data_source("shop", app_url)

    @dbos.transaction(data_source=source, isolation="READ COMMITTED")
    async def bump() -> None:
        await transaction_connection().execute("UPDATE orders SET amount = 99")

    @dbos.workflow()
    async def bumping() -> None:
        await bump()

    holder = await asyncpg.connect(url)
    try:
        async with holder.transaction():
            await holder.execute("SELECT * FROM orders FOR UPDATE")
            async with dbos:
                with SetWorkflowTimeout(1.0 if how == "deadline" else None):
                    handle = await dbos.start_workflow(bumping)
                await wait_until(lambda: _lock_waiters(url))
                if how == "cancel":
                    await dbos.cancel_workflow(handle.workflow_id)
                with pytest.raises(WorkflowCancelledError):
                    await handle.get_result()
                await wait_until(lambda: _no_lock_waiters(url))
    finally:
        await holder.close()
    assert await _orders(url) == [("o1", 1)]
    assert await step_rows(database_url, handle.workflow_id) == []


async def _lock_waiters(url: str) -> bool:
    return bool(await fetchval(url, "SELECT count(*) FROM pg_stat_activity WHERE "
                                    "wait_event_type = 'Lock' AND datname = current_database()"))


async def _no_lock_waiters(url: str) -> bool:
    return not await _lock_waiters(url)


async def test_rewind_and_delete_discard_application_outcomes(database_url: str,
                                                              app_url: str) -> None:
    dbos = new_dbos(database_url)
    dbos.data_source("shop", app_url)
    runs: list[str] = []

    @dbos.transaction(data_source="shop", name="record")
    async def record(label: str) -> str:
        runs.append(label)
        await transaction_connection().execute(
            "INSERT INTO orders VALUES ($1, 1) ON CONFLICT (id) DO UPDATE "
            "SET amount = orders.amount + 1", label)
        return label

    @dbos.workflow()
    async def two() -> list[str]:
        return [await record("a"), await record("b")]

    async with dbos:
        with SetWorkflowID("wf-w"):
            assert await two() == ["a", "b"]
        handle = await dbos.rewind_workflow("wf-w", 1)
        assert await handle.get_result() == ["a", "b"]
        # Step 0 replayed, step 1 ran again.
        assert runs == ["a", "b", "b"]
        assert await _orders(app_url) == [("a", 1), ("b", 2)]
        await dbos.delete_workflow("wf-w")
    assert await fetchval(app_url, "SELECT count(*) FROM dbos.datasource_outputs") == 0


@pytest.mark.parametrize("on", ["system", "application"])
async def test_a_fork_runs_the_transactions_from_its_cut_again(database_url: str,
                                                              app_url: str, on: str) -> None:
    """A fork from step 1 replays step 0 from the copy of its original's checkpoint and runs
    step 1's SQL again, under its own ID; the original's records stay as they were."""
    url = database_url if on == "system" else app_url
    if on == "system":
        await execute(database_url, ORDERS)
    dbos = new_dbos(database_url)
    source = None if on == "system" else "shop"
    if source:
        dbos.data_source("shop", app_url)
    runs: list[str] = []

    @dbos.transaction(data_source=source, name="record")
    async def record(label: str) -> str:
        runs.append(label)
        await transaction_connection().execute(
            "INSERT INTO orders VALUES ($1, 1) ON CONFLICT (id) DO UPDATE "
            "SET amount = orders.amount + 1", label)
        return label

    @dbos.workflow()
    async def two() -> list[str]:
        return [await record("a"), await record("b")]

    async with dbos:
        with SetWorkflowID("wf-o"):
            assert await two() == ["a", "b"]
        fork = await dbos.fork_workflow("wf-o", 1, new_workflow_id="wf-o-fork")
        assert await fork.get_result() == ["a", "b"]
        # Forked from the start: both run again.
        whole = await dbos.fork_workflow("wf-o", 0, new_workflow_id="wf-o-whole")
        assert await whole.get_result() == ["a", "b"]
    assert runs == ["a", "b", "b", "a", "b"]
    assert await _orders(url) == [("a", 2), ("b", 3)]
    for workflow_id in ("wf-o", "wf-o-fork", "wf-o-whole"):
        steps = await step_rows(database_url, workflow_id)
        assert [(s.function_name, s.output) for s in steps] == [
            ("record", "a"), ("record", "b")], workflow_id
    if source:
        rows = await fetch(app_url, "SELECT workflow_id, step_id FROM dbos.datasource_outputs"
                                    " ORDER BY 1, 2")
        assert [tuple(r) for r in rows] == [("wf-o", 0), ("wf-o", 1), ("wf-o-fork", 1),
                                            ("wf-o-whole", 0), ("wf-o-whole", 1)]


async def test_transactions_beside_group_committed_steps(database_url: str,
                                                         app_url: str) -> None:
    """Workflows at once, each an ordinary step, a transaction on each database and a
    read-only one: the steps' checkpoints share statements (group commit) while the
    transactions write theirs in their own transactions; every checkpoint lands once and
    every effect is there once."""
    await execute(database_url, ORDERS)
    count = 8
    dbos = new_dbos(database_url)
    dbos.data_source("shop", app_url, pool_size=count + 2)
    arrived = {"note": 0, "look": 0}
    everyone = {"note": asyncio.Event(), "look": asyncio.Event()}

    async def meet(where: str) -> None:
        """Wait until every workflow is here: they leave in one turn of the event loop."""
        arrived[where] += 1
        if arrived[where] == count:
            everyone[where].set()
        await everyone[where].wait()

    @dbos.step(name="note")
    async def note(i: int) -> int:
        await meet("note")
        return i

    @dbos.transaction(name="on_system", isolation="READ COMMITTED")
    async def on_system(i: int) -> None:
        await transaction_connection().execute("INSERT INTO orders VALUES ($1, $2)", f"s{i}", i)

    @dbos.transaction(data_source="shop", name="on_app", isolation="READ COMMITTED")
    async def on_app(i: int) -> None:
        await transaction_connection().execute("INSERT INTO orders VALUES ($1, $2)", f"a{i}", i)

    @dbos.transaction(data_source="shop", name="look", read_only=True)
    async def look(i: int) -> int:
        found = await transaction_connection().fetchval(
            "SELECT amount FROM orders WHERE id = $1", f"a{i}")
        await meet("look")
        return int(found)

    @dbos.workflow(name="mixed")
    async def mixed(i: int) -> int:
        await note(i)
        await on_system(i)
        await on_app(i)
        return await look(i)

    async with dbos, pool_statements(dbos) as logged:
        handles = []
        for i in range(count):
            with SetWorkflowID(f"mixed-{i}"):
                handles.append(await dbos.start_workflow(mixed, i))
        assert [await h.get_result() for h in handles] == list(range(count))
    batches = _batched_checkpoints(logged)
    assert any(len(rows) > 1 for rows in batches), "no checkpoints shared a statement"
    # Steps 1 and 2 write in their own transactions; the read-only one's (3) may be batched.
    assert [row for rows in batches for row in rows if row[1] in (1, 2)] == []
    for i in range(count):
        steps = await step_rows(database_url, f"mixed-{i}")
        assert [(s.function_name, s.output) for s in steps] == [
            ("note", i), ("on_system", None), ("on_app", None), ("look", i)]
    assert sorted(await _orders(database_url)) == sorted((f"s{i}", i) for i in range(count))
    assert sorted(await _orders(app_url)) == sorted((f"a{i}", i) for i in range(count))
    # The application database records its writing transaction, not the read-only one.
    rows = await fetch(app_url, "SELECT workflow_id, step_id FROM dbos.datasource_outputs")
    assert sorted(tuple(r) for r in rows) == sorted((f"mixed-{i}", 2) for i in range(count))


BATCH_MARK = "WITH ORDINALITY AS v(workflow_uuid, function_id"
"""Text of the batched checkpoint statement (one row per workflow in its arrays)."""


def _batched_checkpoints(logged: list[tuple[str, tuple[Any, ...]]]
                         ) -> list[list[tuple[str, int]]]:
    """The (workflow ID, step) rows of each batched checkpoint statement sent (the steps go
    as text, which the server casts)."""
    return [[(workflow_id, int(step)) for workflow_id, step in zip(args[0], args[1], strict=True)]
            for sql, args in logged if BATCH_MARK in sql]


async def test_a_client_with_the_data_source_covers_its_records(database_url: str,
                                                                app_url: str) -> None:
    """A client that registers the data source exports a workflow's records in it, and
    its rewind and delete discard them as an executor's do: the rewound transaction runs
    again."""
    dbos = new_dbos(database_url)
    dbos.data_source("shop", app_url)
    runs: list[str] = []

    @dbos.transaction(data_source="shop", name="record")
    async def record(label: str) -> str:
        runs.append(label)
        await transaction_connection().execute(
            "INSERT INTO orders VALUES ($1, 1) ON CONFLICT (id) DO UPDATE "
            "SET amount = orders.amount + 1", label)
        return label

    @dbos.workflow(name="two")
    async def two() -> list[str]:
        return [await record("a"), await record("b")]

    async with dbos:
        with SetWorkflowID("wf-k"):
            assert await two() == ["a", "b"]
        client = DBOSClient(database_url)
        client.data_source("shop", app_url)
        async with client:
            with pytest.raises(DBOSError, match="before entering the DBOSClient"):
                client.data_source("other", app_url)
            lines = [w.to_json() async for w in client.export_workflows()]
            assert '"datasource_outputs":{"shop":[{"step_id":0' in lines[0]
            handle = await client.rewind_workflow("wf-k", 1)
            assert await handle.get_result() == ["a", "b"]
            assert runs == ["a", "b", "b"]
            await client.delete_workflow("wf-k")
    assert await _orders(app_url) == [("a", 1), ("b", 2)]
    assert await fetchval(app_url, "SELECT count(*) FROM dbos.datasource_outputs") == 0

    # The command line's client, given the data source, does the same.
    async with dbos:
        with SetWorkflowID("wf-l"):
            assert await two() == ["a", "b"]
        assert ok(await cli("workflow", "rewind", "wf-l", "--step", "1", "--url",
                            database_url, "--data-source", f"shop={app_url}")) == (
            "Rewound wf-l to step 1\n")
        assert await (await dbos.retrieve_workflow("wf-l")).get_result() == ["a", "b"]
        assert runs == ["a", "b", "b", "a", "b", "b"]
        assert "--data-source takes NAME=URL, got 'shop'" in failed(await cli(
            "workflow", "delete", "wf-l", "--url", database_url, "--data-source", "shop"))
        ok(await cli("workflow", "delete", "wf-l", "--url", database_url,
                     "--data-source", f"shop={app_url}"))
    assert await fetchval(app_url, "SELECT count(*) FROM dbos.datasource_outputs") == 0


async def test_two_data_sources_and_the_dbos_table_shape(database_url: str, app_url: str,
                                                         create_database: Any) -> None:
    other = await create_database()
    await execute(other, ORDERS)
    dbos = new_dbos(database_url)
    dbos.data_source("shop", app_url)
    dbos.data_source("ledger", other, schema="ledger_schema")
    _, place_shop, _ = _ordering(dbos, "shop")

    @dbos.transaction(data_source="ledger")
    async def book(order_id: str) -> None:
        await transaction_connection().execute("INSERT INTO orders VALUES ($1, 7)", order_id)

    @dbos.workflow()
    async def both(order_id: str) -> None:
        await place_shop(order_id, 1)
        await book(order_id)

    async with dbos:
        await both("o9")
    assert await _orders(app_url) == [("o9", 1)]
    assert await _orders(other) == [("o9", 7)]
    columns = await fetch(other, """SELECT column_name, data_type, is_nullable
                                    FROM information_schema.columns
                                    WHERE table_schema = 'ledger_schema'
                                      AND table_name = 'datasource_outputs'
                                    ORDER BY ordinal_position""")
    assert [(c["column_name"], c["data_type"], c["is_nullable"]) for c in columns] == [
        ("workflow_id", "text", "NO"), ("step_id", "integer", "NO"), ("output", "text", "YES"),
        ("error", "text", "YES"), ("serialization", "text", "YES"),
        ("created_at", "bigint", "NO")]
    versions = "SELECT version FROM ledger_schema.dbos_datasource_migrations"
    assert await fetchval(other, versions) == 1


async def test_sharded_system_database_prefixes_the_key(create_database: Any,
                                                        app_url: str) -> None:
    url = await create_database()
    await execute(url, ORDERS)
    from dbos_async import SetShardKey

    dbos = new_dbos(url, sharding=True)
    dbos.data_source("shop", app_url)
    _, place_app, _ = _ordering(dbos, "shop")
    _, place_sys, _ = _ordering(dbos, None, "_sys")
    async with dbos:
        with SetShardKey("tenant-a"), SetWorkflowID("same"):
            assert await place_app("a1", 1) == 1
        with SetShardKey("tenant-b"), SetWorkflowID("same"):
            assert await place_app("b1", 1) == 2
        with SetShardKey("tenant-a"), SetWorkflowID("sys"):
            assert await place_sys("s1", 1) == 1
    ids = [r["workflow_id"] for r in await fetch(
        app_url, "SELECT workflow_id FROM dbos.datasource_outputs ORDER BY 1")]
    assert ids == ["8:tenant-a:same", "8:tenant-b:same"]


@pytest.mark.citus
async def test_on_citus_application_transactions_run_and_system_ones_are_refused(
        citus_url: str, app_url: str) -> None:
    """With a Citus system database, a transaction on an application database commits once,
    its fenced checkpoint routed to its workflow's shard, and replays; one on the system
    database is refused with the reason (its checkpoint would span shards), running none
    of its SQL."""
    from dbos_async import SetShardKey

    dbos = new_dbos(citus_url, sharding=True)
    dbos.data_source("shop", app_url)
    _, place, runs = _ordering(dbos, "shop")

    @dbos.transaction(name="on_system")
    async def on_system() -> None:
        await transaction_connection().execute("SELECT 1")

    @dbos.workflow(name="system_placing")
    async def system_placing() -> None:
        await on_system()

    async with dbos:
        for _ in range(2):  # the run, then the replay
            with SetShardKey("tenant-a"), SetWorkflowID("c1"):
                assert await place("a1", 1) == 1
        with SetShardKey("tenant-b"), SetWorkflowID("c2"):
            assert await place("b1", 2) == 2
        with SetShardKey("tenant-a"), SetWorkflowID("c3"), \
                pytest.raises(DBOSError, match="not supported on Citus"):
            await system_placing()
        steps = await dbos.list_workflow_steps("c1", shard_key="tenant-a")
        assert [(s.name, s.output) for s in steps] == [("insert_order", 1)]
        # The refusal is the step's outcome, like any error it raises.
        steps = await dbos.list_workflow_steps("c3", shard_key="tenant-a")
        assert [(s.name, type(s.error).__name__) for s in steps] == [("on_system", "DBOSError")]
    assert runs["n"] == 2
    assert await _orders(app_url) == [("a1", 1), ("b1", 2)]
    ids = [r["workflow_id"] for r in await fetch(
        app_url, "SELECT workflow_id FROM dbos.datasource_outputs ORDER BY 1")]
    assert ids == ["8:tenant-a:c1", "8:tenant-b:c2"]


@pytest.mark.parametrize("on", ["system", "application"])
async def test_a_stale_execution_racing_the_taker_commits_nothing(
        database_url: str, app_url: str, on: str) -> None:
    """Two executors on one workflow's transaction: A runs its SQL and stalls before the
    commit; A looks dead, B takes the workflow over and runs the transaction; A resumes and
    its commit is refused by the fence (its SQL rolled back): one effect, B's."""
    url = database_url if on == "system" else app_url
    await execute(url, "CREATE TABLE IF NOT EXISTS effects (workflow_id text, executor text)")
    source = None if on == "system" else "shop"

    def register(dbos: DBOS, label: str, gate: asyncio.Event | None,
                 reached: asyncio.Event | None) -> Any:
        if source:
            dbos.data_source("shop", app_url)

        @dbos.transaction(data_source=source, name="effect", isolation="READ COMMITTED")
        async def effect() -> str:
            await transaction_connection().execute(
                "INSERT INTO effects VALUES ($1, $2)", "raced", label)
            if reached is not None:
                reached.set()
            if gate is not None:
                await gate.wait()
            return label

        @dbos.workflow(name="racing")
        async def racing() -> str:
            return await effect()

        return racing

    a = new_dbos(database_url, failover_after=None)
    gate, reached = asyncio.Event(), asyncio.Event()
    racing = register(a, "A", gate, reached)
    async with a:
        with SetWorkflowID("raced"):
            handle_a = await a.start_workflow(racing)
        await asyncio.wait_for(reached.wait(), 30)
        await take_executor_id_away(database_url, a)
        b = new_dbos(database_url, executor_id="taker", failover_after=0.2)
        register(b, "B", None, None)
        async with b:
            assert await asyncio.wait_for(
                (await b.retrieve_workflow("raced")).get_result(), 60) == "B"
        gate.set()
        assert await asyncio.wait_for(handle_a.get_result(), 60) == "B"
    assert [tuple(r) for r in await fetch(url, "SELECT * FROM effects")] == [("raced", "B")]
    row = await workflow_row(database_url, "raced")
    assert row is not None and row["executor_id"] == "taker"


async def test_export_and_import_carry_application_records(
        database_url: str, app_url: str, create_database: Any) -> None:
    dbos = new_dbos(database_url)
    dbos.data_source("shop", app_url)
    _, place, _ = _ordering(dbos, "shop")
    async with dbos:
        with SetWorkflowID("wf-x"):
            await place("o1", 2)
        lines = [w.to_json() async for w in dbos.export_workflows()]
    assert '"datasource_outputs":{"shop":[{"step_id":0' in lines[0]

    # A target that does not register the data source refuses the line, writing nothing.
    target_url = await create_database()
    bare = new_dbos(target_url, executor_id="bare")
    async with bare:
        with pytest.raises(DBOSError, match="data source 'shop', which this executor"):
            await bare.import_workflows(lines)
        assert await bare.list_workflows() == []

    target_app = await create_database()
    target = new_dbos(target_url, executor_id="target")
    target.data_source("shop", target_app)
    async with target:
        summary = await target.import_workflows(lines)
        assert summary.imported == 1
    rows = await fetch(target_app, "SELECT workflow_id, step_id, output "
                                   "FROM dbos.datasource_outputs")
    assert [tuple(r) for r in rows] == [("wf-x", 0, "1")]


async def test_the_console_shows_a_transaction_as_such(database_url: str, app_url: str) -> None:
    import httpx2

    from dbos_async.console import console_app

    dbos = new_dbos(database_url)
    dbos.data_source("shop", app_url)
    _, place, _ = _ordering(dbos, "shop")
    async with dbos:
        with SetWorkflowID("wf-c"):
            await place("o1", 1)
        transport = httpx2.ASGITransport(console_app(dbos), client=("127.0.0.1", 5000))
        async with httpx2.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
            page = await http.get("/workflow", params={"id": "wf-c"})
    assert page.status_code == 200
    assert 'insert_order <span class="muted">transaction</span>' in page.text


@pytest.mark.parametrize("on", ["system", "application"])
async def test_a_lost_connection_is_retried_in_a_new_transaction(
        database_url: str, app_url: str, on: str) -> None:
    """The server ends the transaction's session mid-way: nothing of it committed, the
    transaction runs again on another connection, and its effect is there once."""
    url = database_url if on == "system" else app_url
    if on == "system":
        await execute(database_url, ORDERS)
    dbos = new_dbos(database_url)
    source = None if on == "system" else "shop"
    if source:
        dbos.data_source("shop", app_url)
    attempts = {"n": 0}

    @dbos.transaction(data_source=source)
    async def insert() -> int:
        conn = transaction_connection()
        attempts["n"] += 1
        await conn.execute("INSERT INTO orders VALUES ('o1', 1)")
        if attempts["n"] == 1:
            await execute(url, "SELECT pg_terminate_backend($1)", conn.get_server_pid())
        return int(await conn.fetchval("SELECT count(*) FROM orders"))

    @dbos.workflow()
    async def inserting() -> int:
        return await insert()

    async with dbos:
        assert await inserting() == 1
    assert attempts["n"] == 2
    assert await _orders(url) == [("o1", 1)]


async def test_an_application_database_outage_is_outlived_and_never_recorded(
        database_url: str, cluster: Cluster, caplog: pytest.LogCaptureFixture) -> None:
    """The application database's server stops before a transaction can open: the attempt
    is retried like a lost connection (logged), nothing is recorded meanwhile, and once the
    server is back the transaction commits, once."""
    caplog.set_level(logging.WARNING, logger="dbos_async")
    await execute(cluster.url("postgres"), "CREATE DATABASE shop")
    app_url = cluster.url("shop")
    await execute(app_url, ORDERS)
    dbos = new_dbos(database_url, db_retry_timeout=120.0)
    dbos.data_source("shop", app_url)
    _, place, runs = _ordering(dbos, "shop")

    async def retried() -> bool:
        return any("Step insert_order of workflow wf-out failed (attempt 1" in r.getMessage()
                   for r in caplog.records)

    async with dbos:
        cluster.stop()
        try:
            with SetWorkflowID("wf-out"):
                handle = await dbos.start_workflow(place, "o1", 1)
            await wait_until(retried, what="the transaction to be retried")
            assert await step_rows(database_url, "wf-out") == []
        finally:
            cluster.start()
        assert await handle.get_result() == 1
    assert runs["n"] == 1
    assert await _orders(app_url) == [("o1", 1)]
    steps = await step_rows(database_url, "wf-out")
    assert [(s.function_name, s.output, s.error) for s in steps] == [("insert_order", 1, None)]


async def test_a_database_refusing_connections_is_never_the_outcome(database_url: str,
                                                                    app_url: str) -> None:
    """An application database that refuses connections (not a condition retrying
    outlives): the caller gets a DatabaseUnavailableError naming it, not the driver's
    error, and no outcome is recorded for the transaction."""
    name = app_url.rsplit("/", 1)[1]
    dbos = new_dbos(database_url)
    dbos.data_source("shop", app_url)
    _, place, runs = _ordering(dbos, "shop")
    async with dbos:
        await execute(database_url, f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
        try:
            await execute(database_url, "SELECT pg_terminate_backend(pid) FROM "
                                        "pg_stat_activity WHERE datname = $1", name)
            with SetWorkflowID("wf-no"), pytest.raises(DatabaseUnavailableError) as raised:
                await place("o1", 1)
        finally:
            await execute(database_url, f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')
    assert "Could not open a transaction on the application database of data source " \
           "'shop'" in str(raised.value)
    assert "not currently accepting connections" in str(raised.value)
    assert runs["n"] == 0
    assert await step_rows(database_url, "wf-no") == []
    assert await _orders(app_url) == []


async def test_sessions_ended_in_the_pool_are_replaced_not_retried(
        database_url: str, app_url: str, caplog: pytest.LogCaptureFixture) -> None:
    """The application database's sessions terminated while idle in the pool, the next
    transaction started right after: it begins on a new connection (no retry, no error),
    whatever state the driver found the ended one in (closed, or still reading the
    server's farewell)."""
    caplog.set_level(logging.WARNING, logger="dbos_async")
    name = app_url.rsplit("/", 1)[1]
    dbos = new_dbos(database_url)
    dbos.data_source("shop", app_url)
    _, place, runs = _ordering(dbos, "shop")
    admin = await asyncpg.connect(database_url)
    try:
        async with dbos:
            for i in range(20):
                assert await place(f"o{i}", i) == i + 1
                ended = await admin.fetchval("SELECT count(pg_terminate_backend(pid)) FROM "
                                             "pg_stat_activity WHERE datname = $1", name)
                assert ended >= 1
    finally:
        await admin.close()
    assert runs["n"] == 20
    assert [r.getMessage() for r in caplog.records if "failed (attempt" in r.getMessage()] \
        == []
    assert len(await _orders(app_url)) == 20


async def test_retention_deletes_old_application_records(database_url: str,
                                                         app_url: str) -> None:
    dbos = new_dbos(database_url)
    dbos.data_source("shop", app_url)
    _, place, _ = _ordering(dbos, "shop")
    async with dbos:
        for i in range(3):
            await place(f"o{i}", i)
        assert await fetchval(app_url, "SELECT count(*) FROM dbos.datasource_outputs") == 3
        later = int(time.time() * 1000) + 60_000
        assert await dbos.garbage_collect(later, batch_size=2) == 3
    assert await fetchval(app_url, "SELECT count(*) FROM dbos.datasource_outputs") == 0
    assert len(await _orders(app_url)) == 3  # the user's rows are the user's


async def test_without_migrations_an_unmigrated_data_source_is_refused(
        database_url: str, app_url: str) -> None:
    migrated = new_dbos(database_url)
    async with migrated:
        pass  # the system database's schema, not the application database's
    dbos = new_dbos(database_url, run_migrations=False)
    dbos.data_source("shop", app_url)
    with pytest.raises(ConfigurationError, match=r"no up-to-date dbos\.datasource_outputs"):
        async with dbos:
            pass
    assert await fetchval(app_url, "SELECT to_regclass('dbos.datasource_outputs')") is None


async def test_a_client_never_migrates_a_data_source(database_url: str, app_url: str) -> None:
    async with new_dbos(database_url):
        pass  # the system database's schema, not the application database's
    client = DBOSClient(database_url)
    client.data_source("shop", app_url)
    with pytest.raises(ConfigurationError, match="an executor entered with "
                                                 "run_migrations=True creates it"):
        async with client:
            pass
    assert await fetchval(app_url, "SELECT to_regclass('dbos.datasource_outputs')") is None


async def test_a_commit_under_way_when_the_fence_ends_lands_once(database_url: str,
                                                                 app_url: str) -> None:
    """A's application commit is held up at commit time (a deferred trigger waits on a lock
    the test holds) while A's fence holds the workflow; A freezes that way until its fence's
    session ends (idle_transaction_timeout), B takes the workflow over and runs the
    transaction, whose record insert waits for A's commit; released, A's commit lands and B
    replays it: one effect, A's, and one outcome."""
    await execute(app_url, """
        CREATE TABLE effects (workflow_id text, executor text);
        CREATE FUNCTION hold() RETURNS trigger LANGUAGE plpgsql AS $$
          BEGIN
            IF NEW.executor = 'A' THEN PERFORM pg_advisory_xact_lock(4242); END IF;
            RETURN NULL;
          END $$;
        CREATE CONSTRAINT TRIGGER held AFTER INSERT ON effects
          DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION hold()""")

    def register(dbos: DBOS, label: str) -> Any:
        dbos.data_source("shop", app_url)

        @dbos.transaction(data_source="shop", name="effect", isolation="READ COMMITTED")
        async def effect() -> str:
            await transaction_connection().execute(
                "INSERT INTO effects VALUES ('held', $1)", label)
            return label

        @dbos.workflow(name="holding")
        async def holding() -> str:
            return await effect()

        return holding

    async def waiters(kind: str) -> int:
        return int(await fetchval(app_url, "SELECT count(*) FROM pg_locks "
                                           "WHERE NOT granted AND locktype = $1", kind))

    holder = await asyncpg.connect(app_url)
    try:
        await holder.execute("SELECT pg_advisory_lock(4242)")
        a = new_dbos(database_url, failover_after=None, idle_transaction_timeout=1.0)
        holding = register(a, "A")
        async with a:
            with SetWorkflowID("held"):
                handle_a = await a.start_workflow(holding)

            async def a_commit_held() -> bool:
                return await waiters("advisory") == 1

            await wait_until(a_commit_held, what="A's commit to wait on the trigger's lock")
            await take_executor_id_away(database_url, a)
            b = new_dbos(database_url, executor_id="taker", failover_after=0.2)
            register(b, "B")
            async with b:
                async def b_waits_for_a() -> bool:
                    return await waiters("transactionid") == 1

                await wait_until(b_waits_for_a, patience=60,
                                 what="B's record insert to wait for A's commit")
                await holder.execute("SELECT pg_advisory_unlock(4242)")
                assert await asyncio.wait_for(
                    (await b.retrieve_workflow("held")).get_result(), 60) == "A"
            assert await asyncio.wait_for(handle_a.get_result(), 60) == "A"
    finally:
        await holder.close()
    assert [tuple(r) for r in await fetch(app_url, "SELECT * FROM effects")] == [("held", "A")]
    steps = await step_rows(database_url, "held")
    assert [(s.function_name, s.output) for s in steps] == [("effect", "A")]
