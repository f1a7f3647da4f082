"""Executor IDs of processes started from one configuration.

Each process claims the first free ID of ``local``, ``local-2``, ... (or of a given
``executor_id``, ``<id>-2``, ...) by holding an advisory
lock on a connection of its own, so live processes never share one and none recovers
another live one's workflows; a killed process frees its ID for the next process, which
recovers what it left. Real processes (``tests/helpers/executor_id_worker.py``), killed
with SIGKILL; the lock's connection is terminated from the server to lose it.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from helpers import execute, fetch, fetchval, wait_until

from dbos_async import DBOS, DBOSClient, ExecutorIdLostError, SetWorkflowID

WORKER = Path(__file__).resolve().parents[1] / "helpers" / "executor_id_worker.py"
PATIENCE = 60.0


class Worker:
    def __init__(self, proc: asyncio.subprocess.Process, info: dict[str, Any]) -> None:
        self.proc = proc
        self.executor_id: str = info["executor_id"]
        self.pid: int = info["pid"]

    async def kill(self) -> None:
        self.proc.kill()  # SIGKILL: no shutdown code runs, as in a crash
        await self.proc.wait()


@pytest.fixture
async def workers(database_url: str) -> AsyncIterator[list[Worker]]:
    """Started workers, stopped (stdin closed, then killed if need be) after the test."""
    started: list[Worker] = []
    await execute(database_url, "CREATE TABLE runs (workflow_id text, pid integer)")
    yield started
    for worker in started:
        if worker.proc.returncode is None:
            assert worker.proc.stdin is not None
            worker.proc.stdin.close()
            try:
                await asyncio.wait_for(worker.proc.wait(), PATIENCE)
            except TimeoutError:
                await worker.kill()


async def start_worker(url: str, workers: list[Worker], workflow_id: str,
                       executor_id: str | None = None) -> Worker:
    args = [url, workflow_id] + ([executor_id] if executor_id is not None else [])
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(WORKER), *args, stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    assert proc.stdout is not None
    line = await asyncio.wait_for(proc.stdout.readline(), PATIENCE)
    if not line:
        _, err = await proc.communicate()
        raise AssertionError(f"the worker exited: {err.decode()}")
    worker = Worker(proc, json.loads(line))
    workers.append(worker)
    return worker


async def wait_marked(url: str, workflow_id: str) -> None:
    """Wait until the workflow's step is checkpointed (so a kill after it does not run the
    step again: before its checkpoint, a step is at least once)."""
    async def marked() -> bool:
        return bool(await fetchval(url, """SELECT count(*) FROM dbos.operation_outputs
                                           WHERE workflow_uuid = $1 AND function_name = 'mark'""",
                                   workflow_id))

    await wait_until(marked, patience=PATIENCE, what=f"{workflow_id}'s step")


async def runs(url: str, workflow_id: str) -> list[int]:
    rows = await fetch(url, "SELECT pid FROM runs WHERE workflow_id = $1", workflow_id)
    return [row["pid"] for row in rows]


async def executor_id_locks(url: str) -> int:
    """Session advisory locks held in this (fresh) database: one per claimed executor ID."""
    return int(await fetchval(url, """
        SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted
          AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"""))


async def finish(url: str, workflow_id: str) -> int:
    """Let ``hold`` under ``workflow_id`` finish; the pid of the process that finished it."""
    async with DBOSClient(system_database_url=url, result_poll_interval=0.05) as client:
        await client.send(workflow_id, "go", topic="go")
        handle = await client.retrieve_workflow(workflow_id)
        result: int = await asyncio.wait_for(handle.get_result(), PATIENCE)
        return result


async def test_processes_from_one_configuration_get_distinct_ids_and_keep_their_work(
    database_url: str, workers: list[Worker],
) -> None:
    url = database_url
    first = await start_worker(url, workers, "wf-first")
    second = await start_worker(url, workers, "wf-second")
    assert {first.executor_id, second.executor_id} == {"local", "local-2"}
    await wait_marked(url, "wf-first")
    await wait_marked(url, "wf-second")

    # A third process, while both live, takes the next ID and recovers neither's work.
    third = await start_worker(url, workers, "wf-third")
    assert third.executor_id == "local-3"
    assert await executor_id_locks(url) == 3
    assert await finish(url, "wf-second") == second.pid
    assert await runs(url, "wf-second") == [second.pid]

    # Killed, the first frees its ID; the next process gets it and recovers its workflow,
    # whose step (checkpointed) does not run again.
    await first.kill()

    async def freed() -> bool:
        return await executor_id_locks(url) == 2

    await wait_until(freed, patience=PATIENCE, what="the killed process's session to end")
    fourth = await start_worker(url, workers, "wf-fourth")
    assert fourth.executor_id == first.executor_id
    assert await finish(url, "wf-first") == fourth.pid
    assert await runs(url, "wf-first") == [first.pid]
    # The third one's workflow is still its own.
    assert await finish(url, "wf-third") == third.pid
    statuses = await fetch(url, "SELECT workflow_uuid, executor_id FROM dbos.workflow_status "
                                "WHERE name = 'hold' ORDER BY workflow_uuid")
    assert {r["workflow_uuid"]: r["executor_id"] for r in statuses} == {
        "wf-first": first.executor_id, "wf-second": second.executor_id,
        "wf-third": "local-3", "wf-fourth": first.executor_id}


async def test_a_restarted_single_process_gets_local_back_and_recovers(
    database_url: str, workers: list[Worker],
) -> None:
    url = database_url
    only = await start_worker(url, workers, "wf-only")
    assert only.executor_id == "local"
    await wait_marked(url, "wf-only")
    await only.kill()

    async def freed() -> bool:
        return await executor_id_locks(url) == 0

    await wait_until(freed, patience=PATIENCE, what="the killed process's session to end")
    again = await start_worker(url, workers, "wf-again")
    assert again.executor_id == "local"
    assert await finish(url, "wf-only") == again.pid
    assert await runs(url, "wf-only") == [only.pid]


async def test_a_given_executor_id_is_claimed_and_never_shared(
    database_url: str, workers: list[Worker], monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two replicas configured with one ID: the second runs as ``<id>-2``, so neither's
    recovery takes over the other's running workflow (each step runs once)."""
    url = database_url
    given = await start_worker(url, workers, "wf-given", "given-id")
    assert given.executor_id == "given-id"
    assert await executor_id_locks(url) == 1
    await wait_marked(url, "wf-given")
    replica = await start_worker(url, workers, "wf-replica", "given-id")
    assert replica.executor_id == "given-id-2"
    assert await executor_id_locks(url) == 2
    # So is one from the environment (the dbos package's DBOS__VMID).
    monkeypatch.setenv("DBOS__VMID", "from-env")
    dbos = DBOS(system_database_url=url, application_version="executor-id-test")
    assert dbos.executor_id == "from-env"
    async with dbos:
        assert dbos.executor_id == "from-env"
        assert await executor_id_locks(url) == 3
    # Unset, the ID is claimed on entry.
    monkeypatch.delenv("DBOS__VMID")
    claimed = DBOS(system_database_url=url, application_version="executor-id-test")
    assert claimed.executor_id is None
    async with claimed:
        assert claimed.executor_id == "local"
        assert await executor_id_locks(url) == 3
    assert await executor_id_locks(url) == 2  # released on exit
    assert await finish(url, "wf-given") == given.pid
    assert await finish(url, "wf-replica") == replica.pid
    assert await runs(url, "wf-given") == [given.pid]
    assert await runs(url, "wf-replica") == [replica.pid]


