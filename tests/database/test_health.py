"""What ``health()`` and the log say when the database is slow or the listener is missing.

A commit that waits on a synchronous standby which is not there (``synchronous_standby_names``
naming a missing one, as on a promoted standby that still requires its own) hangs with no
error; the executor must say so, and on what, at entry and while it runs. A listener that
cannot connect (a role's connection limit) makes waits fall back to polling: still working,
but degraded, and ``health()`` says why.
"""

from __future__ import annotations

import asyncio
import logging

import pytest

from dbos_async import DBOS
from tests.helpers import execute, new_dbos, unique_name, wait_until
from tests.helpers.cluster import Cluster


async def _require_missing_standby(cluster: Cluster, required: bool) -> None:
    value = "'absent_standby'" if required else "''"
    await execute(cluster.url("postgres"), f"ALTER SYSTEM SET synchronous_standby_names = {value}")
    await execute(cluster.url("postgres"), "SELECT pg_reload_conf()")


def _slow_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "for the system database" in r.getMessage()
            and "waited over" in r.getMessage()]


async def test_a_commit_held_by_a_missing_synchronous_standby_is_logged_and_reported(
        cluster: Cluster, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="dbos_async")
    url = cluster.url("held_commits")
    await execute(cluster.url("postgres"), "CREATE DATABASE held_commits")
    # The test cluster turns synchronous_commit off; commits wait on standbys only with it on.
    await execute(cluster.url("postgres"),
                  "ALTER DATABASE held_commits SET synchronous_commit = on")
    dbos = new_dbos(url)

    @dbos.workflow()
    async def hello(name: str) -> str:
        return f"hello {name}"

    # Entering: its first commit waits, and the log says on what before it completes.
    await _require_missing_standby(cluster, True)
    entering = asyncio.create_task(dbos.__aenter__())
    await wait_until(lambda: _true(bool(_slow_lines(caplog))), patience=60,
                     what="a log line about the entry's held commit")
    assert "SyncRep" in _slow_lines(caplog)[0] and "synchronous standby" in _slow_lines(caplog)[0]
    assert not entering.done()
    await _require_missing_standby(cluster, False)
    await entering
    try:
        assert dbos.health().healthy
        # Running: a workflow's start waits; health() is degraded and says on what.
        caplog.clear()
        await _require_missing_standby(cluster, True)
        call = asyncio.create_task(hello("held"))
        await wait_until(lambda: _slow_on_something(dbos), patience=60,
                         what="health() to report slow commits, and on what")
        health = dbos.health()
        assert health.degraded and not health.healthy
        assert health.database is not None and health.database.waiting >= 1
        assert health.database.longest_wait >= 5.0
        assert "SyncRep" in (health.database.waiting_on or "")
        assert any("SyncRep" in problem for problem in health.problems)
        assert not call.done()
        await _require_missing_standby(cluster, False)
        assert await call == "hello held"
        await wait_until(lambda: _healthy(dbos), patience=30, what="the executor healthy again")
    finally:
        await _require_missing_standby(cluster, False)
        await dbos.__aexit__(None, None, None)


async def test_a_listener_that_cannot_connect_makes_the_executor_degraded(
        database_url: str, admin_url: str) -> None:
    role = unique_name("limited")
    await execute(admin_url, f"CREATE ROLE {role} LOGIN CONNECTION LIMIT 2")
    database = database_url.rsplit("/", 1)[1]
    await execute(admin_url, f'ALTER DATABASE "{database}" OWNER TO {role}')
    url = database_url.replace("postgres@", f"{role}@", 1)
    # The pool's first connection and the executor ID's: the listener's is one too many
    # (the pool's second, if it needs one, is refused and retried).
    dbos = new_dbos(url, pool_size=2, notification_poll_interval=0.1)

    @dbos.workflow()
    async def receiver() -> object:
        return await dbos.recv("go", timeout=60)

    try:
        async with dbos:
            health = dbos.health()
            assert health.listener is not None and "not connected" in health.listener
            assert "TooManyConnections" in health.listener
            assert health.degraded and health.listener in health.problems
            # Waits still work, by polling.
            handle = await dbos.start_workflow(receiver)
            await dbos.send(handle.workflow_id, "polled", topic="go")
            assert await handle.get_result() == "polled"
            # Room for it: the listener connects, and the executor is healthy again.
            await execute(admin_url, f"ALTER ROLE {role} CONNECTION LIMIT 10")
            await wait_until(lambda: _healthy(dbos), patience=30,
                             what="the listener to connect")
            assert dbos.health().listener is None
    finally:
        await execute(database_url, f"REASSIGN OWNED BY {role} TO postgres")
        await execute(admin_url, f'ALTER DATABASE "{database}" OWNER TO postgres')
        await execute(admin_url, f"DROP ROLE {role}")


async def _slow_on_something(dbos: DBOS) -> bool:
    database = dbos.health().database
    return database is not None and database.state == "slow" and bool(database.waiting_on)


async def _healthy(dbos: DBOS) -> bool:
    return dbos.health().healthy


async def _true(value: bool) -> bool:
    return value
