"""cancel, delete, fork and resume when connections die under them: retried within
db_retry_timeout, idempotent when a committed attempt's reply is lost, and never a raw
driver error for the caller."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import asyncpg
import pytest

from dbos_async import (
    DBOS,
    DatabaseUnavailableError,
    DBOSError,
    SetShardKey,
    SetWorkflowID,
    WorkflowCancelledError,
)
from dbos_async._sysdb.database import SystemDatabase
from dbos_async._sysdb.retry import UnavailableAfterRetries, is_connection_loss, is_transient
from tests.helpers import fetch, fetchval, new_dbos, wait_until

DEAD_CONNECTION_ERRORS = [
    asyncpg.ConnectionDoesNotExistError("connection was closed in the middle of operation"),
    asyncpg.InterfaceError(
        "cannot call Transaction.__aexit__(): the underlying connection is closed"),
    asyncpg.InternalClientError("cannot switch to state 11; another operation is in progress"),
    ConnectionResetError("Connection reset by peer"),
]


def test_dead_connection_errors_are_transient_and_misuse_is_not() -> None:
    for error in DEAD_CONNECTION_ERRORS:
        assert is_transient(error) and is_connection_loss(error), error
    refused = DatabaseUnavailableError("Cannot connect")
    refused.__cause__ = ConnectionRefusedError(111, "refused")
    assert is_transient(refused) and not is_connection_loss(refused)
    bad_password = DatabaseUnavailableError("Cannot connect")
    bad_password.__cause__ = asyncpg.InvalidPasswordError("password authentication failed")
    assert not is_transient(bad_password)
    given_up = UnavailableAfterRetries("gave up")
    given_up.__cause__ = DEAD_CONNECTION_ERRORS[0]
    assert not is_transient(given_up)
    for misuse in (asyncpg.InterfaceError("pool is closing"),
                   asyncpg.DataError("invalid input for query argument $1"),
                   asyncpg.UniqueViolationError("duplicate key")):
        assert not is_transient(misuse), misuse
    # Conflicts are retried, but are not the database being unavailable.
    conflict = asyncpg.SerializationError("could not serialize access")
    assert is_transient(conflict) and not is_connection_loss(conflict)


def with_waiter(dbos: DBOS) -> Any:
    @dbos.workflow(name="waiter")
    async def waiter() -> str:
        return str(await dbos.recv("go", timeout=3600))

    return waiter


def lose_commit_replies(monkeypatch: pytest.MonkeyPatch, sysdb: SystemDatabase,
                        error: Exception, times: int = 1) -> list[int]:
    """Make the next ``times`` locking transactions raise ``error`` after they committed,
    as when the connection dies before the reply to COMMIT arrives."""
    real = sysdb.locking_transaction
    lost: list[int] = []

    @contextlib.asynccontextmanager
    async def committed_then_lost(*args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        async with real(*args, **kwargs) as conn:
            yield conn
        if len(lost) < times:
            lost.append(1)
            raise error

    monkeypatch.setattr(sysdb, "locking_transaction", committed_then_lost)
    return lost


@pytest.mark.parametrize("error", DEAD_CONNECTION_ERRORS, ids=lambda e: type(e).__name__)
async def test_a_fork_whose_commit_reply_was_lost_returns_that_fork(
        database_url: str, monkeypatch: pytest.MonkeyPatch, error: Exception) -> None:
    dbos = new_dbos(database_url)

    @dbos.workflow(name="double")
    async def double(x: int) -> int:
        return 2 * x

    async with dbos:
        with SetWorkflowID("orig"):
            assert await double(21) == 42
        lost = lose_commit_replies(monkeypatch, dbos._system_database, error)
        handle = await dbos.fork_workflow("orig", 0, new_workflow_id="orig-fork")
        assert lost == [1]
        assert handle.workflow_id == "orig-fork"
        assert await handle.get_result() == 42
    assert await fetchval(database_url, "SELECT count(*) FROM dbos.workflow_status "
                          "WHERE forked_from = 'orig'") == 1


async def test_a_fork_onto_another_workflow_still_fails(
        database_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    dbos = new_dbos(database_url)

    @dbos.workflow(name="double")
    async def double(x: int) -> int:
        return 2 * x

    async with dbos:
        for workflow_id in ("orig", "taken"):
            with SetWorkflowID(workflow_id):
                await double(1)
        with pytest.raises(DBOSError, match="a workflow with that ID exists"):
            await dbos.fork_workflow("orig", 0, new_workflow_id="taken")


async def test_a_cancel_whose_commit_reply_was_lost_reports_and_announces_it(
        database_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    dbos = new_dbos(database_url)
    waiter = with_waiter(dbos)
    async with dbos:
        with SetWorkflowID("waiting"):
            handle = await dbos.start_workflow(waiter)
        lost = lose_commit_replies(monkeypatch, dbos._system_database,
                                   DEAD_CONNECTION_ERRORS[1])
        assert await dbos.cancel_workflows(["waiting"]) == ["waiting"]
        assert lost == [1]
        with pytest.raises(WorkflowCancelledError):
            await handle.get_result()
        # Cancelling again changes nothing, and says so.
        assert await dbos.cancel_workflows(["waiting"]) == []


async def test_a_resume_whose_commit_reply_was_lost_leaves_the_claimed_run_alone(
        database_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    dbos = new_dbos(database_url)
    waiter = with_waiter(dbos)
    async with dbos:
        with SetWorkflowID("waiting"):
            await dbos.start_workflow(waiter)
        await dbos.cancel_workflow("waiting")
        sysdb = dbos._system_database
        real = sysdb.locking_transaction
        claimed = asyncio.Event()
        owners: list[str] = []

        @contextlib.asynccontextmanager
        async def lost_after_claim(*args: Any, **kwargs: Any) -> AsyncIterator[Any]:
            async with real(*args, **kwargs) as conn:
                yield conn
            if not claimed.is_set():
                # The resume committed; an executor claims the workflow before the retry.
                async def running() -> bool:
                    row = await fetch(database_url, "SELECT status, owner_xid FROM "
                                      "dbos.workflow_status WHERE workflow_uuid = 'waiting'")
                    if row[0]["status"] != "PENDING" or row[0]["owner_xid"] is None:
                        return False
                    owners.append(row[0]["owner_xid"])
                    return True
                await wait_until(running, what="the resumed workflow to be claimed")
                claimed.set()
                raise DEAD_CONNECTION_ERRORS[0]

        monkeypatch.setattr(sysdb, "locking_transaction", lost_after_claim)
        handle = await dbos.resume_workflow("waiting")
        assert claimed.is_set()
        monkeypatch.undo()
        rows = await fetch(database_url, "SELECT status, owner_xid FROM dbos.workflow_status "
                           "WHERE workflow_uuid = 'waiting'")
        # The retry found the resume done and left the claimed execution running (a
        # second re-enqueue would have fenced it out, for another claim to run it again).
        assert (rows[0]["status"], rows[0]["owner_xid"]) == ("PENDING", owners[0])
        await dbos.send("waiting", "go", topic="go")
        assert await handle.get_result() == "go"


# ---- A connection-kill storm ----


@dataclass
class Storm:
    kills: int = 0
    rounds: int = 0


@contextlib.asynccontextmanager
async def kill_storm(url: str, pace: tuple[float, float] = (0.02, 0.1),
                     easing: float = 0.0) -> AsyncIterator[Storm]:
    """Terminate every other backend of the database, again and again (every ``pace``
    seconds, at random within it), from a separate connection, until the block ends.
    ``easing``: each round's gap grows by that fraction of ``pace`` per round before it,
    so that work slower than the storm (a loaded machine) still finishes in the end."""
    storm = Storm()
    conn = await asyncpg.connect(url)

    async def loop() -> None:
        while True:
            storm.kills += int(await conn.fetchval(
                "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) "
                "FROM pg_stat_activity WHERE datname = current_database() "
                "AND pid <> pg_backend_pid() AND backend_type = 'client backend'"))
            storm.rounds += 1
            # The storm's pace, not a wait.
            await asyncio.sleep(random.uniform(*pace) * (1 + easing * storm.rounds))

    task = asyncio.create_task(loop())
    try:
        yield storm
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await conn.close()


Call = Callable[[], Coroutine[Any, Any, Any]]


@pytest.mark.parametrize("sharding", [False, True], ids=["unsharded", "sharded"])
async def test_control_operations_under_a_connection_kill_storm(
        database_url: str, caplog: pytest.LogCaptureFixture, sharding: bool) -> None:
    caplog.set_level(logging.WARNING, logger="dbos_async")
    dbos = new_dbos(database_url, sharding=sharding, db_retry_timeout=60)
    waiter = with_waiter(dbos)
    key = "tenant-a" if sharding else None
    originals = [f"orig-{i}" for i in range(2)]
    failures: list[tuple[str, BaseException]] = []
    calls = 0

    async def call(what: str, operation: Call) -> None:
        nonlocal calls
        calls += 1
        try:
            await operation()
        except Exception as error:
            failures.append((what, error))

    async with dbos:
        with SetShardKey(key) if sharding else contextlib.nullcontext():
            for workflow_id in originals:
                with SetWorkflowID(workflow_id):
                    await dbos.start_workflow(waiter)
        async with kill_storm(database_url) as storm:
            for n in range(10):
                for original in originals:
                    fork_id = f"{original}-fork-{n}"
                    await call("cancel", lambda o=original: dbos.cancel_workflow(o, shard_key=key))
                    # Forked for a version nobody runs: the forks stay ENQUEUED.
                    await call("fork", lambda o=original, f=fork_id: dbos.fork_workflow(
                        o, 0, new_workflow_id=f, application_version="parked", shard_key=key))
                    await call("resume", lambda o=original: dbos.resume_workflow(o, shard_key=key))
                    await call("delete", lambda f=fork_id: dbos.delete_workflow(f, shard_key=key))
        assert storm.kills > 0
        # Every call succeeded or raised a documented error: never a raw driver error, and
        # never a fork refused because its own lost attempt had created it.
        assert [(w, e) for w, e in failures if not isinstance(e, DatabaseUnavailableError)] == []
        assert len(failures) < calls
        # Consistent afterwards: every fork deleted, every original resumed (so active).
        assert await fetchval(database_url, "SELECT count(*) FROM dbos.workflow_status "
                              "WHERE forked_from IS NOT NULL") == 0
        rows = await fetch(database_url, "SELECT workflow_uuid, status FROM "
                           "dbos.workflow_status ORDER BY workflow_uuid")
        assert [r["workflow_uuid"] for r in rows] == originals
        assert {r["status"] for r in rows} <= {"ENQUEUED", "PENDING"}
        for original in originals:
            await dbos.send(original, "done", topic="go", shard_key=key)
        for original in originals:
            handle = await dbos.retrieve_workflow(original, shard_key=key)
            assert await handle.get_result() == "done"
    retried = {r.message.split(" after ")[0] for r in caplog.records
               if r.message.startswith("Retrying ")}
    # The storm hit these operations mid-way, and their retries carried them through.
    assert retried & {"Retrying cancelling workflows", "Retrying resuming workflows",
                      "Retrying deleting workflows"} or any(
        m.startswith("Retrying forking workflow") for m in retried)
