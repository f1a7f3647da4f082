"""A workflow's status reads (``get_workflow_status``, ``handle.get_status()``) and stream
reads are checkpoints: a replay (a fork, a recovery) sees what the first run saw, even after
the state read has changed. The same reads elsewhere are plain reads."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import pytest
from helpers import new_dbos, step_rows

from dbos_async import (
    DBOS,
    DBOSClient,
    DBOSError,
    SetShardKey,
    SetWorkflowID,
    StreamTimeoutError,
)

SHARDING = pytest.mark.parametrize("sharding", [False, True], ids=["unsharded", "sharded"])
KEY = "tenant-1"


def under_key(sharding: bool) -> Any:
    return SetShardKey(KEY) if sharding else contextlib.nullcontext()


@SHARDING
async def test_status_reads_replay_the_recorded_status(database_url: str,
                                                       sharding: bool) -> None:
    dbos = new_dbos(database_url, sharding=sharding)
    release = asyncio.Event()
    key = KEY if sharding else None

    @dbos.workflow(name="target")
    async def target() -> str:
        await release.wait()
        return "done"

    @dbos.workflow(name="watcher")
    async def watcher() -> list[Any]:
        first = await dbos.get_workflow_status("target", shard_key=key)
        handle = await dbos.retrieve_workflow("target", shard_key=key)
        second = await handle.get_status()
        missing = await dbos.get_workflow_status("nobody", shard_key=key)
        assert first is not None
        return [first.status, second.status, second.name, first.shard_key, missing]

    async with dbos:
        with under_key(sharding), SetWorkflowID("target"):
            target_handle = await dbos.start_workflow(target)
        with under_key(sharding), SetWorkflowID("watcher"):
            assert await watcher() == ["PENDING", "PENDING", "target", key, None]
        # (step_rows reads by ID alone: each test uses one key.)
        assert [(r.function_id, r.function_name) for r in await step_rows(
            database_url, "watcher")] == [
            (0, "DBOS.getStatus"), (1, "DBOS.getStatus"), (2, "DBOS.getStatus")]

        release.set()
        assert await target_handle.get_result() == "done"
        # Replayed from the checkpoints: the status as the first run saw it.
        replayed = await dbos.fork_workflow("watcher", 3, shard_key=key)
        assert await replayed.get_result() == ["PENDING", "PENDING", "target", key, None]
        # Read again from step 1 on: the first read replays, the others see the change.
        partly = await dbos.fork_workflow("watcher", 1, shard_key=key)
        assert await partly.get_result() == ["PENDING", "SUCCESS", "target", key, None]

        # Outside a workflow the reads are plain: nothing is recorded anywhere.
        status = await dbos.get_workflow_status("target", shard_key=key)
        assert status is not None and status.status == "SUCCESS"
        assert (await target_handle.get_status()).status == "SUCCESS"
        assert await step_rows(database_url, "target") == []


@SHARDING
async def test_stream_reads_replay_the_recorded_values(database_url: str,
                                                       sharding: bool) -> None:
    dbos = new_dbos(database_url, sharding=sharding)
    key = KEY if sharding else None

    @dbos.workflow(name="writer")
    async def writer(values: list[int]) -> None:
        for value in values:
            await dbos.write_stream("numbers", value)
        await dbos.close_stream("numbers")

    @dbos.workflow(name="reader")
    async def reader() -> list[int]:
        return [v async for v in dbos.read_stream("writer", "numbers", shard_key=key)]

    async with dbos:
        with under_key(sharding), SetWorkflowID("writer"):
            await writer([1, 2])
        with under_key(sharding), SetWorkflowID("reader"):
            assert await reader() == [1, 2]
        assert [(r.function_name, r.output) for r in await step_rows(database_url, "reader")] \
            == [("DBOS.readStream", 1), ("DBOS.readStream", 2),
                ("DBOS.readStream", "__DBOS_STREAM_CLOSED__")]

        # The stream is gone, and then written again differently: a replay of the reader
        # still yields what it read the first time.
        await dbos.delete_workflow("writer", shard_key=key)
        with under_key(sharding), SetWorkflowID("writer"):
            await writer([7])
        replayed = await dbos.fork_workflow("reader", 3, shard_key=key)
        assert await replayed.get_result() == [1, 2]
        partly = await dbos.fork_workflow("reader", 1, shard_key=key)
        assert await partly.get_result() == [1]  # offset 1 of the new stream: its end
        fresh = await dbos.fork_workflow("reader", 0, shard_key=key)
        assert await fresh.get_result() == [7]

        # Outside a workflow a read records nothing.
        assert [v async for v in dbos.read_stream("writer", "numbers", shard_key=key)] == [7]
        assert [r.function_name for r in await step_rows(database_url, "writer")] == [
            "DBOS.writeStream", "DBOS.closeStream"]


async def test_a_stream_timeout_is_recorded_and_replayed(database_url: str) -> None:
    dbos = new_dbos(database_url)
    go = asyncio.Event()

    @dbos.workflow(name="slow_writer")
    async def slow_writer() -> None:
        await go.wait()
        await dbos.write_stream("s", "late")
        await dbos.close_stream("s")

    @dbos.workflow(name="impatient")
    async def impatient() -> list[str]:
        try:
            return [v async for v in dbos.read_stream("slow_writer", "s", timeout=0)]
        except StreamTimeoutError as error:
            return [f"timed out after {error.timeout_seconds:g} s"]

    async with dbos:
        with SetWorkflowID("slow_writer"):
            writing = await dbos.start_workflow(slow_writer)
        with SetWorkflowID("impatient"):
            assert await impatient() == ["timed out after 0 s"]
        [row] = await step_rows(database_url, "impatient")
        assert row.function_name == "DBOS.readStream"
        assert row.error is not None and row.error["name"] == "StreamTimeoutError"
        # Outside a workflow the timeout raises, unrecorded.
        with pytest.raises(StreamTimeoutError, match="'s'"):
            async for _ in dbos.read_stream("slow_writer", "s", timeout=0):
                pass
        with pytest.raises(DBOSError, match="timeout"):
            async for _ in dbos.read_stream("slow_writer", "s", timeout=-1):
                pass
        assert await step_rows(database_url, "slow_writer") == []

        go.set()
        await writing.get_result()
        replayed = await dbos.fork_workflow("impatient", 1)
        assert await replayed.get_result() == ["timed out after 0 s"]
        fresh = await dbos.fork_workflow("impatient", 0)
        assert await fresh.get_result() == ["late"]



async def test_a_recovered_workflow_replays_its_reads(database_url: str) -> None:
    """Cut off after its reads, the workflow is recovered by a new executor: the reads
    replay although the workflow they read was deleted meanwhile."""
    proceed = asyncio.Event()

    def app() -> tuple[DBOS, Any, Any, asyncio.Event]:
        dbos = new_dbos(database_url, shutdown_grace_period=0)
        read_done = asyncio.Event()

        @dbos.workflow(name="target")
        async def target() -> None:
            await dbos.write_stream("s", "first")
            await asyncio.Event().wait()  # runs until the executor leaves

        @dbos.workflow(name="observer")
        async def observer() -> list[Any]:
            status = await dbos.get_workflow_status("target")
            values = dbos.read_stream("target", "s")
            first = await anext(values)
            await values.aclose()
            read_done.set()
            await proceed.wait()
            assert status is not None
            return [status.status, first]

        return dbos, target, observer, read_done

    dbos, target, observer, read_done = app()
    async with dbos:
        with SetWorkflowID("target"):
            await dbos.start_workflow(target)
        with SetWorkflowID("observer"):
            await dbos.start_workflow(observer)
        await asyncio.wait_for(read_done.wait(), 30)
    # The executor left with both PENDING; the target is then deleted.
    async with DBOSClient(system_database_url=database_url) as client:
        await client.delete_workflow("target")
        assert await client.get_workflow_status("target") is None
    proceed.set()
    dbos, _, _, _ = app()
    async with dbos:
        handle = await dbos.retrieve_workflow("observer")
        assert await handle.get_result() == ["PENDING", "first"]
