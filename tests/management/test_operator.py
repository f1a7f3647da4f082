"""The operator API DBOS and DBOSClient share (executor/operator.py): one implementation,
and the parameters each side gained from the other (DBOS fork's ``new_workflow_id`` and
``workflow_timeout``, the client's ``Queue`` arguments and ``queues_only``)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from helpers import new_dbos, unique_name, workflow_row

from dbos_async import DBOS, DBOSClient, Queue, SetWorkflowID, SetWorkflowTimeout
from dbos_async._executor.operator import Operator

PATIENCE = 15.0

SHARED = [
    "retrieve_workflow", "get_workflow_status", "wait_first", "wait_all", "get_event",
    "get_all_events", "read_stream", "cancel_workflow", "cancel_workflows", "delete_workflow",
    "delete_workflows", "resume_workflow", "resume_workflows", "fork_workflow",
    "fork_workflows", "rewind_workflow", "list_workflows", "list_queued_workflows",
    "list_workflow_steps",
    "list_application_versions", "get_latest_application_version",
    "set_latest_application_version", "set_workflow_priority", "set_workflow_delay",
    "update_workflow_attributes", "list_queues", "get_queue_definition", "update_queue",
    "delete_queue", "rename_application",
]


def test_one_implementation() -> None:
    for name in SHARED:
        assert getattr(DBOS, name) is getattr(Operator, name), name
        assert getattr(DBOSClient, name) is getattr(Operator, name), name
    # send: the client adds connection= (the transactional outbox) over the shared one.
    assert DBOS.send is Operator.send and DBOSClient.send is not Operator.send
    assert DBOS.send_bulk is Operator.send_bulk
    assert DBOSClient.send_bulk is not Operator.send_bulk


def _app(url: str) -> tuple[DBOS, Callable[[int], Awaitable[int]], dict[str, int]]:
    dbos = new_dbos(url)
    runs = {"step": 0}

    @dbos.step(name="count")
    async def count(x: int) -> int:
        runs["step"] += 1
        return x + 1

    @dbos.workflow(name="counted")
    async def counted(x: int) -> int:
        return await count(x)

    return dbos, counted, runs


async def test_dbos_fork_takes_new_id_and_timeout(database_url: str) -> None:
    dbos, counted, runs = _app(database_url)
    async with dbos:
        with SetWorkflowID("orig"):
            assert await counted(1) == 2
        # Explicit arguments win over the context's.
        with SetWorkflowID("from-context"), SetWorkflowTimeout(30.0):
            fork = await dbos.fork_workflow("orig", 0, new_workflow_id="explicit",
                                            workflow_timeout=60.0)
        assert fork.workflow_id == "explicit"
        assert await asyncio.wait_for(fork.get_result(), PATIENCE) == 2
        assert (await workflow_row(database_url, "explicit"))["workflow_timeout_ms"] == 60000
        # Without them, SetWorkflowID and SetWorkflowTimeout still apply.
        with SetWorkflowID("from-context"), SetWorkflowTimeout(30.0):
            fork = await dbos.fork_workflow("orig", 1)
        assert fork.workflow_id == "from-context"
        assert await asyncio.wait_for(fork.get_result(), PATIENCE) == 2
        row = await workflow_row(database_url, "from-context")
        assert row["workflow_timeout_ms"] == 30000
        assert runs["step"] == 2  # the fork from step 0 ran it again, the one from 1 did not


async def test_client_takes_queue_objects_and_queues_only(database_url: str) -> None:
    dbos, counted, _ = _app(database_url)
    dbos.queue("other")
    client = DBOSClient(system_database_url=database_url,
                        application_name=unique_name("client"), result_poll_interval=0.2,
                        pool_size=2)
    async with dbos, client:
        with SetWorkflowID("done"):
            assert await counted(1) == 2
        fork = await client.fork_workflow("done", 1, queue=Queue("other"),
                                          new_workflow_id="forked")
        assert await asyncio.wait_for(fork.get_result(), PATIENCE) == 2
        assert (await workflow_row(database_url, "forked"))["queue_name"] == "other"
        handle = await client.rewind_workflow("done", 0, queue=Queue("other"))
        assert await asyncio.wait_for(handle.get_result(), PATIENCE) == 2
        assert (await workflow_row(database_url, "done"))["queue_name"] == "other"
        listed = await client.list_workflows(queues_only=True, status="SUCCESS")
        assert {s.workflow_id for s in listed} >= {"forked", "done"}