async def lock_holder(url: str) -> asyncpg.Record:
    rows = await fetch(url, """
        SELECT pid, classid::bigint AS classid, objid::bigint AS objid FROM pg_locks
        WHERE locktype = 'advisory' AND granted
          AND database = (SELECT oid FROM pg_database WHERE datname = current_database())""")
    [row] = rows
    return row


async def test_a_lost_lock_connection_reacquires_the_same_id(database_url: str) -> None:
    url = database_url
    dbos = DBOS(system_database_url=url, application_version="executor-id-test",
                connection_name="lock_loss_test")

    @dbos.workflow(name="quick")
    async def quick() -> str:
        return "ok"

    async with dbos:
        before = await lock_holder(url)
        await execute(url, "SELECT pg_terminate_backend($1::integer, 10000::bigint)", before["pid"])

        async def reacquired() -> bool:
            rows = await fetch(url, """SELECT pid FROM pg_locks WHERE locktype = 'advisory'
                                       AND granted AND classid::bigint = $1
                                       AND objid::bigint = $2""",
                               before["classid"], before["objid"])
            return bool(rows) and rows[0]["pid"] != before["pid"]

        await wait_until(reacquired, patience=PATIENCE, what="the ID to be re-acquired")
        assert dbos.executor_id == "local"
        with SetWorkflowID("after-loss"):
            assert await quick() == "ok"
        owner = await fetchval(url, "SELECT application_name FROM pg_stat_activity "
                                    "WHERE pid = $1", (await lock_holder(url))["pid"])
        assert owner == "lock_loss_test"


async def test_an_id_taken_while_its_connection_was_down_stops_new_work(
    database_url: str, caplog: pytest.LogCaptureFixture,
) -> None:
    """Another session queued on the lock gets the ID the moment the holder's session ends
    (PostgreSQL grants waiting lockers first): the executor cannot re-acquire it, logs an
    error, and refuses new starts instead of running under an ID it no longer holds."""
    url = database_url
    dbos = DBOS(system_database_url=url, application_version="executor-id-test")

    @dbos.workflow(name="quick")
    async def quick() -> str:
        return "ok"

    taker = await asyncpg.connect(url)
    try:
        async with dbos:
            holder = await lock_holder(url)
            key = (holder["classid"] << 32) | holder["objid"]
            signed = key - (1 << 64) if key >= 1 << 63 else key
            waiting = asyncio.ensure_future(taker.execute("SELECT pg_advisory_lock($1)", signed))

            async def queued() -> bool:
                return bool(await fetchval(url, """
                    SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'
                      AND NOT granted AND pid = $1""", taker.get_server_pid()))

            await wait_until(queued, patience=PATIENCE, what="the taker to queue on the lock")
            await execute(url, "SELECT pg_terminate_backend($1::integer, 10000::bigint)",
                          holder["pid"])
            await asyncio.wait_for(waiting, PATIENCE)

            async def refused() -> bool:
                try:
                    with SetWorkflowID(f"probe-{asyncio.get_running_loop().time()}"):
                        await quick()
                except ExecutorIdLostError:
                    return True
                return False

            await wait_until(refused, patience=PATIENCE, what="new starts to be refused")
            with pytest.raises(ExecutorIdLostError, match="'local'"):
                await dbos.recover_pending_workflows()
    finally:
        await taker.close()
    assert any("was taken by another process" in r.getMessage() and r.levelname == "ERROR"
               for r in caplog.records)
    # Nothing was started under the lost ID once it was found lost.
    assert not await fetch(url, "SELECT 1 FROM dbos.workflow_status ws WHERE status <> "
                                "'SUCCESS'")
