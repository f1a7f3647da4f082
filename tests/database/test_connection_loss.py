"""Every connection of an executor terminated mid-run: it reconnects and the work completes."""

from __future__ import annotations

import asyncio
import logging

import pytest

from dbos_async import DBOS
from tests.helpers import fetch, fetchval, new_dbos


async def terminate_connections(url: str, connection_name: str) -> int:
    rows = await fetch(
        url,
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
        "WHERE application_name = $1 AND pid <> pg_backend_pid()",
        connection_name,
    )
    return len(rows)


def with_slow_workflow(dbos: DBOS) -> tuple[object, list[int]]:
    runs: list[int] = []

    @dbos.step()
    async def stage(i: int, n: int) -> int:
        runs.append(i)
        await asyncio.sleep(0.05)
        return i * 10 + n

    @dbos.workflow()
    async def staged(i: int) -> int:
        total = 0
        for n in range(4):
            total += await stage(i, n)
        return total

    return staged, runs


async def test_workflows_survive_losing_every_connection(
    database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="dbos_async")
    dbos = new_dbos(database_url, pool_size=4)
    staged, _ = with_slow_workflow(dbos)
    name = dbos.config.connection_name
    async with dbos:
        handles = [await dbos.start_workflow(staged, i) for i in range(20)]  # type: ignore[arg-type]
        # Let the workflows get going, then cut every connection: pool and listener alike.
        await asyncio.sleep(0.1)
        killed = await terminate_connections(database_url, name)
        assert killed >= 2
        results = await asyncio.gather(*(h.get_result() for h in handles))
        assert results == [sum(i * 10 + n for n in range(4)) for i in range(20)]
        # The listener came back too: a wait woken by notification still works afterwards.
        assert await staged(99) == sum(990 + n for n in range(4))
    # Statements cut mid-flight (if any were) were retried on new connections; the listener
    # always notices.
    assert any("listener lost its connection" in r.message for r in caplog.records)
    rows = await fetchval(
        database_url,
        "SELECT count(*) FROM dbos.operation_outputs WHERE function_name LIKE '%stage'",
    )
    assert rows == 21 * 4
    statuses = await fetch(database_url, "SELECT DISTINCT status FROM dbos.workflow_status")
    assert [r["status"] for r in statuses] == ["SUCCESS"]
