"""What running code can learn of its workflow and step: ``current_workflow_id()``,
``current_step_id()``, ``current_step_attempt()`` and ``current_shard_key()``, in workflow
bodies, in steps (through their retries, nested, fanned out), in children, in a recovered
execution, and outside workflows."""

from __future__ import annotations

import asyncio
from typing import Any

from helpers import new_dbos

from dbos_async import (
    SetShardKey,
    SetWorkflowID,
    current_shard_key,
    current_step_attempt,
    current_step_id,
    current_workflow_id,
)

Seen = tuple[str | None, int | None, int | None, str | None]


def seen_here() -> Seen:
    return current_workflow_id(), current_step_id(), current_step_attempt(), current_shard_key()


async def test_accessors_in_bodies_steps_children_and_outside(database_url: str) -> None:
    dbos = new_dbos(database_url)
    seen: dict[str, list[Seen]] = {}

    def note(where: str) -> None:
        seen.setdefault(where, []).append(seen_here())

    @dbos.step(name="flaky", retries=2, retry_interval=0)
    async def flaky() -> None:
        note("flaky")
        if current_step_attempt() != 3:
            raise ConnectionError("not yet")

    @dbos.step(name="inner", retries=1, retry_interval=0)
    async def inner() -> None:
        note("inner")
        if current_step_attempt() == 1:
            raise ConnectionError("once")

    @dbos.step(name="outer")
    async def outer() -> None:
        note("outer before")
        await inner()  # a step inside a step runs as part of it
        note("outer after")

    @dbos.step(name="fanned")
    async def fanned(label: str) -> None:
        await asyncio.sleep(0)
        note(label)

    @dbos.workflow(name="child")
    async def child() -> None:
        note("child body")
        await fanned("child step")

    @dbos.workflow(name="parent")
    async def parent() -> None:
        note("body before")
        await flaky()                                      # step 0
        await outer()                                      # step 1
        await child()                                      # step 2: child parent-run-2
        await asyncio.gather(fanned("a"), fanned("b"))     # steps 3 and 4
        note("body after")

    note("outside, not entered")
    async with dbos:
        note("outside, entered")
        await fanned("step outside a workflow")
        await flaky()
        with SetWorkflowID("parent-run"):
            await parent()
    assert seen_here() == (None, None, None, None)
    assert seen == {
        "outside, not entered": [(None, None, None, None)],
        "outside, entered": [(None, None, None, None)],
        "step outside a workflow": [(None, None, 1, None)],
        "flaky": [(None, None, 1, None), (None, None, 2, None), (None, None, 3, None),
                  ("parent-run", 0, 1, None), ("parent-run", 0, 2, None),
                  ("parent-run", 0, 3, None)],
        "body before": [("parent-run", None, None, None)],
        "outer before": [("parent-run", 1, 1, None)],
        "inner": [("parent-run", 1, 1, None), ("parent-run", 1, 2, None)],
        "outer after": [("parent-run", 1, 1, None)],
        "child body": [("parent-run-2", None, None, None)],
        "child step": [("parent-run-2", 0, 1, None)],
        "a": [("parent-run", 3, 1, None)],
        "b": [("parent-run", 4, 1, None)],
        "body after": [("parent-run", None, None, None)],
    }


async def test_a_recovered_execution_sees_the_same_ids(database_url: str) -> None:
    """External idempotency keys built from the accessors are stable: the step that
    runs after recovery sees the ID and position the first execution would have."""
    keys: list[str] = []
    reached = asyncio.Event()

    def register(dbos: Any, block: bool) -> Any:
        @dbos.step(name="hold")
        async def hold() -> None:
            reached.set()
            if block:
                await asyncio.Event().wait()

        @dbos.step(name="charge")
        async def charge() -> None:
            keys.append(f"{current_workflow_id()}/{current_step_id()}")

        @dbos.workflow(name="payment")
        async def payment() -> None:
            await hold()
            await charge()

        return payment

    first = new_dbos(database_url, shutdown_grace_period=0)
    payment = register(first, block=True)
    async with first:
        with SetWorkflowID("pay-1"):
            await first.start_workflow(payment)
        await asyncio.wait_for(reached.wait(), 30)
    second = new_dbos(database_url)
    register(second, block=False)
    async with second:
        await (await second.retrieve_workflow("pay-1")).get_result()
    assert keys == ["pay-1/1"]


async def test_the_shard_key_of_the_running_workflow(plain_database_url: str) -> None:
    dbos = new_dbos(plain_database_url, sharding=True)
    seen: list[tuple[str, Seen]] = []

    @dbos.step(name="keyed_step")
    async def keyed_step() -> None:
        seen.append(("step", seen_here()))

    @dbos.workflow(name="keyed_child")
    async def keyed_child() -> None:
        seen.append(("child", seen_here()))

    @dbos.workflow(name="keyed")
    async def keyed() -> None:
        seen.append(("body", seen_here()))
        await keyed_step()
        with SetShardKey("tenant-b"):  # a child under another key: its own
            await keyed_child()

    async with dbos:
        with SetShardKey("tenant-a"):
            seen.append(("caller", seen_here()))  # a key set for starts is not a running one
            with SetWorkflowID("w"):
                await keyed()
    assert seen == [
        ("caller", (None, None, None, None)),
        ("body", ("w", None, None, "tenant-a")),
        ("step", ("w", 0, 1, "tenant-a")),
        ("child", ("8:tenant-a:w-1", None, None, "tenant-b")),
    ]
