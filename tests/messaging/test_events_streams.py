"""Events, streams, completion notifications and wait_first/wait_all on a real PostgreSQL."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import asyncpg
import pytest
from helpers import messaging_settings, new_dbos

from dbos_async import DBOS, NonExistentWorkflowError, SetWorkflowID


async def test_events_inside_and_outside(database_url: str, conn: asyncpg.Connection,
                                         listen: bool) -> None:
    dbos = new_dbos(database_url, **messaging_settings(listen))

    @dbos.step()
    async def publish_from_step() -> None:
        await dbos.set_event("step", "from-step")

    @dbos.workflow()
    async def publisher() -> None:
        await dbos.set_event("status", "starting")
        await dbos.recv(timeout=10)
        await dbos.set_event("status", {"phase": 2})
        await publish_from_step()

    @dbos.workflow()
    async def reader(target: str) -> list[Any]:
        return [await dbos.get_event(target, "status", timeout=10),
                await dbos.get_event(target, "missing", timeout=0.2)]

    async with dbos:
        with SetWorkflowID("p"):
            handle = await dbos.start_workflow(publisher)
        assert await dbos.get_event("p", "status", timeout=10) == "starting"
        with SetWorkflowID("reader"):
            assert await reader("p") == ["starting", None]
        await dbos.send("p", "go")
        await handle.get_result()
        assert await dbos.get_all_events("p") == {"status": {"phase": 2}, "step": "from-step"}
        assert await dbos.get_event("p", "none", timeout=0) is None
    history = await conn.fetch("SELECT function_id, key, value FROM "
                               "dbos.workflow_events_history ORDER BY function_id")
    assert [tuple(r) for r in history] == [(0, "status", '"starting"'),
                                           (3, "status", '{"phase":2}')]
    steps = await conn.fetch("SELECT function_id, function_name, output FROM "
                             "dbos.operation_outputs WHERE workflow_uuid = 'reader' "
                             "ORDER BY function_id")
    assert [(r[0], r[1]) for r in steps] == [(0, "DBOS.getEvent"), (1, "DBOS.sleep"),
                                             (2, "DBOS.getEvent"), (3, "DBOS.sleep")]
    assert steps[0][2] == '"starting"' and steps[2][2] == "null"


async def test_get_event_wakes_promptly(database_url: str) -> None:
    dbos = new_dbos(database_url, **messaging_settings(notification_poll_interval=60))

    @dbos.workflow()
    async def publisher() -> None:
        await dbos.recv(timeout=10)
        await dbos.set_event("k", 42)

    async with dbos:
        for i in range(15):
            with SetWorkflowID(f"p{i}"):
                await dbos.start_workflow(publisher)
            waiter = asyncio.ensure_future(dbos.get_event(f"p{i}", "k", timeout=30))
            await asyncio.sleep(0.002 * (i % 3))
            await dbos.send(f"p{i}", "go")
            async with asyncio.timeout(5):
                assert await waiter == 42


async def test_get_event_replays_recorded_value(database_url: str,
                                                conn: asyncpg.Connection) -> None:
    dbos = new_dbos(database_url, **messaging_settings())

    @dbos.workflow()
    async def setter() -> None:
        await dbos.set_event("v", 1)

    @dbos.workflow(name="getter")
    async def getter() -> Any:
        return await dbos.get_event("s", "v", timeout=5)

    async with dbos:
        with SetWorkflowID("s"):
            await setter()
        with SetWorkflowID("g"):
            assert await getter() == 1
    await conn.execute("UPDATE dbos.workflow_events SET value = '2'")
    await conn.execute("UPDATE dbos.workflow_status SET status = 'PENDING', owner_xid = 'x' "
                       "WHERE workflow_uuid = 'g'")
    dbos2 = new_dbos(database_url, **messaging_settings())
    dbos2.workflow(name="getter")(getter.__wrapped__)  # type: ignore[attr-defined]
    async with dbos2:
        assert await (await dbos2.retrieve_workflow("g")).get_result() == 1


async def test_streams(database_url: str, conn: asyncpg.Connection, listen: bool) -> None:
    dbos = new_dbos(database_url, **messaging_settings(listen))

    @dbos.step(name="from_step")
    async def from_step() -> None:
        await dbos.write_stream("s", "step-value")

    @dbos.workflow()
    async def writer() -> None:
        await dbos.write_stream("s", {"i": 0})
        await dbos.recv(timeout=10)
        await dbos.write_stream("s", {"i": 1})
        await from_step()
        await dbos.close_stream("s")
        await dbos.write_stream("open", 7)

    async with dbos:
        with SetWorkflowID("w"):
            handle = await dbos.start_workflow(writer)
        reader = asyncio.ensure_future(_collect(dbos, "w", "s"))
        await asyncio.sleep(0.3)
        assert not reader.done()
        await dbos.send("w", "go")
        async with asyncio.timeout(10):
            assert await reader == [{"i": 0}, {"i": 1}, "step-value"]
        await handle.get_result()
        assert await _collect(dbos, "w", "s", 1) == [{"i": 1}, "step-value"]
        # Never closed, but the writer finished: the read ends after what is there.
        assert await _collect(dbos, "w", "open") == [7]
        with pytest.raises(NonExistentWorkflowError):
            await _collect(dbos, "nobody", "s")
    rows = await conn.fetch("""SELECT "offset", value, function_id FROM dbos.streams
                               WHERE key = 's' ORDER BY "offset" """)
    assert [r["value"] for r in rows] == ['{"i":0}', '{"i":1}', '"step-value"',
                                          '"__DBOS_STREAM_CLOSED__"']
    steps = await conn.fetch("SELECT function_name FROM dbos.operation_outputs "
                             "WHERE workflow_uuid = 'w' ORDER BY function_id")
    assert [r[0] for r in steps] == ["DBOS.writeStream", "DBOS.recv", "DBOS.sleep",
                                     "DBOS.writeStream", "from_step", "DBOS.closeStream",
                                     "DBOS.writeStream"]


async def test_concurrent_stream_writes(database_url: str) -> None:
    dbos = new_dbos(database_url, **messaging_settings())

    @dbos.workflow()
    async def writer() -> None:
        await asyncio.gather(*(dbos.write_stream("s", i) for i in range(20)))
        await dbos.close_stream("s")

    async with dbos:
        with SetWorkflowID("w"):
            await writer()
        assert sorted(await _collect(dbos, "w", "s")) == list(range(20))


async def _collect(dbos: DBOS, workflow_id: str, key: str, offset: int = 0) -> list[Any]:
    return [value async for value in dbos.read_stream(workflow_id, key, offset)]


async def test_remote_get_result_wakes_on_completion(database_url: str) -> None:
    """A handle in another executor wakes on the completion notification, not a poll."""
    a = new_dbos(database_url, **messaging_settings(executor_id="a"))
    b = new_dbos(database_url, **messaging_settings(executor_id="b", result_poll_interval=30))

    @a.workflow(name="slow")
    async def slow() -> str:
        await a.sleep(0.3)
        return "done"

    @b.workflow(name="slow")
    async def slow_b() -> str:
        return "unused"

    async with a, b:
        with SetWorkflowID("remote"):
            await a.start_workflow(slow)
        handle = await b.retrieve_workflow("remote")
        t0 = time.monotonic()
        async with asyncio.timeout(10):
            assert await handle.get_result() == "done"
        assert time.monotonic() - t0 < 5


async def test_wait_first_and_all(database_url: str) -> None:
    dbos = new_dbos(database_url, **messaging_settings())

    @dbos.workflow()
    async def napper(seconds: float) -> float:
        await dbos.sleep(seconds)
        return seconds

    @dbos.workflow()
    async def failing() -> None:
        raise ValueError("no")

    async with dbos:
        handles = [await dbos.start_workflow(napper, s) for s in (0.6, 0.05, 0.4)]
        first = await dbos.wait_first(handles)
        assert first is handles[1]
        assert await dbos.wait_all(handles) == [0.6, 0.05, 0.4]
        bad = await dbos.start_workflow(failing)
        assert await dbos.wait_first([handles[0], bad]) in (handles[0], bad)
        with pytest.raises(ValueError):
            await dbos.wait_all([handles[0], bad])
