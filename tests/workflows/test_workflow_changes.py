"""Changing workflows in place: a queued workflow's priority and delay, a workflow's
attributes, and the paged listing of its steps; on the unsharded and the sharded schema,
from an executor and from a client. Bad input is refused with a clear error and writes
nothing."""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import asyncpg
import pytest
from helpers import new_dbos, workflow_row

from dbos_async import (
    DBOS,
    DBOSClient,
    DBOSError,
    NonExistentWorkflowError,
    Queue,
    SetEnqueueOptions,
    SetShardKey,
    SetWorkflowID,
    WorkflowStateError,
    current_workflow_id,
)
from dbos_async._executor.queues.enqueue import DELAYED_KEY
from dbos_async._sysdb.notifications import ENQUEUE_CHANNEL

PATIENCE = 15.0


@dataclass
class Setup:
    url: str
    client: DBOSClient
    key: str | None  # the shard key workflows live under (None unsharded)

    @property
    def sharding(self) -> bool:
        return self.key is not None

    def under_key(self) -> contextlib.AbstractContextManager[Any]:
        """The block in which an executor's workflows get this setup's key."""
        return SetShardKey(self.key) if self.key else contextlib.nullcontext()

    def executor(self, **settings: Any) -> DBOS:
        return new_dbos(self.url, sharding=self.sharding, **settings)

    async def park(self, workflow_id: str, *, delay: float | None = None,
                   priority: int = 0, attributes: dict[str, Any] | None = None,
                   queue: str = "parked") -> None:
        """A workflow ENQUEUED (or DELAYED) on a queue no executor here serves."""
        await self.client.enqueue(queue, "job", workflow_id=workflow_id, delay=delay,
                                  priority=priority, attributes=attributes,
                                  shard_key=self.key)


@pytest.fixture(params=[False, True], ids=["unsharded", "sharded"])
async def setup(request: pytest.FixtureRequest, database_url: str) -> AsyncIterator[Setup]:
    sharding: bool = request.param
    async with new_dbos(database_url, sharding=sharding):
        pass  # creates the schema: a client never migrates
    client = DBOSClient(system_database_url=database_url, sharding=sharding,
                        result_poll_interval=0.1, pool_size=2)
    async with client:
        yield Setup(database_url, client, "tenant-a" if sharding else None)


async def row(setup: Setup, workflow_id: str) -> Any:
    found = await workflow_row(setup.url, workflow_id)
    assert found is not None
    return found


# ---- Priority ----


async def test_priority_changes_the_claim_order(setup: Setup) -> None:
    for name in ("first", "second", "third"):
        await setup.park(name, priority=5, queue="ordered")
    await setup.client.set_workflow_priority("third", 1, shard_key=setup.key)
    assert (await row(setup, "third"))["priority"] == 1
    # A DELAYED workflow's priority may change too.
    await setup.park("later", delay=3600, priority=5)
    await setup.client.set_workflow_priority("later", 0, shard_key=setup.key)
    assert (await row(setup, "later"))["priority"] == 0

    order: list[str] = []
    dbos = setup.executor()
    dbos.queue("ordered", worker_concurrency=1)

    @dbos.workflow(name="job")
    async def job() -> None:
        order.append(str(current_workflow_id()))

    async with dbos:
        for name in ("first", "second", "third"):
            handle = await dbos.retrieve_workflow(name, shard_key=setup.key)
            await asyncio.wait_for(handle.get_result(), PATIENCE)
    assert order == ["third", "first", "second"]


async def test_priority_refuses_bad_input_and_writes_nothing(setup: Setup) -> None:
    client = setup.client
    await setup.park("waiting", priority=3)
    before = await row(setup, "waiting")
    for bad in (-1, 2**31, True, 1.5, "2"):
        with pytest.raises(DBOSError, match="priority must be an integer"):
            await client.set_workflow_priority("waiting", bad, shard_key=setup.key)
    with pytest.raises(NonExistentWorkflowError, match="'nope' does not exist"):
        await client.set_workflow_priority("nope", 1, shard_key=setup.key)
    assert await row(setup, "waiting") == before

    dbos = setup.executor()

    @dbos.workflow(name="done")
    async def done() -> int:
        return 1

    async with dbos:
        with setup.under_key(), SetWorkflowID("finished"):
            assert await done() == 1
        finished = await row(setup, "finished")
        with pytest.raises(WorkflowStateError, match="it is SUCCESS") as caught:
            await dbos.set_workflow_priority("finished", 1, shard_key=setup.key)
        assert (caught.value.workflow_id, caught.value.status) == ("finished", "SUCCESS")
        assert await row(setup, "finished") == finished


