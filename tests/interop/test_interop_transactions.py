"""Interoperability of transactions with the `dbos` package (3.4.0): a workflow it starts
with a ``@ds.transaction()`` step on an application database shared with dbos_async
crashes right after the application database's commit, before the step's checkpoint
reaches the system database; a dbos_async executor then recovers it.

What holds: both SDKs create and read the same ``datasource_outputs`` table (dbos_async
adopts the schema the `dbos` package migrated, at the same version, and reads its record:
same key, same portable JSON). What does not: the `dbos` package numbers a workflow's first
step 1 (its ``function_id`` counter is bumped before each step), dbos_async numbers it 0, so
the recovering executor looks for the record one position early, finds none and runs the
transaction again. Here the user's primary key refuses the second insert, so there is no
second effect and the workflow ends in ``ERROR`` with the :class:`TransactionError`; a
table without such a key would get a second row. Mid-workflow recovery across the two SDKs
is therefore not supported (it is not for ordinary steps either, for the same reason).
"""

from __future__ import annotations

import asyncio
import sys
import textwrap
from collections.abc import Awaitable, Callable

import pytest
from helpers import execute, fetch, fetchval, new_dbos, step_rows

from dbos_async import SetWorkflowID, TransactionError, transaction_connection

PATIENCE = 60.0

_DBOS_SCRIPT = textwrap.dedent(
    """
    import os, sys, time
    import sqlalchemy as sa
    from sqlalchemy import event
    from sqlalchemy.orm import Session
    from dbos import (DBOS, DBOSPortableJSONSerializer, SetWorkflowID, SQLAlchemyDatasource,
                      WorkflowSerializationFormat)

    DBOS(config={"name": "interop-tx", "system_database_url": sys.argv[1],
                 "application_version": "interop-tx", "executor_id": "interop-tx"})
    ds = SQLAlchemyDatasource.create(sys.argv[2], serializer=DBOSPortableJSONSerializer())

    @ds.transaction(name="insert_order", isolation_level="READ COMMITTED")
    def insert_order(order_id: str) -> int:
        session = ds.sql_session()
        session.execute(sa.text("INSERT INTO orders VALUES (:i, 1)"), {"i": order_id})
        return session.execute(sa.text("SELECT count(*) FROM orders")).scalar()

    @DBOS.workflow(name="interop_order",
                   serialization_type=WorkflowSerializationFormat.PORTABLE)
    def interop_order(order_id: str) -> int:
        return insert_order(order_id)

    # The crash: right after the application database's commit, before the checkpoint.
    event.listen(Session, "after_commit", lambda session: os._exit(9))
    DBOS.launch()
    with SetWorkflowID("interop-tx"):
        DBOS.start_workflow(interop_order, "o1")
    time.sleep(60)
    """
)


async def test_a_dbos_transaction_crashed_after_its_commit_shares_the_table(
        database_url: str, create_database: Callable[[], Awaitable[str]]) -> None:
    app_url = await create_database()
    await execute(app_url, "CREATE TABLE orders (id text PRIMARY KEY, amount int)")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _DBOS_SCRIPT, database_url, app_url,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    _, err = await asyncio.wait_for(proc.communicate(), PATIENCE)
    assert proc.returncode == 9, err.decode()[-3000:]
    recorded = await fetch(app_url, "SELECT workflow_id, step_id, output, serialization "
                                    "FROM dbos.datasource_outputs")
    assert [tuple(r) for r in recorded] == [("interop-tx", 1, "1", "portable_json")]
    assert await step_rows(database_url, "interop-tx") == []

    dbos = new_dbos(database_url, executor_id="interop-tx", application_version="interop-tx")
    dbos.data_source("shop", app_url)
    runs = {"n": 0}

    @dbos.transaction(data_source="shop", name="insert_order")
    async def insert_order(order_id: str) -> int:
        runs["n"] += 1
        conn = transaction_connection()
        await conn.execute("INSERT INTO orders VALUES ($1, 1)", order_id)
        return int(await conn.fetchval("SELECT count(*) FROM orders"))

    @dbos.workflow(name="interop_order")
    async def interop_order(order_id: str) -> int:
        return await insert_order(order_id)

    async with dbos:
        with SetWorkflowID("interop-tx"):
            handle = await dbos.retrieve_workflow("interop-tx")
        with pytest.raises(TransactionError) as raised:
            await asyncio.wait_for(handle.get_result(), PATIENCE)
        assert raised.value.sqlstate == "23505"
        # The record the `dbos` package wrote, as dbos_async reads it: at its step 1.
        shop = dbos._current_runtime.application_databases["shop"]
        stored = await shop.recorded_output(("interop-tx", None), 1)
        assert stored is not None and (stored.output, stored.serialization) == (
            "1", "portable_json")
    assert runs["n"] == 1  # ran, and was rolled back
    assert [tuple(r) for r in await fetch(app_url, "SELECT * FROM orders")] == [("o1", 1)]
    # The schema the `dbos` package migrated was adopted as it was.
    assert await fetchval(app_url, "SELECT version FROM dbos.dbos_datasource_migrations") == 1
