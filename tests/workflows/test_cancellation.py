"""Cancellation: a running step or wait is interrupted promptly, children, idempotence,
unknown IDs, non-cancellable steps, and cancellation from other processes and clients."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from helpers import execute, new_dbos, step_rows, wait_until, workflow_row

from dbos_async import (
    DBOS,
    NonExistentWorkflowError,
    SetWorkflowID,
    WorkflowCancelledError,
)

PATIENCE = 10.0  # generous: the point is "well before the 60 s step ends", not a benchmark


class LongSteps:
    """A workflow whose second step takes 60 s, with flags the test can watch."""

    def __init__(self, dbos: DBOS, *, cancellable: bool = True, step_seconds: float = 60.0):
        self.started = asyncio.Event()
        self.interrupted = False
        self.finished = False
        self.after = 0

        @dbos.step(name="first")
        async def first() -> int:
            return 1

        @dbos.step(name="long", cancellable=cancellable)
        async def long() -> str:
            self.started.set()
            try:
                await asyncio.sleep(step_seconds)
            except asyncio.CancelledError:
                self.interrupted = True
                raise
            self.finished = True
            return "done"

        @dbos.step(name="after")
        async def after() -> None:
            self.after += 1

        @dbos.workflow(name="long_workflow")
        async def workflow() -> str:
            await first()
            value = await long()
            await after()
            return value

        self.workflow = workflow


async def expect_cancelled(handle: Any) -> float:
    began = time.monotonic()
    with pytest.raises(WorkflowCancelledError):
        async with asyncio.timeout(PATIENCE):
            await handle.get_result()
    return time.monotonic() - began


async def test_cancel_interrupts_a_long_step(database_url: str) -> None:
    dbos = new_dbos(database_url)
    flow = LongSteps(dbos)
    async with dbos:
        with SetWorkflowID("wf-long"):
            handle = await dbos.start_workflow(flow.workflow)
        await asyncio.wait_for(flow.started.wait(), PATIENCE)
        began = time.monotonic()
        await dbos.cancel_workflow("wf-long")
        await expect_cancelled(handle)
        assert time.monotonic() - began < PATIENCE
        assert flow.interrupted and not flow.finished and flow.after == 0
        status = await dbos.get_workflow_status("wf-long")
        assert status is not None and status.status == "CANCELLED"
        # Only the first step was recorded: the interrupted one left no checkpoint.
        assert [s.function_name for s in await step_rows(database_url, "wf-long")] == ["first"]
        # A fresh handle reports the cancellation too.
        await expect_cancelled(await dbos.retrieve_workflow("wf-long"))


async def test_non_cancellable_step_finishes_and_its_result_is_discarded(
        database_url: str) -> None:
    dbos = new_dbos(database_url)
    flow = LongSteps(dbos, cancellable=False, step_seconds=0.5)
    async with dbos:
        with SetWorkflowID("wf-keep"):
            handle = await dbos.start_workflow(flow.workflow)
        await asyncio.wait_for(flow.started.wait(), PATIENCE)
        await dbos.cancel_workflow("wf-keep")
        await expect_cancelled(handle)
        assert flow.finished and not flow.interrupted and flow.after == 0
        assert [s.function_name for s in await step_rows(database_url, "wf-keep")] == ["first"]


async def test_cancel_from_another_executor_wakes_the_watcher(database_url: str) -> None:
    runner = new_dbos(database_url, executor_id="runner", cancellation_poll_interval=30)
    flow = LongSteps(runner)
    operator = new_dbos(database_url, executor_id="operator")
    async with runner, operator:
        with SetWorkflowID("wf-remote"):
            handle = await runner.start_workflow(flow.workflow)
        await asyncio.wait_for(flow.started.wait(), PATIENCE)
        polls = runner._current_runtime.cancellation.polls
        await operator.cancel_workflow("wf-remote")
        # Woken by the notification (the poll interval is 30 s, far beyond the patience).
        await expect_cancelled(handle)
        assert flow.interrupted
        assert runner._current_runtime.cancellation.polls == polls + 1


async def test_cancel_by_a_client_that_does_not_notify_is_polled(
        database_url: str, listen: bool) -> None:
    dbos = new_dbos(database_url, cancellation_poll_interval=0.1, use_listen_notify=listen)
    flow = LongSteps(dbos)
    async with dbos:
        with SetWorkflowID("wf-sql"):
            handle = await dbos.start_workflow(flow.workflow)
        await asyncio.wait_for(flow.started.wait(), PATIENCE)
        # What another DBOS library or an operator's SQL does: no notification on our channel.
        await execute(database_url, "UPDATE dbos.workflow_status SET status = 'CANCELLED', "
                      "owner_xid = NULL WHERE workflow_uuid = 'wf-sql'")
        await expect_cancelled(handle)
        assert flow.interrupted


async def test_waits_are_interrupted(database_url: str) -> None:
    dbos = new_dbos(database_url)
    entered: dict[str, asyncio.Event] = {k: asyncio.Event() for k in ("recv", "sleep", "event")}

    @dbos.workflow(name="receiver")
    async def receiver() -> Any:
        entered["recv"].set()
        return await dbos.recv("topic", timeout=60)

    @dbos.workflow(name="sleeper")
    async def sleeper() -> None:
        entered["sleep"].set()
        await dbos.sleep(60)

    @dbos.workflow(name="event_waiter")
    async def event_waiter() -> Any:
        entered["event"].set()
        return await dbos.get_event("nobody", "key", timeout=60)

    async with dbos:
        handles = {}
        for kind, fn in (("recv", receiver), ("sleep", sleeper), ("event", event_waiter)):
            with SetWorkflowID(f"wf-{kind}"):
                handles[kind] = await dbos.start_workflow(fn)
            await asyncio.wait_for(entered[kind].wait(), PATIENCE)
        await asyncio.sleep(0.2)  # let each reach its wait
        await dbos.cancel_workflows([f"wf-{k}" for k in handles])
        for handle in handles.values():
            await expect_cancelled(handle)


async def test_cancel_children(database_url: str) -> None:
    dbos = new_dbos(database_url)
    children_started = asyncio.Event()
    release = asyncio.Event()

    @dbos.step(name="child_step")
    async def child_step() -> str:
        children_started.set()
        await release.wait()
        return "child done"

    @dbos.workflow(name="child")
    async def child() -> str:
        return await child_step()

    @dbos.workflow(name="parent")
    async def parent() -> str:
        handle = await dbos.start_workflow(child)
        return await handle.get_result()

    async with dbos:
        with SetWorkflowID("p1"):
            h1 = await dbos.start_workflow(parent)
        await asyncio.wait_for(children_started.wait(), PATIENCE)
        await dbos.cancel_workflow("p1", cancel_children=True)
        await expect_cancelled(h1)
        await expect_cancelled(await dbos.retrieve_workflow("p1-0"))
        row = await workflow_row(database_url, "p1-0")
        assert row is not None and row["status"] == "CANCELLED"

        # Without cancel_children the child runs on and completes.
        children_started.clear()
        with SetWorkflowID("p2"):
            h2 = await dbos.start_workflow(parent)
        await asyncio.wait_for(children_started.wait(), PATIENCE)
        await dbos.cancel_workflow("p2")
        release.set()
        await expect_cancelled(h2)
        child_handle = await dbos.retrieve_workflow("p2-0")
        assert await asyncio.wait_for(child_handle.get_result(), PATIENCE) == "child done"
        status = await dbos.get_workflow_status("p2-0")
        assert status is not None and status.status == "SUCCESS"


async def test_cancel_twice_and_finished_workflows(database_url: str) -> None:
    dbos = new_dbos(database_url)
    flow = LongSteps(dbos)

    @dbos.workflow(name="quick")
    async def quick() -> int:
        return 7

    async with dbos:
        with SetWorkflowID("wf-twice"):
            handle = await dbos.start_workflow(flow.workflow)
        await asyncio.wait_for(flow.started.wait(), PATIENCE)
        assert await dbos.cancel_workflows(["wf-twice"]) == ["wf-twice"]
        await expect_cancelled(handle)
        before = await workflow_row(database_url, "wf-twice")
        assert await dbos.cancel_workflows(["wf-twice"]) == []  # a no-op, not an error
        await dbos.cancel_workflow("wf-twice")
        after = await workflow_row(database_url, "wf-twice")
        assert before is not None and after is not None
        assert after["updated_at"] == before["updated_at"]
        assert after["completed_at"] == before["completed_at"]

        # A finished workflow keeps its outcome.
        with SetWorkflowID("wf-done"):
            assert await quick() == 7
        await dbos.cancel_workflow("wf-done")
        status = await dbos.get_workflow_status("wf-done")
        assert status is not None and status.status == "SUCCESS"
        assert await (await dbos.retrieve_workflow("wf-done")).get_result() == 7


async def test_cancel_unknown_ids(database_url: str) -> None:
    dbos = new_dbos(database_url)
    async with dbos:
        await execute(
            database_url,
            """INSERT INTO dbos.workflow_status (workflow_uuid, status, name, queue_name,
                                                 deduplication_id)
               VALUES ('queued-1', 'ENQUEUED', 'nobody', 'some-queue', 'dedup-1')""")
        with pytest.raises(NonExistentWorkflowError, match="missing"):
            await dbos.cancel_workflow("missing")
        with pytest.raises(NonExistentWorkflowError, match="missing"):
            await dbos.cancel_workflows(["queued-1", "missing"])
        row = await workflow_row(database_url, "queued-1")
        assert row is not None and row["status"] == "ENQUEUED"  # all or nothing

        await dbos.cancel_workflows(["queued-1"])
        row = await workflow_row(database_url, "queued-1")
        assert row is not None
        assert (row["status"], row["queue_name"], row["deduplication_id"], row["owner_xid"]) \
            == ("CANCELLED", None, None, None)


async def test_idle_executor_does_not_poll(database_url: str) -> None:
    dbos = new_dbos(database_url, cancellation_poll_interval=0.05)

    @dbos.workflow(name="noop")
    async def noop() -> None:
        return None

    async with dbos:
        await noop()
        await asyncio.sleep(0.3)
        assert dbos._current_runtime.cancellation.polls == 0


async def test_cancel_is_recorded_for_a_workflow_awaiting_a_plain_coroutine(
        database_url: str) -> None:
    """A body awaiting something that is not a step stops at its next checkpoint."""
    dbos = new_dbos(database_url)
    gate = asyncio.Event()
    ran_after = False

    @dbos.step(name="after_gate")
    async def after_gate() -> None:
        nonlocal ran_after
        ran_after = True

    @dbos.workflow(name="gated")
    async def gated() -> None:
        await gate.wait()
        await after_gate()

    async with dbos:
        with SetWorkflowID("wf-gated"):
            handle = await dbos.start_workflow(gated)
        await dbos.cancel_workflow("wf-gated")
        gate.set()
        await expect_cancelled(handle)
        assert not ran_after

        async def no_steps() -> bool:
            return await step_rows(database_url, "wf-gated") == []

        await wait_until(no_steps, what="no checkpoints")


async def test_fan_out_steps_are_all_interrupted(database_url: str) -> None:
    dbos = new_dbos(database_url)
    started = 0
    interrupted = 0
    all_started = asyncio.Event()

    @dbos.step(name="slow")
    async def slow(i: int) -> int:
        nonlocal started, interrupted
        started += 1
        if started == 3:
            all_started.set()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            interrupted += 1
            raise
        return i

    @dbos.workflow(name="fan")
    async def fan() -> list[int]:
        return list(await asyncio.gather(slow(0), slow(1), slow(2)))

    async with dbos:
        with SetWorkflowID("wf-fan"):
            handle = await dbos.start_workflow(fan)
        await asyncio.wait_for(all_started.wait(), PATIENCE)
        await dbos.cancel_workflow("wf-fan")
        await expect_cancelled(handle)
        await wait_until(lambda: _true_if(interrupted == 3), what="every step interrupted")


async def _true_if(value: bool) -> bool:
    return value


async def test_a_body_that_catches_the_cancellation_still_ends_cancelled(
        database_url: str) -> None:
    dbos = new_dbos(database_url)
    flow = LongSteps(dbos)
    caught: list[str] = []

    @dbos.step(name="outer_long")
    async def outer_long() -> None:
        flow.started.set()
        await asyncio.sleep(60)

    @dbos.workflow(name="stubborn_direct")
    async def stubborn_direct() -> str:
        try:
            await outer_long()
        except WorkflowCancelledError:
            caught.append("direct")
        async with asyncio.timeout(5):
            await asyncio.sleep(0.01)
        return "ignored"

    async with dbos:
        with SetWorkflowID("wf-stubborn"):
            handle = await dbos.start_workflow(stubborn_direct)
        await asyncio.wait_for(flow.started.wait(), PATIENCE)
        await dbos.cancel_workflow("wf-stubborn")
        await expect_cancelled(handle)
        assert caught == ["direct"]
        status = await dbos.get_workflow_status("wf-stubborn")
        assert status is not None and status.status == "CANCELLED"
