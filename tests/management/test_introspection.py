"""Introspection and deletion: list_workflows filters and pages, list_queued_workflows,
list_workflow_steps, get_workflow_status, and delete_workflow leaving no row behind."""

from __future__ import annotations

import asyncio
import contextlib
from datetime import UTC, datetime

import pytest
from helpers import execute, fetch, fetchval, new_dbos
from pydantic import BaseModel

from dbos_async import DBOS, DBOSError, NonExistentWorkflowError, RecordedError, SetWorkflowID

# Tables that hold no per-workflow rows.
GLOBAL_TABLES = {"dbos_migrations", "application_versions", "queues", "workflow_schedules",
                 "event_dispatch_kv"}


class Item(BaseModel):
    sku: str
    quantity: int


def define(dbos: DBOS) -> dict[str, object]:
    @dbos.step(name="double")
    async def double(x: int) -> int:
        return 2 * x

    @dbos.step(name="explode")
    async def explode() -> None:
        raise ValueError("boom")

    @dbos.workflow(name="order")
    async def order(item: Item, note: str = "") -> Item:
        quantity = await double(item.quantity)
        return Item(sku=item.sku, quantity=quantity)

    @dbos.workflow(name="failing")
    async def failing() -> None:
        await explode()

    @dbos.workflow(name="child")
    async def child(x: int) -> int:
        await dbos.set_event("child-key", x)
        return x + 1

    @dbos.workflow(name="busy")
    async def busy(x: int) -> int:
        await double(x)
        with contextlib.suppress(ValueError):
            await explode()
        await dbos.sleep(0.01)
        await dbos.set_event("key", {"x": x})
        await dbos.write_stream("stream", 1)
        await dbos.close_stream("stream")
        got = await dbos.recv("topic", timeout=5)
        handle = await dbos.start_workflow(child, x)
        return int(got) + await handle.get_result()

    return {"order": order, "failing": failing, "busy": busy, "child": child}


