"""The executor's statements use only types asyncpg encodes and decodes by itself: it then
never sends its type-introspection query (``WITH RECURSIVE typeinfo_tree ...``), which it
otherwise runs once per connection and unknown type, and which costs seconds of a Citus
coordinator's CPU a call."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

import pytest
from helpers import new_dbos, pool_statements

from dbos_async import EnqueueRequest, SendMessage, SetShardKey, SetWorkflowID

INTROSPECTION = "typeinfo_tree"
WORKFLOWS = 12


async def workload_statements(url: str, *, sharded: bool) -> list[str]:
    """Run workflows with steps (concurrent, so their checkpoints go in batches), a queue,
    a batch enqueue, messages, events and streams; return every statement the executor's
    pool sent meanwhile."""
    dbos = new_dbos(url, sharding=sharded)
    queue = dbos.queue("jobs", concurrency=4, worker_concurrency=4)
    key: dict[str, Any] = {"shard_key": "acme"} if sharded else {}
    keyed: Callable[[], contextlib.AbstractContextManager[Any]] = (
        (lambda: SetShardKey("acme")) if sharded else contextlib.nullcontext)

    @dbos.step(name="double")
    async def double(n: int) -> int:
        return 2 * n

    @dbos.workflow(name="child")
    async def child(n: int) -> int:
        return await double(await double(n))

    @dbos.workflow(name="peer")
    async def peer() -> Any:
        return await dbos.recv("hello", timeout=30)

    @dbos.workflow(name="parent")
    async def parent(n: int) -> int:
        await dbos.set_event("progress", n)
        await dbos.write_stream("out", n)
        await dbos.close_stream("out")
        await dbos.send_bulk([SendMessage("peer", n, "hello", **key)])
        [queued] = await dbos.enqueue_many(queue, [EnqueueRequest(child, (n,), **key)])
        with keyed():
            started = await dbos.start_workflow(child, n)
        return await queued.handle.get_result() + await started.get_result()

    async with dbos, pool_statements(dbos) as logged:
        with keyed(), SetWorkflowID("peer"):
            listening = await dbos.start_workflow(peer)
        with keyed(), SetWorkflowID("parent"):
            assert await (await dbos.start_workflow(parent, 1)).get_result() == 8
        assert await listening.get_result() == 1
        assert await dbos.get_event("parent", "progress", **key) == 1
        assert [v async for v in dbos.read_stream("parent", "out", **key)] == [1]
        batch = await dbos.enqueue_many(
            queue, [EnqueueRequest(child, (n,), **key) for n in range(WORKFLOWS)])
        with keyed():
            handles = await asyncio.gather(
                *(dbos.start_workflow(child, n) for n in range(WORKFLOWS)))
        assert [await e.handle.get_result() for e in batch] == [
            4 * n for n in range(WORKFLOWS)]
        assert [await h.get_result() for h in handles] == [4 * n for n in range(WORKFLOWS)]
        await dbos.list_workflows(**key)
        await dbos.list_workflow_steps("parent", **key)
    return [sql for sql, _ in logged]


def introspections(statements: list[str]) -> list[str]:
    return [sql for sql in statements if INTROSPECTION in sql]


@pytest.mark.parametrize("sharded", [False, True], ids=["unsharded", "sharded"])
async def test_workload_sends_no_type_introspection(plain_database_url: str,
                                                    sharded: bool) -> None:
    statements = await workload_statements(plain_database_url, sharded=sharded)
    # The batch statements (several checkpoints, starts or enqueues at once) were among them.
    assert any("unnest(" in sql for sql in statements)
    assert introspections(statements) == []


@pytest.mark.citus
async def test_workload_sends_no_type_introspection_on_citus(citus_url: str) -> None:
    statements = await workload_statements(citus_url, sharded=True)
    assert any("unnest(" in sql for sql in statements)
    assert introspections(statements) == []
