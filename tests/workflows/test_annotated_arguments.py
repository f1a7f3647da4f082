"""Arguments are checked against their annotations at the call, before anything is written,
the same way every time: a mistyped argument is refused at the first call as at an
idempotent retry, and a workflow runs with the values a recovery reads back.

Every way a workflow starts from this executor (a direct call, ``start_workflow``, a child
start, an enqueue) and a step call check them. A client's enqueue names the workflow and
does not know its annotations: the inputs are checked when an executor claims the workflow,
which then ends ``ERROR`` with the mismatch.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest
from helpers import new_dbos, wait_until, workflow_row
from pydantic import BaseModel

from dbos_async import DBOSClient, InvalidArgumentError, SetWorkflowID
from tests.workflows.test_input_validation import table_counts


class Order(BaseModel):
    id: int
    item: str


class App:
    def __init__(self, url: str) -> None:
        self.url = url
        self.dbos = dbos = new_dbos(url)
        self.queue = dbos.queue("typed")
        self.ran: list[Any] = []

        @dbos.step()
        async def double(n: int) -> int:
            return n * 2

        @dbos.workflow(name="fine")
        async def fine(n: int) -> int:
            self.ran.append(n)
            return n

        @dbos.workflow(name="place")
        async def place(order: Order, *, note: str = "") -> str:
            self.ran.append(order)
            return f"{order.item}{note}"

        @dbos.workflow(name="stepping")
        async def stepping(text: str) -> int:
            return await double(text)  # type: ignore[arg-type]

        @dbos.workflow(name="parent")
        async def parent() -> int:
            return await fine("abc")  # type: ignore[arg-type]

        @dbos.step()
        async def locked(lock: asyncio.Lock) -> bool:
            return lock.locked()

        self.locked = locked
        self.double, self.fine, self.place = double, fine, place
        self.stepping, self.parent = stepping, parent


@pytest.fixture
async def app(database_url: str) -> Any:
    entered = App(database_url)
    async with entered.dbos:
        yield entered


def refused(argument: str, expected: str) -> Any:
    return pytest.raises(InvalidArgumentError,
                         match=rf"Invalid argument '{argument}' of \S+: expected {expected}")


async def test_a_mistyped_argument_is_refused_at_every_call_with_nothing_written(
        app: App) -> None:
    """It used to run (returning 'abc') and fail only on the retry, reading the result back."""
    before = await table_counts(app.url)
    workflow_id = str(uuid.uuid4())
    for _ in range(2):  # the first call and an idempotent retry agree
        with SetWorkflowID(workflow_id), refused("n", "int"):
            await app.fine("abc")  # type: ignore[arg-type]
    with refused("n", "int"):
        await app.dbos.start_workflow(app.fine, "abc")  # type: ignore[arg-type]
    with refused("n", "int"):
        await app.queue.enqueue(app.fine, n="abc")  # type: ignore[arg-type]
    with refused("order", "Order"):
        await app.dbos.start_workflow(app.place, {"id": "x", "item": "pen"})  # type: ignore[arg-type]
    with refused("note", "str"):
        await app.place(Order(id=1, item="pen"), note=3)  # type: ignore[arg-type]
    with refused("n", "int"):
        await app.double("abc")  # type: ignore[arg-type]
    assert app.ran == []
    assert await table_counts(app.url) == before
    assert await workflow_row(app.url, workflow_id) is None


async def test_a_workflow_runs_with_the_values_a_recovery_reads_back(app: App) -> None:
    """Lax validation, as on the way back: a model given as a dict arrives as the model,
    and the first call returns what a retry returns."""
    workflow_id = str(uuid.uuid4())
    for _ in range(2):
        with SetWorkflowID(workflow_id):
            assert await app.fine("7") == 7  # type: ignore[arg-type]
    assert app.ran == [7]
    assert await app.place({"id": "1", "item": "pen"}) == "pen"  # type: ignore[arg-type]
    assert app.ran[1] == Order(id=1, item="pen")
    handle = await app.queue.enqueue(app.fine, "8")  # type: ignore[arg-type]
    assert await handle.get_result() == 8


async def test_a_mistyped_step_or_child_argument_fails_the_workflow_at_the_call(
        app: App) -> None:
    for workflow, argument in ((app.stepping, "n"), (app.parent, "n")):
        with refused(argument, "int"):
            await workflow("abc") if workflow is app.stepping else await workflow()
    assert app.ran == []


async def test_a_clients_enqueue_is_checked_when_the_workflow_is_claimed(
        database_url: str, app: App) -> None:
    async with DBOSClient(system_database_url=database_url) as client:
        handle = await client.enqueue("typed", "fine", "abc")
        with pytest.raises(Exception, match="does not match its annotation"):
            await handle.get_result()

    async def failed() -> bool:
        row = await workflow_row(database_url, handle.workflow_id)
        return row is not None and row["status"] == "ERROR" \
            and "does not match its annotation" in row["stored_error"]
    await wait_until(failed, what="the client's workflow to fail")
    assert app.ran == []


async def test_a_parameter_pydantic_has_no_schema_for_is_passed_as_it_is(app: App) -> None:
    lock = asyncio.Lock()
    assert await app.locked(lock) is False
