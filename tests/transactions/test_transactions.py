"""Transactions (``@dbos.transaction()``): the user's SQL and its checkpoint commit
together, on the system database and on application databases, against a real PostgreSQL.

Recovery inside one process is simulated as in test_workflows.py: an instance exits with
``shutdown_grace_period=0`` while a workflow waits, leaving it PENDING, and a second one
with the same executor ID recovers it. Real process kills, zombies and races between
processes are in test_transactions_processes.py.
"""

from __future__ import annotations

import asyncio
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
    step_rows,
    take_executor_id_away,
    wait_until,
    workflow_row,
)

from dbos_async import (
    DBOS,
    ConfigurationError,
    DBOSError,
    SetWorkflowID,
    SetWorkflowTimeout,
    TransactionError,
    WorkflowCancelledError,
    transaction_connection,
)

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
