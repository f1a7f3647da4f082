"""Entering an executor while its database is unreachable: start-up is retried within
db_retry_timeout, and past it fails with DatabaseUnavailableError naming server and cause."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest

from dbos_async import DatabaseUnavailableError, SetWorkflowID
from tests.helpers import new_dbos, wait_until
from tests.helpers.cluster import Cluster
from tests.management.test_control_faults import kill_storm


async def test_entering_during_a_connection_kill_storm(
        database_url: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="dbos_async")
    # A claimed executor ID, so the claim is entered under the storm too.
    dbos = new_dbos(database_url, executor_id=None, db_retry_timeout=60)

    @dbos.workflow()
    async def hello(name: str) -> str:
        return f"hello {name}"

    def retried() -> bool:
        return any(r.message.startswith("Retrying ") for r in caplog.records)

    entries = 0
    # Slower than the operations' storm: a first start-up migrates the whole schema. Enter
    # until the storm has cut a start-up step (at least four entries, at most forty). The
    # storm eases as it goes (its gaps twice as long after 20 rounds), so that on a loaded
    # machine, where one start-up step outlasts its gaps, an entry still gets through.
    async with kill_storm(database_url, pace=(0.05, 0.25), easing=0.05) as storm:
        while entries < 4 or (not retried() and entries < 40):
            async with dbos:
                assert dbos.health().state == "running"
                with SetWorkflowID(f"entry-{entries}"):
                    assert await hello(str(entries)) == f"hello {entries}"
            entries += 1
    assert storm.kills > 0
    # The storm cut start-up steps, and their retries carried every entry through.
    assert retried()


# ---- A server that is down, then comes up ----


@contextlib.asynccontextmanager
async def entering(dbos: Any) -> AsyncIterator[asyncio.Task[None]]:
    """Enter ``dbos`` in a task, which stays inside until the block ends."""
    leave = asyncio.Event()

    async def run() -> None:
        async with dbos:
            await leave.wait()

    task = asyncio.create_task(run())
    try:
        yield task
    finally:
        leave.set()
        with contextlib.suppress(Exception):
            await task


async def test_entering_while_the_server_is_down_waits_for_it(
        cluster: Cluster, caplog: pytest.LogCaptureFixture) -> None:
    # Refused retries of a server that never answered are logged at DEBUG only.
    caplog.set_level(logging.DEBUG, logger="dbos_async")
    # An explicit startup_wait: waiting for a server that starts with the application.
    dbos = new_dbos(cluster.url("startup_outage"), db_retry_timeout=120, startup_wait=120,
                    connect_timeout=2)

    @dbos.workflow()
    async def hello() -> str:
        return "hello"

    cluster.stop()

    def refused() -> bool:
        return any(r.message.startswith("Retrying preparing the system database")
                   for r in caplog.records)

    async def entered() -> bool:
        return dbos.health().state == "running"

    async with entering(dbos) as task:
        await wait_until(lambda: _true(refused()), patience=60,
                         what="start-up to be refused and retried")
        assert not task.done()
        cluster.start()
        await wait_until(entered, patience=120, what="the entry to complete")
        assert await hello() == "hello"
        assert dbos.health().healthy
    assert task.done() and task.exception() is None


async def test_entering_past_db_retry_timeout_names_the_server_and_cause(
        cluster: Cluster) -> None:
    dbos = new_dbos(cluster.url("startup_outage"), db_retry_timeout=0.5, connect_timeout=2)
    cluster.stop()
    with pytest.raises(DatabaseUnavailableError) as raised:
        async with dbos:
            pass
    message = str(raised.value)
    assert f"127.0.0.1:{cluster.port}" in message
    assert "ConnectionRefusedError" in message or "OSError" in message
    assert dbos.health().state == "closed"


async def _true(value: bool) -> bool:
    return value
