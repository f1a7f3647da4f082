"""One DBOS instance entered again and again: on one database, then another, and under
FastAPI's TestClient, which runs each lifespan on an event loop of its own."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from helpers import (
    connections_named,
    fetch,
    new_dbos,
    other_tasks,
    wait_no_connections,
    wait_until,
    workflow_row,
)

from dbos_async import DBOSError, SetWorkflowID
from dbos_async.testing import run_sync


async def test_one_instance_entered_three_times_on_two_databases(
    database_url: str, create_database: Callable[[], Awaitable[str]], admin_url: str
) -> None:
    url_a, url_b = database_url, await create_database()
    # A short grace period: exiting cancels the workflow left waiting, which stays PENDING.
    dbos = new_dbos(url_a, shutdown_grace_period=0.2)
    workflow_runs: list[str] = []  # the key of every execution of the workflow's body
    step_runs: list[str] = []  # the key of every execution of the step's body
    reached: defaultdict[str, asyncio.Event] = defaultdict(asyncio.Event)
    gates: defaultdict[str, asyncio.Event] = defaultdict(asyncio.Event)

    @dbos.step(name="double")
    async def double(key: str, x: int) -> int:
        step_runs.append(key)
        return 2 * x

    async def gated_body(key: str, x: int) -> int:
        workflow_runs.append(key)
        y = await double(key, x)
        reached[key].set()
        await gates[key].wait()
        return y

    gated = dbos.workflow(name="gated")(gated_body)

    async def leave_pending(url: str, key: str) -> None:
        """What a crashed executor leaves: ``key`` PENDING after its step, on ``url``, for
        ``dbos`` (same executor ID and version) to recover on entering."""
        other = new_dbos(url, shutdown_grace_period=0)
        other_double = other.step(name="double")(double.__wrapped__)  # type: ignore[attr-defined]

        @other.workflow(name="gated")
        async def other_gated(key: str, x: int) -> int:
            y = await other_double(key, x)
            reached[key].set()
            await asyncio.Event().wait()
            return y

        async with other:
            with SetWorkflowID(key):
                await other.start_workflow(other_gated, key, 100)
            await reached[key].wait()
        reached.pop(key)

    async def serve(n: int) -> None:
        """The work of entry ``n``: ``done-n`` runs to completion, ``pending-n`` is left
        waiting at its gate."""
        assert await connections_named(admin_url, dbos.config.connection_name) >= 1
        with pytest.raises(DBOSError, match="already"):
            async with dbos:
                pass
        with pytest.raises(DBOSError):
            dbos.configure(system_database_url=url_b)
        gates[f"done-{n}"].set()
        with SetWorkflowID(f"done-{n}"):
            assert await gated(f"done-{n}", n) == 2 * n
        with SetWorkflowID(f"pending-{n}"):
            await dbos.start_workflow(gated, f"pending-{n}", 10 * n)
        await reached[f"pending-{n}"].wait()

    async def check_exit(url: str, n: int, tasks_before: set[asyncio.Task[Any]]) -> None:
        """Nothing of entry ``n`` outlives its exit, and ``pending-n`` is left PENDING."""
        assert other_tasks() == tasks_before
        await wait_no_connections(admin_url, dbos.config.connection_name)
        done = await workflow_row(url, f"done-{n}")
        pending = await workflow_row(url, f"pending-{n}")
        assert done is not None and done["status"] == "SUCCESS"
        assert pending is not None and pending["status"] == "PENDING"

    # Every entry recovers a workflow left PENDING on its database before it.
    await leave_pending(url_a, "crashed-a")
    await leave_pending(url_b, "crashed-b")
    gates["crashed-a"].set()
    gates["crashed-b"].set()

    # Entry 1, database A, by two tasks at once: one enters, the other is refused.
    tasks_before = other_tasks()
    outcomes = await asyncio.gather(dbos.__aenter__(), dbos.__aenter__(), return_exceptions=True)
    try:
        assert outcomes.count(dbos) == 1, outcomes
        [refused] = [outcome for outcome in outcomes if outcome is not dbos]
        assert isinstance(refused, DBOSError) and "already" in str(refused), refused
        assert await (await dbos.retrieve_workflow("crashed-a")).get_result() == 200
        await serve(1)
    finally:
        if dbos in outcomes:
            await dbos.__aexit__(None, None, None)
    await check_exit(url_a, 1, tasks_before)

    # Entry 2, database B: a fresh database, with nothing to recover.
    dbos.configure(system_database_url=url_b)
    tasks_before = other_tasks()
    async with dbos:
        assert await (await dbos.retrieve_workflow("crashed-b")).get_result() == 200
        await serve(2)
    await check_exit(url_b, 2, tasks_before)
    assert await workflow_row(url_a, "done-2") is None
    assert await workflow_row(url_b, "pending-1") is None
    assert workflow_runs.count("pending-1") == 1  # not recovered on B

    # Entry 3, database A again: entering recovers pending-1, which now finishes.
    dbos.configure(system_database_url=url_a)
    gates["pending-1"].set()
    tasks_before = other_tasks()
    async with dbos:
        handle = await dbos.retrieve_workflow("pending-1")
        assert await handle.get_result() == 20
        await serve(3)
    await check_exit(url_a, 3, tasks_before)
    recovered = await workflow_row(url_a, "pending-1")
    assert recovered is not None and recovered["status"] == "SUCCESS"
    # Replayed from their checkpoints: the workflows ran again, their recorded steps did not.
    assert workflow_runs.count("pending-1") == 2 and step_runs.count("pending-1") == 1
    for crashed in ("crashed-a", "crashed-b"):
        assert workflow_runs.count(crashed) == 1 and step_runs.count(crashed) == 1
    assert await workflow_row(url_b, "pending-2") is not None  # B keeps its own PENDING one


def test_fastapi_test_client_twice_on_one_app(database_url: str) -> None:
    """Each ``with TestClient(app)`` runs the lifespan, and the requests, on an event loop
    of its own in another thread: DBOS is entered and exited once per client."""
    dbos = new_dbos(database_url)

    @dbos.step()
    async def double(x: int) -> int:
        return 2 * x

    @dbos.workflow(name="doubled")
    async def doubled(x: int) -> int:
        return await double(x)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with dbos:
            yield

    app = FastAPI(lifespan=lifespan)

    @app.post("/double/{x}")
    async def run_doubled(x: int) -> dict[str, Any]:
        handle = await dbos.start_workflow(doubled, x)
        return {"workflow_id": handle.workflow_id, "result": await handle.get_result()}

    served: list[str] = []
    for x in (1, 2):
        with TestClient(app) as client:
            response = client.post(f"/double/{x}")
            assert response.status_code == 200, response.text
            body = response.json()
            assert body["result"] == 2 * x
            served.append(body["workflow_id"])

    rows = run_sync(fetch(database_url, "SELECT workflow_uuid, status FROM dbos.workflow_status "
                                        "WHERE name = 'doubled' ORDER BY created_at"))
    assert [(r["workflow_uuid"], r["status"]) for r in rows] == [(served[0], "SUCCESS"),
                                                                 (served[1], "SUCCESS")]


async def test_a_cancelled_exit_still_leaves_nothing_running(database_url: str) -> None:
    """Cancelling the task that leaves ``async with dbos:`` during the grace period stops
    the rest at once: the clean-up is shielded, no task or connection is left, and the
    interrupted workflow stays PENDING for recovery. The instance can be entered again."""
    dbos = new_dbos(database_url, shutdown_grace_period=60)
    started = asyncio.Event()

    @dbos.workflow(name="forever")
    async def forever() -> None:
        started.set()
        await asyncio.Event().wait()

    before = other_tasks()

    async def serve() -> None:
        async with dbos:
            with SetWorkflowID("forever-1"):
                await dbos.start_workflow(forever)
            await started.wait()

    server = asyncio.ensure_future(serve())
    await started.wait()
    stopping = asyncio.Event()

    async def exit_began() -> bool:
        runtime = dbos._runtime
        if runtime is not None and runtime.state == "stopping":
            stopping.set()
        return stopping.is_set()

    await wait_until(exit_began, what="the exit to wait for the running workflow")
    server.cancel()
    with pytest.raises(asyncio.CancelledError):
        await server
    assert other_tasks() - before == set()
    await wait_no_connections(database_url, dbos.config.connection_name)
    row = await workflow_row(database_url, "forever-1")
    assert row is not None and row["status"] == "PENDING"
    dbos.configure(shutdown_grace_period=0)
    async with dbos:  # recovers it
        runtime = dbos._current_runtime
        assert ("forever-1", None) in runtime.running()
