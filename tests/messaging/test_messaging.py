"""send/recv and durable sleep against a real PostgreSQL, with LISTEN/NOTIFY on and off."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import asyncpg
import messaging_worker
import pytest
from helpers import messaging_settings, new_dbos

from dbos_async import NonExistentWorkflowError, SetWorkflowID

HERE = Path(__file__).resolve().parents[1]


async def steps_of(conn: asyncpg.Connection, workflow_id: str) -> list[tuple[int, str, Any]]:
    rows = await conn.fetch(
        "SELECT function_id, function_name, output FROM dbos.operation_outputs "
        "WHERE workflow_uuid = $1 ORDER BY function_id", workflow_id)
    return [(r["function_id"], r["function_name"], r["output"]) for r in rows]


async def test_order_topics_and_outside_send(database_url: str, listen: bool) -> None:
    dbos = new_dbos(database_url, **messaging_settings(listen))

    @dbos.workflow()
    async def receiver() -> list[Any]:
        got = [await dbos.recv("t", timeout=10) for _ in range(3)]
        got.append(await dbos.recv(timeout=10))
        got.append(await dbos.recv("other", timeout=10))
        return got

    async with dbos:
        with SetWorkflowID("r"):
            handle = await dbos.start_workflow(receiver)
        for i in range(3):
            await dbos.send("r", {"n": i}, "t")
        await dbos.send("r", "untitled")
        await dbos.send("r", [1, 2], "other")
        assert await handle.get_result() == [{"n": 0}, {"n": 1}, {"n": 2}, "untitled", [1, 2]]


async def test_send_from_workflow_is_recorded_once(
    database_url: str, conn: asyncpg.Connection
) -> None:
    dbos = new_dbos(database_url, **messaging_settings())

    @dbos.workflow()
    async def receiver() -> Any:
        return await dbos.recv(timeout=10)

    @dbos.workflow()
    async def sender(dest: str) -> None:
        await dbos.send(dest, "hi", idempotency_key="k1")

    async with dbos:
        with SetWorkflowID("r"):
            handle = await dbos.start_workflow(receiver)
        with SetWorkflowID("s"):
            await sender("r")
        assert await handle.get_result() == "hi"
        assert await steps_of(conn, "s") == [(0, "DBOS.send", None)]
        row = await conn.fetchrow("SELECT * FROM dbos.notifications")
        assert row["message_uuid"] == "k1::r" and row["consumed"]
        assert row["topic"] == "__null__topic__" and row["consumed_by_function_id"] == 0


async def test_idempotency_key_delivers_once(database_url: str, listen: bool) -> None:
    dbos = new_dbos(database_url, **messaging_settings(listen))

    @dbos.workflow()
    async def receiver() -> list[Any]:
        return [await dbos.recv(timeout=5), await dbos.recv(timeout=0.3)]

    async with dbos:
        with SetWorkflowID("r"):
            handle = await dbos.start_workflow(receiver)
        await dbos.send("r", "once", idempotency_key="same")
        await dbos.send("r", "once", idempotency_key="same")
        assert await handle.get_result() == ["once", None]


async def test_missing_destination(database_url: str, conn: asyncpg.Connection) -> None:
    dbos = new_dbos(database_url, **messaging_settings())

    @dbos.workflow()
    async def sender() -> str:
        try:
            await dbos.send("nobody", 1)
        except NonExistentWorkflowError:
            return "missing"
        return "sent"

    async with dbos:
        with pytest.raises(NonExistentWorkflowError):
            await dbos.send("nobody", 1)
        with SetWorkflowID("s"):
            assert await sender() == "missing"
        # Recorded as the send's outcome, so a replay raises it too.
        [(fid, name, _)] = await steps_of(conn, "s")
        assert (fid, name) == (0, "DBOS.send")


async def test_recv_timeout_records_deadline(database_url: str, conn: asyncpg.Connection,
                                             listen: bool) -> None:
    dbos = new_dbos(database_url, **messaging_settings(listen))

    @dbos.workflow()
    async def receiver() -> Any:
        return await dbos.recv("x", timeout=0.3)

    async with dbos:
        before = int(time.time() * 1000)
        with SetWorkflowID("r"):
            assert await receiver() is None
        steps = await steps_of(conn, "r")
        assert [s[:2] for s in steps] == [(0, "DBOS.recv"), (1, "DBOS.sleep")]
        assert steps[0][2] == "null"
        assert before + 300 <= int(steps[1][2]) <= before + 2000


async def test_send_from_step_and_sql_function(database_url: str, conn: asyncpg.Connection,
                                               listen: bool) -> None:
    dbos = new_dbos(database_url, **messaging_settings(listen))

    @dbos.step()
    async def notify(dest: str) -> None:
        await dbos.send(dest, "from-step", "t")

    @dbos.workflow()
    async def sender(dest: str) -> None:
        await notify(dest)

    @dbos.workflow()
    async def receiver() -> list[Any]:
        return [await dbos.recv("t", timeout=10), await dbos.recv("sql", timeout=10)]

    async with dbos:
        with SetWorkflowID("r"):
            handle = await dbos.start_workflow(receiver)
        await sender("r")
        await asyncio.sleep(0.2)  # the receiver is now waiting on "sql"
        t0 = time.monotonic()
        await conn.execute("SELECT dbos.send_message('r', '{\"a\": 1}'::json, 'sql')")
        assert await handle.get_result() == ["from-step", {"a": 1}]
        assert time.monotonic() - t0 < 3


async def test_replay_returns_same_values(database_url: str, conn: asyncpg.Connection) -> None:
    dbos = new_dbos(database_url, **messaging_settings())

    @dbos.workflow(name="replayed")
    async def receiver() -> list[Any]:
        got = [await dbos.recv(timeout=5), await dbos.recv(timeout=0.1)]
        await dbos.sleep(0.05)
        return got

    async with dbos:
        with SetWorkflowID("r"):
            handle = await dbos.start_workflow(receiver)
        await dbos.send("r", "m1")
        first = await handle.get_result()
    assert first == ["m1", None]
    before = await steps_of(conn, "r")
    # Make the workflow pending again: recovery replays it from its checkpoints.
    await conn.execute("UPDATE dbos.workflow_status SET status = 'PENDING', "
                       "owner_xid = 'old' WHERE workflow_uuid = 'r'")
    await conn.execute("DELETE FROM dbos.workflow_output")
    # A message that must not be consumed by the replay.
    await conn.execute("SELECT dbos.send_message('r', '\"late\"'::json)")
    dbos2 = new_dbos(database_url, **messaging_settings())
    dbos2.workflow(name="replayed")(receiver.__wrapped__)  # type: ignore[attr-defined]
    async with dbos2:
        handle2 = await dbos2.retrieve_workflow("r")
        assert await handle2.get_result() == ["m1", None]
    assert await steps_of(conn, "r") == before
    assert await conn.fetchval("SELECT count(*) FROM dbos.notifications WHERE NOT consumed") == 1


async def test_concurrent_waiters(database_url: str, listen: bool) -> None:
    dbos = new_dbos(database_url, **messaging_settings(listen, pool_size=6))

    @dbos.workflow()
    async def receiver() -> Any:
        return await dbos.recv(timeout=20)

    async with dbos:
        handles = []
        for i in range(40):
            with SetWorkflowID(f"r{i}"):
                handles.append(await dbos.start_workflow(receiver))
        await asyncio.gather(*(dbos.send(f"r{i}", i) for i in range(40)))
        async with asyncio.timeout(15):
            assert await dbos.wait_all(handles) == list(range(40))


async def test_a_thousand_waiting_workflows_hold_no_threads(database_url: str,
                                                            conn: asyncpg.Connection) -> None:
    """Waiting workflows are tasks: no thread each, and a small pool serves them all."""
    dbos = new_dbos(database_url, **messaging_settings(pool_size=4))

    @dbos.workflow()
    async def receiver() -> Any:
        return await dbos.recv(timeout=120)

    threads = threading.active_count()
    async with dbos:
        handles = []
        for i in range(1000):
            with SetWorkflowID(f"many-{i}"):
                handles.append(await dbos.start_workflow(receiver))
        assert threading.active_count() == threads
        pending = await conn.fetchval("SELECT count(*) FROM dbos.workflow_status "
                                      "WHERE status = 'PENDING' AND workflow_uuid LIKE 'many-%'")
        assert pending == 1000  # all still waiting
        await asyncio.gather(*(dbos.send(f"many-{i}", i) for i in range(1000)))
        async with asyncio.timeout(60):
            assert await dbos.wait_all(handles) == list(range(1000))
        assert threading.active_count() == threads


async def test_race_send_against_recv(database_url: str) -> None:
    """Sends racing the receiver's registration: no wake-up may be lost."""
    dbos = new_dbos(database_url, **messaging_settings(notification_poll_interval=60))

    @dbos.workflow()
    async def receiver() -> Any:
        return await dbos.recv(timeout=30)

    async with dbos:
        for i in range(40):
            with SetWorkflowID(f"race{i}"):
                handle = await dbos.start_workflow(receiver)
            await asyncio.sleep((i % 5) * 0.002)
            await dbos.send(f"race{i}", i)
            async with asyncio.timeout(5):  # far below recv's timeout
                assert await handle.get_result() == i