async def test_sharded_priority_addresses_one_key(database_url: str) -> None:
    async with new_dbos(database_url, sharding=True):
        pass
    async with DBOSClient(system_database_url=database_url, sharding=True,
                          pool_size=2) as client:
        for key in ("a", "b"):
            await client.enqueue("parked", "job", workflow_id="same", priority=4,
                                 shard_key=key)
        with pytest.raises(DBOSError, match="needs a shard key"):
            await client.set_workflow_priority("same", 1)
        await client.set_workflow_priority("same", 1, shard_key="b")
        with pytest.raises(NonExistentWorkflowError):
            await client.set_workflow_priority("same", 1, shard_key="c")
        listed = await client.list_workflows(workflow_ids=["same"], load_input=False)
        assert sorted((s.shard_key, s.priority) for s in listed) == [("a", 4), ("b", 1)]


# ---- Delay ----


async def test_delay_is_picked_up_by_the_promoter(setup: Setup) -> None:
    """A workflow delayed by an hour runs once its delay is changed to now, whichever
    process changes it: the promoter reads the new time."""
    dbos = setup.executor()
    dbos.register_queue(Queue("slow", polling_interval=3600))

    @dbos.workflow(name="job")
    async def job() -> str:
        return "ran"

    async with dbos:
        slow = await dbos.get_queue("slow")
        with SetEnqueueOptions(delay=3600), setup.under_key():
            with SetWorkflowID("sleeper"):
                handle = await slow.enqueue(job)
            with SetWorkflowID("sleeper-2"):
                other = await slow.enqueue(job)
        assert (await row(setup, "sleeper"))["status"] == "DELAYED"
        # From the client (another process's notification) and from the executor itself.
        await setup.client.set_workflow_delay("sleeper", delay_seconds=0,
                                              shard_key=setup.key)
        assert await asyncio.wait_for(handle.get_result(), PATIENCE) == "ran"
        await dbos.set_workflow_delay("sleeper-2",
                                      delay_until_epoch_ms=int(time.time() * 1000) - 1000,
                                      shard_key=setup.key)
        assert await asyncio.wait_for(other.get_result(), PATIENCE) == "ran"


async def test_delay_postpones_an_enqueued_workflow(setup: Setup) -> None:
    await setup.park("ready")
    assert (await row(setup, "ready"))["status"] == "ENQUEUED"
    # The change wakes the promoters of every process (they sleep until the next due time).
    announced: asyncio.Queue[str] = asyncio.Queue()
    listener = await asyncpg.connect(setup.url)
    await listener.add_listener(ENQUEUE_CHANNEL,
                                lambda *args: announced.put_nowait(args[-1]))
    try:
        await setup.client.set_workflow_delay(
            "ready", delay_until_epoch_ms=4_102_444_800_000, shard_key=setup.key)
        assert await asyncio.wait_for(announced.get(), PATIENCE) == DELAYED_KEY
    finally:
        await listener.close()
    after = await row(setup, "ready")
    assert (after["status"], after["delay_until_epoch_ms"]) == ("DELAYED", 4_102_444_800_000)
    started = time.time()
    await setup.client.set_workflow_delay("ready", delay_seconds=60, shard_key=setup.key)
    until = (await row(setup, "ready"))["delay_until_epoch_ms"]
    assert started * 1000 + 60_000 - 1 <= until <= time.time() * 1000 + 60_000


async def test_delay_refuses_bad_input_and_writes_nothing(setup: Setup) -> None:
    client = setup.client
    await setup.park("waiting", delay=3600)
    before = await row(setup, "waiting")
    bad: list[tuple[dict[str, Any], str]] = [
        ({}, "exactly one"),
        ({"delay_seconds": 1, "delay_until_epoch_ms": 1}, "exactly one"),
        ({"delay_seconds": -1}, "Invalid delay: must be zero or more seconds"),
        ({"delay_seconds": math.nan}, "Invalid delay: is NaN"),
        ({"delay_seconds": "1"}, "Invalid delay: must be a number of seconds"),
        ({"delay_seconds": math.inf}, "Invalid delay: is infinite"),
        ({"delay_until_epoch_ms": -5}, "delay_until_epoch_ms must be an integer"),
        ({"delay_until_epoch_ms": 1.5}, "delay_until_epoch_ms must be an integer"),
        ({"delay_until_epoch_ms": 2**63}, "delay_until_epoch_ms must be an integer"),
        ({"delay_seconds": 1e300}, "Invalid delay: must be at most"),
    ]
    for arguments, message in bad:
        with pytest.raises(DBOSError, match=message):
            await client.set_workflow_delay("waiting", shard_key=setup.key, **arguments)
    with pytest.raises(NonExistentWorkflowError):
        await client.set_workflow_delay("nope", delay_seconds=1, shard_key=setup.key)
    assert await row(setup, "waiting") == before

    dbos = setup.executor()
    dbos.queue("running")
    entered = asyncio.Event()
    release = asyncio.Event()

    @dbos.workflow(name="job")
    async def job() -> None:
        entered.set()
        await release.wait()

    async with dbos:
        handle = await client.enqueue("running", "job", workflow_id="started",
                                      shard_key=setup.key)
        await asyncio.wait_for(entered.wait(), PATIENCE)
        started = await row(setup, "started")
        with pytest.raises(WorkflowStateError, match="it is PENDING"):
            await client.set_workflow_delay("started", delay_seconds=60,
                                            shard_key=setup.key)
        with pytest.raises(WorkflowStateError, match="only ENQUEUED or DELAYED"):
            await dbos.set_workflow_priority("started", 2, shard_key=setup.key)
        assert await row(setup, "started") == started
        release.set()
        await asyncio.wait_for(handle.get_result(), PATIENCE)