async def test_list_workflows_filters_and_pages(database_url: str) -> None:
    dbos = new_dbos(database_url)
    wfs = define(dbos)
    order, failing = wfs["order"], wfs["failing"]
    async with dbos:
        for i in range(5):
            with SetWorkflowID(f"order-{i}"):
                await order(Item(sku=f"s{i}", quantity=i), note=f"n{i}")  # type: ignore[operator]
            await asyncio.sleep(0.005)  # distinct created_at
        with SetWorkflowID("fail-0"), pytest.raises(ValueError):
            await failing()  # type: ignore[operator]

        everything = await dbos.list_workflows()
        assert [w.workflow_id for w in everything] == [f"order-{i}" for i in range(5)] + ["fail-0"]

        newest = await dbos.list_workflows(sort_desc=True, limit=2)
        assert [w.workflow_id for w in newest] == ["fail-0", "order-4"]
        page = await dbos.list_workflows(name="order", limit=2, offset=2)
        assert [w.workflow_id for w in page] == ["order-2", "order-3"]
        assert await dbos.list_workflows(name="order", offset=10) == []
        # A page past PostgreSQL's bigint is refused before any statement, not by the driver.
        with pytest.raises(DBOSError, match="offset must be an integer from 0 to"):
            await dbos.list_workflows(offset=2**63)

        errors = await dbos.list_workflows(status="ERROR")
        assert [w.workflow_id for w in errors] == ["fail-0"]
        assert isinstance(errors[0].error, ValueError)
        assert isinstance(errors[0].error, RecordedError) and "boom" in str(errors[0].error)
        both = await dbos.list_workflows(status=["ERROR", "SUCCESS"], name=["failing", "order"])
        assert len(both) == 6

        assert [w.workflow_id for w in await dbos.list_workflows(workflow_ids=["order-3", "x"])] \
            == ["order-3"]
        assert len(await dbos.list_workflows(workflow_id_prefix="order-")) == 5
        assert len(await dbos.list_workflows(workflow_id_prefix=["order-1", "fail"])) == 2
        # A prefix is literal: _ and % are not wildcards.
        assert await dbos.list_workflows(workflow_id_prefix="order_") == []

        # Inputs and outputs come back typed with the registered signature.
        [loaded] = await dbos.list_workflows(workflow_ids=["order-2"])
        assert loaded.input is not None
        assert loaded.input.args == (Item(sku="s2", quantity=2),)
        assert loaded.input.kwargs == {"note": "n2"}
        assert loaded.output == Item(sku="s2", quantity=4)
        [bare] = await dbos.list_workflows(workflow_ids=["order-2"], load_input=False,
                                           load_output=False)
        assert bare.input is None and bare.output is None and bare.status == "SUCCESS"

        # Time bounds on created_at: epoch ms, datetime and ISO strings.
        times = [w.created_at for w in everything]
        middle = await dbos.list_workflows(start_time=times[1], end_time=times[3])
        assert [w.workflow_id for w in middle] == ["order-1", "order-2", "order-3"]
        as_dt = datetime.fromtimestamp(times[4] / 1000, tz=UTC)
        assert [w.workflow_id for w in await dbos.list_workflows(start_time=as_dt)] \
            == ["order-4", "fail-0"]
        assert len(await dbos.list_workflows(end_time=as_dt.isoformat())) == 5

        assert len(await dbos.list_workflows(executor_id="test-executor")) == 6
        assert await dbos.list_workflows(executor_id="elsewhere") == []
        assert len(await dbos.list_workflows(application_version="test-version-1")) == 6
        assert await dbos.list_workflows(application_version="v-other") == []

        await execute(database_url, """UPDATE dbos.workflow_status
            SET authenticated_user = 'alice', forked_from = 'order-0'
            WHERE workflow_uuid = 'order-1'""")
        assert [w.workflow_id for w in await dbos.list_workflows(authenticated_user="alice")] \
            == ["order-1"]
        [forked] = await dbos.list_workflows(forked_from="order-0")
        assert forked.workflow_id == "order-1" and forked.forked_from == "order-0"
        assert forked.authenticated_user == "alice"

        with pytest.raises(Exception, match="limit"):
            await dbos.list_workflows(limit=-1)


async def test_list_children_and_queued(database_url: str) -> None:
    dbos = new_dbos(database_url)
    busy = define(dbos)["busy"]
    async with dbos:
        with SetWorkflowID("busy-1"):
            handle = await dbos.start_workflow(busy, 3)  # type: ignore[arg-type]
        await dbos.send("busy-1", 10, topic="topic")
        assert await handle.get_result() == 14
        [kid] = await dbos.list_workflows(parent_workflow_id="busy-1")
        assert kid.name == "child" and kid.parent_workflow_id == "busy-1"

        await execute(database_url, """
            INSERT INTO dbos.workflow_status (workflow_uuid, status, name, queue_name, created_at)
            VALUES ('q-1', 'ENQUEUED', 'job', 'jobs', 1), ('q-2', 'PENDING', 'job', 'jobs', 2),
                   ('q-3', 'SUCCESS', 'job', 'jobs', 3), ('q-4', 'DELAYED', 'job', 'other', 4)""")
        queued = await dbos.list_queued_workflows()
        assert [w.workflow_id for w in queued] == ["q-1", "q-2", "q-4"]
        assert [w.workflow_id for w in await dbos.list_queued_workflows(queue_name="jobs")] \
            == ["q-1", "q-2"]
        assert [w.workflow_id for w in await dbos.list_queued_workflows(status="ENQUEUED")] \
            == ["q-1"]
        assert [w.queue_name for w in await dbos.list_workflows(queue_name="jobs")] \
            == ["jobs"] * 3