async def test_race_remote_sender(database_url: str, conn: asyncpg.Connection) -> None:
    """A sender in another session (only the trigger's NOTIFY reaches us)."""
    dbos = new_dbos(database_url, **messaging_settings(notification_poll_interval=60))

    @dbos.workflow()
    async def receiver() -> Any:
        return await dbos.recv(timeout=30)

    async with dbos:
        for i in range(30):
            with SetWorkflowID(f"remote{i}"):
                handle = await dbos.start_workflow(receiver)
            await asyncio.sleep((i % 4) * 0.003)
            await conn.execute("SELECT dbos.send_message($1, $2::json)", f"remote{i}",
                               json.dumps(i))
            async with asyncio.timeout(5):
                assert await handle.get_result() == i


async def test_sleep_records_wakeup(database_url: str, conn: asyncpg.Connection) -> None:
    dbos = new_dbos(database_url, **messaging_settings())

    @dbos.workflow()
    async def sleeper() -> str:
        await dbos.sleep(0.2)
        return "done"

    async with dbos:
        t0 = time.monotonic()
        with SetWorkflowID("z"):
            assert await sleeper() == "done"
        assert time.monotonic() - t0 >= 0.19
        await dbos.sleep(0.01)  # outside a workflow: a plain sleep
    [(fid, name, output)] = await steps_of(conn, "z")
    row = await conn.fetchrow("SELECT started_at_epoch_ms, completed_at_epoch_ms "
                              "FROM dbos.operation_outputs WHERE workflow_uuid = 'z'")
    assert (fid, name) == (0, "DBOS.sleep")
    assert int(output) == row["completed_at_epoch_ms"] >= row["started_at_epoch_ms"] + 200