# ---- Attributes ----


async def test_attributes_replace_merge_and_clear(setup: Setup) -> None:
    client = setup.client
    await setup.park("tagged", attributes={"a": 1, "b": {"deep": True}})

    async def attributes() -> Any:
        status = await client.get_workflow_status("tagged", shard_key=setup.key)
        assert status is not None
        return status.attributes

    await client.update_workflow_attributes("tagged", {"b": 2, "c": [3]}, merge=True,
                                            shard_key=setup.key)
    assert await attributes() == {"a": 1, "b": 2, "c": [3]}
    await client.update_workflow_attributes("tagged", {"only": "this"}, shard_key=setup.key)
    assert await attributes() == {"only": "this"}
    await client.update_workflow_attributes("tagged", None, shard_key=setup.key)
    assert await attributes() is None
    # Merging into none starts from an empty object.
    await client.update_workflow_attributes("tagged", {"x": 1}, merge=True,
                                            shard_key=setup.key)
    assert await attributes() == {"x": 1}
    # Listings filter on the new attributes.
    found = await client.list_workflows(attributes={"x": 1}, shard_key=setup.key)
    assert [s.workflow_id for s in found] == ["tagged"]


async def test_attributes_of_a_finished_workflow_from_an_executor(setup: Setup) -> None:
    dbos = setup.executor()

    @dbos.workflow(name="done")
    async def done() -> int:
        return 1

    async with dbos:
        with setup.under_key(), SetWorkflowID("finished"):
            await done()
        await dbos.update_workflow_attributes("finished", {"reviewed": True},
                                              shard_key=setup.key)
        status = await dbos.get_workflow_status("finished", shard_key=setup.key)
        assert status is not None and status.attributes == {"reviewed": True}


async def test_attributes_refuse_bad_input_and_write_nothing(setup: Setup) -> None:
    client = setup.client
    await setup.park("tagged", attributes={"a": 1})
    before = await row(setup, "tagged")
    with pytest.raises(DBOSError, match="must be a dict"):
        await client.update_workflow_attributes("tagged", ["a"],  # type: ignore[arg-type]
                                                shard_key=setup.key)
    with pytest.raises(DBOSError, match="JSON-serializable"):
        await client.update_workflow_attributes("tagged", {"a": object()},
                                                shard_key=setup.key)
    with pytest.raises(DBOSError, match="merge=True needs a dict"):
        await client.update_workflow_attributes("tagged", None, merge=True,
                                                shard_key=setup.key)
    with pytest.raises(NonExistentWorkflowError):
        await client.update_workflow_attributes("nope", {"a": 2}, shard_key=setup.key)
    assert await row(setup, "tagged") == before


# ---- Steps, a page at a time ----


async def test_steps_are_paged(setup: Setup) -> None:
    dbos = setup.executor()

    @dbos.step(name="square")
    async def square(x: int) -> int:
        return x * x

    @dbos.workflow(name="five")
    async def five() -> None:
        for x in range(5):
            await square(x)

    async with dbos:
        with setup.under_key(), SetWorkflowID("five"):
            await five()
        for operator in (dbos, setup.client):
            steps = await operator.list_workflow_steps("five", shard_key=setup.key)
            assert [s.output for s in steps] == [0, 1, 4, 9, 16]
            page = await operator.list_workflow_steps("five", limit=2, offset=1,
                                                      shard_key=setup.key)
            assert [(s.function_id, s.output) for s in page] == [(1, 1), (2, 4)]
            tail = await operator.list_workflow_steps("five", offset=3, shard_key=setup.key)
            assert [s.function_id for s in tail] == [3, 4]
            bare = await operator.list_workflow_steps("five", load_output=False, limit=3,
                                                      shard_key=setup.key)
            assert [(s.function_id, s.name, s.output) for s in bare] == [
                (0, "square", None), (1, "square", None), (2, "square", None)]
            # Past the end: an empty page of an existing workflow.
            assert await operator.list_workflow_steps("five", offset=10,
                                                      shard_key=setup.key) == []
            with pytest.raises(NonExistentWorkflowError):
                await operator.list_workflow_steps("nope", offset=10, shard_key=setup.key)
            for bad in ({"limit": -1}, {"offset": -2}, {"limit": "3"}, {"offset": True},
                        {"offset": 2**63}, {"limit": 1111111111111111111111}):
                with pytest.raises(DBOSError, match="must be an integer from 0 to"):
                    await operator.list_workflow_steps("five", shard_key=setup.key, **bad)