async def test_list_workflow_steps(database_url: str) -> None:
    dbos = new_dbos(database_url)
    busy = define(dbos)["busy"]
    async with dbos:
        with SetWorkflowID("busy-2"):
            handle = await dbos.start_workflow(busy, 5)  # type: ignore[arg-type]
        await dbos.send("busy-2", 1, topic="topic")
        assert await handle.get_result() == 7
        steps = await dbos.list_workflow_steps("busy-2")
        assert [s.function_id for s in steps] == list(range(len(steps)))
        names = [s.name for s in steps]
        assert names[:3] == ["double", "explode", "DBOS.sleep"]
        assert "DBOS.setEvent" in names and "DBOS.recv" in names and "child" in names
        assert steps[0].output == 10 and steps[0].error is None
        assert isinstance(steps[1].error, ValueError) and steps[1].output is None
        recv = steps[names.index("DBOS.recv")]
        assert recv.output == 1
        child = steps[names.index("child")]
        assert child.child_workflow_id == f"busy-2-{child.function_id}"
        for step in steps:
            assert step.started_at_epoch_ms is not None
            assert step.completed_at_epoch_ms is not None
            assert step.completed_at_epoch_ms >= step.started_at_epoch_ms

        with pytest.raises(NonExistentWorkflowError):
            await dbos.list_workflow_steps("nope")
        assert await dbos.list_workflow_steps(child.child_workflow_id or "") != []


async def test_get_workflow_status(database_url: str) -> None:
    dbos = new_dbos(database_url)
    order = define(dbos)["order"]
    async with dbos:
        with SetWorkflowID("st-1"):
            await order(Item(sku="a", quantity=1))  # type: ignore[operator]
        status = await dbos.get_workflow_status("st-1")
        assert status is not None
        assert (status.workflow_id, status.status, status.name) == ("st-1", "SUCCESS", "order")
        assert status.executor_id == "test-executor"
        assert status.application_version == "test-version-1"
        assert status.completed_at is not None and status.completed_at >= status.created_at
        assert status.serialization == "portable_json" and status.priority == 0
        assert await dbos.get_workflow_status("missing") is None


async def per_workflow_rows(url: str) -> dict[str, int]:
    tables = [r["table_name"] for r in await fetch(
        url, """SELECT table_name FROM information_schema.tables
                WHERE table_schema = 'dbos' AND table_type = 'BASE TABLE'""")]
    counts = {}
    for table in tables:
        if table not in GLOBAL_TABLES:
            counts[table] = int(await fetchval(url, f'SELECT count(*) FROM dbos."{table}"'))
    return counts


async def test_delete_leaves_no_row_in_any_table(database_url: str) -> None:
    dbos = new_dbos(database_url)
    busy = define(dbos)["busy"]
    async with dbos:
        for wid in ("del-1", "del-2"):
            with SetWorkflowID(wid):
                handle = await dbos.start_workflow(busy, 1)  # type: ignore[arg-type]
            await dbos.send(wid, 1, topic="topic")
            await dbos.send(wid, 2, topic="unread")  # an unconsumed message stays until delete
            await handle.get_result()
        counts = await per_workflow_rows(database_url)
        for table in ("workflow_status", "workflow_input", "workflow_output", "operation_outputs",
                      "notifications", "workflow_events", "workflow_events_history", "streams"):
            assert counts[table] > 0, table

        kids = {w.workflow_id for w in
                await dbos.list_workflows(parent_workflow_id=["del-1", "del-2"])}
        assert len(kids) == 2
        # Without children, the child stays.
        await dbos.delete_workflow("del-1")
        assert await dbos.get_workflow_status("del-1") is None
        assert {w.workflow_id for w in await dbos.list_workflows()} == {"del-2"} | kids

        await dbos.delete_workflows(["del-2", "missing"], delete_children=True)
        [orphan] = await dbos.list_workflows()
        await dbos.delete_workflow(orphan.workflow_id)
        assert set((await per_workflow_rows(database_url)).values()) == {0}
        await dbos.delete_workflow("del-1")  # deleting again is a no-op
