"""Background tasks never die silently: each restarts on any failure, and DBOS.health()
names it meanwhile; notifications keep leaving the process after the notifier failed."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import asyncpg
import pytest

from dbos_async import DBOS, ExecutorHealth, SetWorkflowID
from dbos_async._sysdb.notifications import WORKFLOW_COMPLETION_CHANNEL
from tests.helpers import listen_for_completions, new_dbos, wait_until


@contextlib.asynccontextmanager
async def completions(url: str) -> AsyncIterator[asyncio.Queue[str]]:
    """Another client of the database, LISTENing to completion notifications."""
    conn = await asyncpg.connect(url)
    received: asyncio.Queue[str] = asyncio.Queue()
    await listen_for_completions(conn, received.put_nowait)
    try:
        yield received
    finally:
        await conn.close()


async def next_matching(received: asyncio.Queue[str], payload: str) -> None:
    # A guard against hanging, not a timed assert: without the fix nothing ever arrives.
    async with asyncio.timeout(30):
        while await received.get() != payload:
            pass


def fail_notifier_sends(monkeypatch: pytest.MonkeyPatch, dbos: DBOS, error: Exception,
                        times: int) -> list[int]:
    """Make the notifier's next ``times`` sends (its pg_notify statement, run on the pool)
    raise ``error``, as a broken connection under the pool would. Returns the failure
    count so far (one element per failure)."""
    pool = dbos._system_database.pool
    execute: Callable[..., Awaitable[Any]] = asyncpg.Pool.execute
    failures: list[int] = []

    async def faulty(self: asyncpg.Pool, query: str, *args: Any, **kwargs: Any) -> Any:
        if self is pool and "pg_notify" in query and len(failures) < times:
            failures.append(1)
            raise error
        return await execute(self, query, *args, **kwargs)

    # The pool's class: asyncpg pools take no attributes of their own (__slots__).
    monkeypatch.setattr(asyncpg.Pool, "execute", faulty)
    return failures


def with_noop(dbos: DBOS) -> Callable[[], Awaitable[None]]:
    @dbos.workflow()
    async def noop() -> None:
        return None

    async def run(workflow_id: str) -> None:
        with SetWorkflowID(workflow_id):
            await noop()

    return run  # type: ignore[return-value]


@pytest.mark.parametrize("error", [
    asyncpg.InternalClientError("cannot switch to state 11; another operation is in progress"),
    asyncpg.InterfaceError("cannot perform operation: connection is closed"),
])
async def test_notifier_survives_a_broken_connection_error(
        database_url: str, monkeypatch: pytest.MonkeyPatch, error: Exception) -> None:
    dbos = new_dbos(database_url)
    run: Any = with_noop(dbos)
    async with dbos, completions(database_url) as received:
        failures = fail_notifier_sends(monkeypatch, dbos, error, times=1)
        await run("during-fault")
        await wait_until(lambda: _true(bool(failures)), what="the injected failure")
        # The notifier is still sending: a later completion reaches the other client.
        await run("after-fault")
        await next_matching(received, "after-fault")
        assert dbos.health().healthy


async def test_notifier_restarts_after_an_unexpected_error(
        database_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    dbos = new_dbos(database_url)
    run: Any = with_noop(dbos)
    async with dbos, completions(database_url) as received:
        fail_notifier_sends(monkeypatch, dbos, RuntimeError("injected notifier fault"), times=1)
        await run("during-fault")
        # The batch that failed is sent by the restarted notifier, and later ones too.
        await next_matching(received, "during-fault")
        await run("after-fault")
        await next_matching(received, "after-fault")

        def notifier() -> Any:
            return next(t for t in dbos.health().tasks if t.name == "notifier")

        await wait_until(lambda: _true(notifier().state == "running"), what="the restart")
        task = notifier()
        assert task.restarts == 1
        assert task.last_error is not None and "injected notifier fault" in task.last_error
        assert task.last_error_at is not None


async def test_health_names_every_background_task(database_url: str) -> None:
    dbos = new_dbos(database_url, executor_id=None, retention_hours=24)

    assert dbos.health() == ExecutorHealth("closed", None, ())
    assert not dbos.health().healthy
    async with dbos:
        health = dbos.health()
        assert health.healthy and health.down == []
        assert health.state == "running" and health.executor_id == dbos.executor_id
        names = {task.name for task in health.tasks}
        assert {"notification listener", "notifier", "cancellation watcher",
                "executor ID keeper", "maintenance jobs", "scheduler",
                "queue watcher"} <= names
        assert any(name.startswith("queue claim loop ") for name in names)
        assert all(t.restarts == 0 and t.last_error is None for t in health.tasks)
    after = dbos.health()
    assert after.state == "closed" and not after.healthy
    assert {task.state for task in after.tasks} == {"stopped"}


async def test_a_task_failing_on_every_start_is_reported_down(
        database_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    dbos = new_dbos(database_url)
    async with dbos:
        failures = fail_notifier_sends(monkeypatch, dbos, RuntimeError("still broken"),
                                       times=1_000_000)
        dbos._system_database.notify(WORKFLOW_COMPLETION_CHANNEL, str(uuid.uuid4()))

        def down() -> list[str]:
            return [t.name for t in dbos.health().down]

        await wait_until(lambda: _true(down() == ["notifier"]), what="the notifier down")
        assert not dbos.health().healthy
        assert failures
        monkeypatch.undo()
        await wait_until(lambda: _true(dbos.health().healthy), what="the notifier back")


async def _true(value: bool) -> bool:
    return value