@pytest.mark.parametrize("workflow", ["long_recv", "long_sleep", "long_get_event"])
async def test_recovered_wait_takes_only_the_remainder(
    database_url: str, conn: asyncpg.Connection, workflow: str
) -> None:
    """SIGKILL a process during a long wait; the recovered workflow keeps the recorded deadline."""
    args = [sys.executable, str(HERE / "messaging_worker.py"), database_url, workflow, "w"]
    if workflow == "long_get_event":
        args.append("w")
    proc = await asyncio.create_subprocess_exec(*args, stdout=asyncio.subprocess.DEVNULL,
                                                env={**os.environ})
    try:
        deadline_row = None
        async with asyncio.timeout(30):
            while deadline_row is None:
                await asyncio.sleep(0.05)
                try:
                    deadline_row = await conn.fetchrow(
                        "SELECT function_id, output FROM dbos.operation_outputs "
                        "WHERE workflow_uuid = 'w' AND function_name = 'DBOS.sleep'")
                except asyncpg.UndefinedTableError:  # not migrated yet
                    continue
    finally:
        proc.send_signal(signal.SIGKILL)
        await proc.wait()
    deadline = int(deadline_row["output"])
    assert await conn.fetchval(
        "SELECT status FROM dbos.workflow_status WHERE workflow_uuid = 'w'") == "PENDING"
    dbos = messaging_worker.build(database_url)
    async with dbos:
        handle = await dbos.retrieve_workflow("w")
        result = await handle.get_result()
        finished = int(time.time() * 1000)
    assert result == ("awake" if workflow == "long_sleep" else None)
    # Woke at the recorded deadline, not a full timeout after recovery.
    assert finished >= deadline - 50
    assert finished < deadline + 2500
    rows = await conn.fetch("SELECT function_id, output FROM dbos.operation_outputs "
                            "WHERE workflow_uuid = 'w' AND function_name = 'DBOS.sleep'")
    assert [(r["function_id"], r["output"]) for r in rows] == [
        (deadline_row["function_id"], deadline_row["output"])
    ]
