"""The executor's behaviour through its public API, against a real PostgreSQL.

Each test gets a fresh database (the ``database_url`` fixture). Recovery inside one process is
simulated the way a crash looks to the database: an instance runs a workflow until a step
blocks, then exits with ``shutdown_grace_period=0``, which cancels the body and leaves the
workflow PENDING; a second instance with the same executor ID and application version
recovers it on entry. (Real process kills are in ``test_recovery.py``.)
"""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import Enum
from typing import Any

import anyio
import pytest
from helpers import (
    connections_named,
    count_workflows,
    fetchval,
    new_dbos,
    other_tasks,
    step_rows,
    unique_name,
    wait_for_steps,
    wait_no_connections,
    wait_until,
    workflow_row,
)
from pydantic import BaseModel

from dbos_async import (
    DBOS,
    DBOSError,
    NonExistentWorkflowError,
    RecordedError,
    SerializationError,
    SetWorkflowID,
    SetWorkflowTimeout,
    StepRetriesExceededError,
    WorkflowCancelledError,
    WorkflowHandle,
)

# ---- Types for the coercion tests (module level, so annotations resolve) ----


class Color(Enum):
    RED = "red"
    BLUE = "blue"


class Order(BaseModel):
    order_id: int
    items: list[str]
    placed_at: datetime


@dataclass
class Receipt:
    order_id: int
    item_count: int
    token: uuid.UUID


class PaymentDeclinedError(Exception):
    """A user-defined (non-builtin) exception."""


ORDER = Order(order_id=7, items=["apple", "pear"],
              placed_at=datetime(2024, 5, 1, 12, 30, tzinfo=UTC))
WHEN = datetime(2025, 1, 2, 3, 4, 5, 600000, tzinfo=UTC)
TOKEN = uuid.UUID("12345678-1234-5678-1234-567812345678")


def make_gate(dbos: DBOS, gate: asyncio.Event | None, reached: asyncio.Event | None,
              name: str = "gate") -> Any:
    """A step that signals ``reached`` and then waits on ``gate`` (no-op when gate is None).

    Run in a first instance with a gate that is never set, it holds the workflow at a known
    position so the instance can "crash" there.
    """

    @dbos.step(name=name)
    async def gate_step() -> None:
        if reached is not None:
            reached.set()
        if gate is not None:
            await gate.wait()

    return gate_step


async def crash_at_gate(dbos: DBOS, start: Any, reached: asyncio.Event) -> str:
    """Run ``start()`` (which starts a workflow) in ``dbos`` until it reaches its gate step,
    then exit the instance with no grace period: the workflow stays PENDING mid-flight."""
    async with dbos:
        handle: WorkflowHandle[Any] = await start()
        await asyncio.wait_for(reached.wait(), 30)
    return handle.workflow_id


# ---- Steps and results ----


async def test_steps_run_once_and_results_flow(database_url: str) -> None:
    dbos = new_dbos(database_url)
    calls: Counter[str] = Counter()

    @dbos.step(name="double")
    async def double(x: int) -> int:
        calls["double"] += 1
        return x * 2

    @dbos.step(name="add")
    async def add(a: int, b: int) -> int:
        calls["add"] += 1
        return a + b

    @dbos.workflow(name="arith")
    async def arith(x: int) -> int:
        doubled = await double(x)
        return await add(doubled, 1)

    async with dbos:
        with SetWorkflowID("arith-1"):
            assert await arith(5) == 11
        assert calls == {"double": 1, "add": 1}
        rows = await step_rows(database_url, "arith-1")
        assert [(r.function_id, r.function_name, r.output) for r in rows] == [
            (0, "double", 10), (1, "add", 11),
        ]
        status = await (await dbos.retrieve_workflow("arith-1")).get_status()
        assert status.status == "SUCCESS"
        assert status.name == "arith"
        # A step called outside a workflow just runs, unrecorded.
        assert await double(4) == 8
        assert len(await step_rows(database_url, "arith-1")) == 2


async def test_decorators_without_parentheses(database_url: str) -> None:
    """``@dbos.workflow`` and ``@dbos.step`` bare are the same as with ``()``; an option
    passed by position, or ``@dbos.scheduled`` without its cron expression, is refused with
    what to write."""
    dbos = new_dbos(database_url)

    @dbos.step
    async def double(x: int) -> int:
        return x * 2

    @dbos.workflow
    async def doubled(x: int) -> int:
        return await double(x)

    async with dbos:
        with SetWorkflowID("bare-1"):
            assert await doubled(21) == 42
        rows = await step_rows(database_url, "bare-1")
        assert [(r.function_name, r.output) for r in rows] == [(double.__qualname__, 42)]
        status = await (await dbos.retrieve_workflow("bare-1")).get_status()
        assert (status.status, status.name) == ("SUCCESS", doubled.__qualname__)

    with pytest.raises(DBOSError, match=r"@dbos.workflow takes its options by keyword"):
        dbos.workflow("by_position")  # type: ignore[call-overload]
    with pytest.raises(DBOSError, match=r"@dbos.step needs an `async def` function"):
        dbos.step(lambda: None)  # type: ignore[call-overload]
    with pytest.raises(DBOSError, match=r"@dbos.scheduled\('\*/5 \* \* \* \*'\)"):
        dbos.scheduled(doubled)  # type: ignore[arg-type]


async def test_arguments_and_results_are_coerced_to_annotations_on_recovery(
    database_url: str,
) -> None:
    """A recovered workflow gets its inputs back as the annotated types (an ``Order`` model,
    a datetime, a UUID, an Enum), and a replayed step's result as its annotated dataclass."""
    observed: list[tuple[Any, ...]] = []
    receipts_made: Counter[str] = Counter()

    def register(dbos: DBOS, gate: asyncio.Event | None, reached: asyncio.Event | None,
                 label: str) -> Any:
        @dbos.step(name="make_receipt")
        async def make_receipt(order: Order, token: uuid.UUID) -> Receipt:
            receipts_made[label] += 1
            return Receipt(order_id=order.order_id, item_count=len(order.items), token=token)

        wait_gate = make_gate(dbos, gate, reached)

        @dbos.workflow(name="typed")
        async def typed(order: Order, when: datetime, token: uuid.UUID, *,
                        color: Color) -> Receipt:
            receipt = await make_receipt(order, token)
            observed.append((label, order, when, token, color, receipt))
            await wait_gate()
            return receipt

        return typed

    first = new_dbos(database_url, shutdown_grace_period=0)
    reached = asyncio.Event()
    typed = register(first, asyncio.Event(), reached, "first")

    async def start() -> WorkflowHandle[Any]:
        with SetWorkflowID("typed-1"):
            return await first.start_workflow(typed, ORDER, WHEN, TOKEN, color=Color.BLUE)

    await crash_at_gate(first, start, reached)
    assert (await workflow_row(database_url, "typed-1"))["status"] == "PENDING"  # type: ignore[index]

    second = new_dbos(database_url)
    register(second, None, None, "second")
    async with second:
        handle = await second.retrieve_workflow("typed-1")
        result = await handle.get_result()
        assert isinstance(result, Receipt)

        recovered = [o for o in observed if o[0] == "second"]
        assert len(recovered) == 1
        _, order, when, token, color, receipt = recovered[0]
        assert type(order) is Order and order == ORDER
        assert type(when) is datetime and when == WHEN
        assert type(token) is uuid.UUID and token == TOKEN
        assert type(color) is Color and color is Color.BLUE
        # The step was replayed from its checkpoint, not run again, and came back typed.
        assert receipts_made == {"first": 1}
        assert type(receipt) is Receipt
        assert receipt == Receipt(order_id=7, item_count=2, token=TOKEN)

        # A fresh handle reads the stored result and coerces it to the return annotation.
        fresh = await second.retrieve_workflow("typed-1")
        stored = await fresh.get_result()
        assert type(stored) is Receipt and stored == receipt


# ---- Fan-out ----


def register_fanout(dbos: DBOS, gate: asyncio.Event | None, reached: asyncio.Event | None,
                    runs: Counter[str]) -> Any:
    @dbos.step(name="fan")
    async def fan(i: int) -> int:
        runs[f"fan{i}"] += 1
        # Finish in reverse call order: IDs must follow the calls, not the completions.
        await asyncio.sleep(0.01 * (4 - i))
        return i * 10

    @dbos.step(name="label")
    async def label(text: str) -> str:
        runs[f"label-{text}"] += 1
        await asyncio.sleep(0.005)
        return text.upper()

    wait_gate = make_gate(dbos, gate, reached)

    @dbos.workflow(name="fanout")
    async def fanout() -> list[Any]:
        gathered = await asyncio.gather(fan(0), label("x"), fan(1))
        async with asyncio.TaskGroup() as tg:
            third = tg.create_task(fan(2))
            fourth = tg.create_task(label("y"))
        await wait_gate()
        return [*gathered, third.result(), fourth.result()]

    return fanout


EXPECTED_FANOUT_STEPS = [
    (0, "fan", 0), (1, "label", "X"), (2, "fan", 10), (3, "fan", 20), (4, "label", "Y"),
    (5, "gate", None),
]


async def test_gather_and_taskgroup_fanout_get_deterministic_step_ids(database_url: str) -> None:
    runs: Counter[str] = Counter()
    dbos = new_dbos(database_url)
    fanout = register_fanout(dbos, None, None, runs)
    async with dbos:
        with SetWorkflowID("fan-1"):
            assert await fanout() == [0, "X", 10, 20, "Y"]
    rows = await step_rows(database_url, "fan-1")
    assert [(r.function_id, r.function_name, r.output) for r in rows] == EXPECTED_FANOUT_STEPS
    assert all(count == 1 for count in runs.values()) and len(runs) == 5


async def test_fanout_replays_identically_after_recovery(database_url: str) -> None:
    runs: Counter[str] = Counter()
    first = new_dbos(database_url, shutdown_grace_period=0)
    reached = asyncio.Event()
    fanout = register_fanout(first, asyncio.Event(), reached, runs)

    async def start() -> WorkflowHandle[Any]:
        with SetWorkflowID("fan-2"):
            return await first.start_workflow(fanout)

    await crash_at_gate(first, start, reached)
    before = await step_rows(database_url, "fan-2")
    assert [(r.function_id, r.function_name, r.output) for r in before] == (
        EXPECTED_FANOUT_STEPS[:5]
    )

    second = new_dbos(database_url)
    register_fanout(second, None, None, runs)
    async with second:
        handle = await second.retrieve_workflow("fan-2")
        assert await handle.get_result() == [0, "X", 10, 20, "Y"]
    after = await step_rows(database_url, "fan-2")
    assert [(r.function_id, r.function_name, r.output) for r in after] == EXPECTED_FANOUT_STEPS
    # Every fan-out step was replayed from its checkpoint: none ran a second time.
    assert runs == {"fan0": 1, "fan1": 1, "fan2": 1, "label-x": 1, "label-y": 1}


# ---- Child workflows ----


def register_family(dbos: DBOS, gate: asyncio.Event | None, reached: asyncio.Event | None,
                    runs: Counter[str]) -> Any:
    @dbos.step(name="child_step")
    async def child_step(x: int) -> int:
        runs["child_step"] += 1
        return x + 1

    @dbos.workflow(name="child")
    async def child(x: int) -> int:
        runs[f"child({x})"] += 1
        return await child_step(x)

    wait_gate = make_gate(dbos, gate, reached)

    @dbos.workflow(name="parent")
    async def parent(x: int) -> int:
        direct = await child(x)
        handle = await dbos.start_workflow(child, x * 10)
        started = await handle.get_result()
        await wait_gate()
        return direct + started

    return parent


async def test_child_workflows_are_checkpointed_and_not_restarted_on_replay(
    database_url: str,
) -> None:
    runs: Counter[str] = Counter()
    first = new_dbos(database_url, shutdown_grace_period=0)
    reached = asyncio.Event()
    parent = register_family(first, asyncio.Event(), reached, runs)

    async def start() -> WorkflowHandle[Any]:
        with SetWorkflowID("family"):
            return await first.start_workflow(parent, 2)

    await crash_at_gate(first, start, reached)
    assert runs == {"child(2)": 1, "child(20)": 1, "child_step": 2}

    rows = await step_rows(database_url, "family")
    assert [(r.function_id, r.function_name, r.child_workflow_id) for r in rows] == [
        (0, "child", "family-0"), (1, "child", "family-1"),
    ]
    for child_id in ("family-0", "family-1"):
        row = await workflow_row(database_url, child_id)
        assert row is not None
        assert row["status"] == "SUCCESS" and row["parent_workflow_id"] == "family"

    second = new_dbos(database_url)
    register_family(second, None, None, runs)
    async with second:
        handle = await second.retrieve_workflow("family")
        assert await handle.get_result() == (2 + 1) + (20 + 1)
    # On replay the parent found both children through its checkpoints: none ran again.
    assert runs == {"child(2)": 1, "child(20)": 1, "child_step": 2}
    assert await count_workflows(database_url) == 3
    rows = await step_rows(database_url, "family")
    assert [(r.function_id, r.function_name) for r in rows] == [
        (0, "child"), (1, "child"), (2, "gate"),
    ]


# ---- Idempotent start ----


async def test_set_workflow_id_makes_start_idempotent(database_url: str) -> None:
    dbos = new_dbos(database_url)
    executions: Counter[str] = Counter()

    @dbos.workflow(name="once")
    async def once(x: int) -> str:
        executions["once"] += 1
        return f"result-{x}-{executions['once']}"

    async with dbos:
        with SetWorkflowID("idem-1"):
            first = await once(1)
        with SetWorkflowID("idem-1"):
            second = await once(1)
        with SetWorkflowID("idem-1"):
            handle = await dbos.start_workflow(once, 1)
        assert handle.workflow_id == "idem-1"
        assert first == second == await handle.get_result() == "result-1-1"
        assert executions["once"] == 1
        assert await count_workflows(database_url) == 1
        # SetWorkflowID applies to one start only: the next start gets a fresh ID.
        with SetWorkflowID("idem-2"):
            await once(2)
            other = await dbos.start_workflow(once, 3)
        assert other.workflow_id not in ("idem-1", "idem-2")
        await other.get_result()
        assert executions["once"] == 3


async def test_idempotent_start_while_running_joins_the_running_execution(
    database_url: str,
) -> None:
    dbos = new_dbos(database_url)
    release = asyncio.Event()
    executions: Counter[str] = Counter()

    @dbos.workflow(name="slow_once")
    async def slow_once() -> int:
        executions["slow_once"] += 1
        await release.wait()
        return 42

    async with dbos:
        with SetWorkflowID("idem-running"):
            first = await dbos.start_workflow(slow_once)
        with SetWorkflowID("idem-running"):
            second = await dbos.start_workflow(slow_once)
        release.set()
        assert await first.get_result() == await second.get_result() == 42
        assert executions["slow_once"] == 1


async def test_same_id_for_a_different_workflow_is_an_error(database_url: str) -> None:
    dbos = new_dbos(database_url)
    release = asyncio.Event()

    @dbos.workflow(name="wf_alpha")
    async def wf_alpha() -> str:
        await release.wait()
        return "alpha"

    @dbos.workflow(name="wf_beta")
    async def wf_beta() -> str:
        return "beta"

    async with dbos:
        # While the first is still running here...
        with SetWorkflowID("shared-id"):
            alpha = await dbos.start_workflow(wf_alpha)
        with pytest.raises(DBOSError) as running_error, SetWorkflowID("shared-id"):
            await dbos.start_workflow(wf_beta)
        release.set()
        assert await alpha.get_result() == "alpha"
        # ...and once it has finished.
        with pytest.raises(DBOSError) as finished_error, SetWorkflowID("shared-id"):
            await wf_beta()
        for error in (running_error.value, finished_error.value):
            message = str(error)
            assert "shared-id" in message and "wf_alpha" in message and "wf_beta" in message
        row = await workflow_row(database_url, "shared-id")
        assert row is not None and row["name"] == "wf_alpha" and row["status"] == "SUCCESS"


# ---- Errors ----


async def test_workflow_exception_is_recorded_and_reraised(database_url: str) -> None:
    dbos = new_dbos(database_url)
    other = new_dbos(database_url, executor_id="other-executor")

    @dbos.workflow(name="fails")
    async def fails(n: int) -> None:
        raise ValueError(f"bad input {n}")

    async with dbos, other:
        with SetWorkflowID("fails-1"), pytest.raises(ValueError, match="bad input 42"):
            await fails(42)
        # A handle from another DBOS instance (which does not even know the function).
        handle = await other.retrieve_workflow("fails-1")
        with pytest.raises(RecordedError) as caught:
            await handle.get_result()
        error = caught.value
        assert isinstance(error, ValueError)
        assert error.name == "ValueError"
        assert error.message == "bad input 42"
        assert "bad input 42" in str(error)
        assert (await handle.get_status()).status == "ERROR"
        # Starting it again with the same ID raises the recorded error without running it.
        with SetWorkflowID("fails-1"), pytest.raises(ValueError, match="bad input 42"):
            await fails(1)


async def test_step_exception_is_recorded_and_reraised(database_url: str) -> None:
    dbos = new_dbos(database_url)
    other = new_dbos(database_url, executor_id="other-executor")
    attempts: Counter[str] = Counter()

    @dbos.step(name="charge")
    async def charge(card: str) -> None:
        attempts["charge"] += 1
        raise PaymentDeclinedError(f"card {card} declined")

    @dbos.workflow(name="checkout")
    async def checkout(card: str) -> None:
        await charge(card)

    async with dbos, other:
        with SetWorkflowID("checkout-1"), pytest.raises(PaymentDeclinedError, match="4242"):
            await checkout("4242")
        assert attempts["charge"] == 1
        [row] = await step_rows(database_url, "checkout-1")
        assert row.function_name == "charge" and row.output is None
        assert row.error is not None
        assert row.error["name"] == "PaymentDeclinedError"
        assert row.error["message"] == "card 4242 declined"
        handle = await other.retrieve_workflow("checkout-1")
        with pytest.raises(RecordedError) as caught:
            await handle.get_result()
        assert caught.value.name == "PaymentDeclinedError"
        assert caught.value.message == "card 4242 declined"
        assert not isinstance(caught.value, ValueError)


async def test_recorded_step_error_replays_as_the_builtin_type(database_url: str) -> None:
    """A workflow that handled a step's ``ValueError`` handles it the same way on replay."""
    attempts: Counter[str] = Counter()
    seen: list[tuple[str, BaseException]] = []

    def register(dbos: DBOS, gate: asyncio.Event | None, reached: asyncio.Event | None,
                 label: str) -> Any:
        @dbos.step(name="parse")
        async def parse(text: str) -> int:
            attempts["parse"] += 1
            return int(text)

        wait_gate = make_gate(dbos, gate, reached)

        @dbos.workflow(name="tolerant")
        async def tolerant(text: str) -> int:
            try:
                value = await parse(text)
            except ValueError as error:
                seen.append((label, error))
                value = -1
            await wait_gate()
            return value

        return tolerant

    first = new_dbos(database_url, shutdown_grace_period=0)
    reached = asyncio.Event()
    tolerant = register(first, asyncio.Event(), reached, "first")

    async def start() -> WorkflowHandle[Any]:
        with SetWorkflowID("tolerant-1"):
            return await first.start_workflow(tolerant, "not a number")

    await crash_at_gate(first, start, reached)
    second = new_dbos(database_url)
    register(second, None, None, "second")
    async with second:
        assert await (await second.retrieve_workflow("tolerant-1")).get_result() == -1
    assert attempts["parse"] == 1
    [(_, live), (label, replayed)] = seen
    assert label == "second"
    # The body caught the recorded form both times (the original is the live one's cause).
    assert type(live) is type(replayed)
    assert isinstance(replayed, RecordedError) and isinstance(replayed, ValueError)
    assert type(live.__cause__) is ValueError
    assert str(replayed) == str(live) == str(live.__cause__)


# ---- Step retries and timeouts ----


async def test_step_retries_until_success(database_url: str) -> None:
    dbos = new_dbos(database_url)
    attempts: Counter[str] = Counter()

    @dbos.step(name="flaky", retries=3, retry_interval=0.01, backoff_rate=1.5)
    async def flaky() -> str:
        attempts["flaky"] += 1
        if attempts["flaky"] < 3:
            raise ConnectionError(f"attempt {attempts['flaky']} failed")
        return "ok"

    @dbos.workflow(name="uses_flaky")
    async def uses_flaky() -> str:
        return await flaky()

    async with dbos:
        with SetWorkflowID("flaky-1"):
            assert await uses_flaky() == "ok"
    assert attempts["flaky"] == 3
    [row] = await step_rows(database_url, "flaky-1")
    assert row.output == "ok" and row.error is None


async def test_retry_on_stops_retrying_other_errors(database_url: str) -> None:
    dbos = new_dbos(database_url)
    attempts: Counter[str] = Counter()

    @dbos.step(name="picky", retries=5, retry_interval=0.01,
               retry_on=lambda error: isinstance(error, ConnectionError))
    async def picky(kind: str) -> str:
        attempts[kind] += 1
        if kind == "value":
            raise ValueError("not retryable")
        if attempts[kind] < 2:
            raise ConnectionError("retryable")
        return kind

    @dbos.step(name="typed_picky", retries=5, retry_interval=0.01, retry_on=(TimeoutError,))
    async def typed_picky() -> None:
        attempts["typed"] += 1
        raise KeyError("not in retry_on")

    @dbos.workflow(name="uses_picky")
    async def uses_picky(kind: str) -> str:
        if kind == "typed":
            await typed_picky()
        return await picky(kind)

    async with dbos:
        with pytest.raises(ValueError, match="not retryable"):
            await uses_picky("value")
        assert attempts["value"] == 1
        with pytest.raises(KeyError):
            await uses_picky("typed")
        assert attempts["typed"] == 1
        assert await uses_picky("conn") == "conn"
        assert attempts["conn"] == 2


async def test_exhausted_retries_raise_step_retries_exceeded(database_url: str) -> None:
    dbos = new_dbos(database_url)
    attempts: Counter[str] = Counter()

    @dbos.step(name="broken", retries=2, retry_interval=0.01)
    async def broken() -> None:
        attempts["broken"] += 1
        raise ConnectionError(f"failure {attempts['broken']}")

    @dbos.workflow(name="uses_broken")
    async def uses_broken() -> None:
        await broken()

    async with dbos:
        with SetWorkflowID("broken-1"), pytest.raises(StepRetriesExceededError) as caught:
            await uses_broken()
        assert attempts["broken"] == 3
        error = caught.value
        assert error.attempts == 3 and error.step_name == "broken"
        assert [str(e) for e in error.errors] == ["failure 1", "failure 2", "failure 3"]
        [row] = await step_rows(database_url, "broken-1")
        assert row.error is not None and row.error["name"] == "StepRetriesExceededError"
        assert (await workflow_row(database_url, "broken-1"))["status"] == "ERROR"  # type: ignore[index]


async def test_step_timeout_bounds_each_attempt(database_url: str) -> None:
    dbos = new_dbos(database_url)
    attempts: Counter[str] = Counter()

    @dbos.step(name="hangs_once", retries=2, retry_interval=0.01, timeout=0.1)
    async def hangs_once() -> str:
        attempts["hangs_once"] += 1
        if attempts["hangs_once"] == 1:
            await asyncio.sleep(60)
        return "second attempt"

    @dbos.step(name="always_hangs", timeout=0.05)
    async def always_hangs() -> None:
        attempts["always_hangs"] += 1
        await asyncio.sleep(60)

    @dbos.workflow(name="uses_timeouts")
    async def uses_timeouts(which: str) -> str | None:
        if which == "once":
            return await hangs_once()
        await always_hangs()
        return None

    async with dbos:
        # The first attempt was cut off by the per-attempt timeout; the retry succeeded.
        assert await asyncio.wait_for(uses_timeouts("once"), 30) == "second attempt"
        assert attempts["hangs_once"] == 2
        with SetWorkflowID("hangs"), pytest.raises(TimeoutError):
            await asyncio.wait_for(uses_timeouts("always"), 30)
        assert attempts["always_hangs"] == 1
        [row] = await step_rows(database_url, "hangs")
        assert row.error is not None and row.error["name"] == "TimeoutError"


# ---- Workflow timeouts ----


async def test_workflow_timeout_cancels_the_workflow(database_url: str) -> None:
    dbos = new_dbos(database_url)

    @dbos.step(name="wait_forever")
    async def wait_forever() -> None:
        await asyncio.Event().wait()

    @dbos.workflow(name="overdue")
    async def overdue() -> None:
        await wait_forever()

    @dbos.workflow(name="prompt")
    async def prompt() -> str:
        return "in time"

    async with dbos:
        with SetWorkflowTimeout(0.2):
            handle = await dbos.start_workflow(overdue)
            in_time = await dbos.start_workflow(prompt)
        with pytest.raises(WorkflowCancelledError):
            await asyncio.wait_for(handle.get_result(), 30)
        status = await handle.get_status()
        assert status.status == "CANCELLED"
        assert status.timeout_ms == 200
        assert status.deadline_epoch_ms is not None
        # The interrupted step recorded nothing.
        assert await step_rows(database_url, handle.workflow_id) == []
        # Another handle reads the cancellation from the database.
        with pytest.raises(WorkflowCancelledError):
            await (await dbos.retrieve_workflow(handle.workflow_id)).get_result()
        assert await in_time.get_result() == "in time"
        assert (await in_time.get_status()).status == "SUCCESS"


async def test_children_inherit_the_parent_deadline(database_url: str) -> None:
    dbos = new_dbos(database_url)

    @dbos.step(name="wait_forever")
    async def wait_forever() -> None:
        await asyncio.Event().wait()

    @dbos.workflow(name="stuck_child")
    async def stuck_child() -> None:
        await wait_forever()

    @dbos.workflow(name="timed_parent")
    async def timed_parent() -> None:
        # A child's own, longer timeout cannot extend the parent's deadline.
        with SetWorkflowTimeout(600):
            started = await dbos.start_workflow(stuck_child)
        await started.get_result()

    async with dbos:
        with SetWorkflowTimeout(0.3), SetWorkflowID("timed"):
            parent = await dbos.start_workflow(timed_parent)
        with pytest.raises(WorkflowCancelledError):
            await asyncio.wait_for(parent.get_result(), 30)
        child = await dbos.retrieve_workflow("timed-0")
        with pytest.raises(WorkflowCancelledError):
            await asyncio.wait_for(child.get_result(), 30)
        parent_status, child_status = await parent.get_status(), await child.get_status()
        assert parent_status.status == child_status.status == "CANCELLED"
        assert child_status.parent_workflow_id == "timed"
        assert child_status.deadline_epoch_ms == parent_status.deadline_epoch_ms


# ---- Instances, serialization, misuse ----


def make_account_class(dbos: DBOS, runs: Counter[str], gate: asyncio.Event | None,
                       reached: asyncio.Event | None) -> type:
    wait_gate = make_gate(dbos, gate, reached)

    @dbos.step(name="ledger")
    async def ledger(owner: str, amount: int) -> int:
        runs[f"ledger-{owner}"] += 1
        return amount

    class Account:
        def __init__(self, owner: str) -> None:
            self.owner = owner
            self.balance = 0

        @dbos.workflow(name="Account.deposit")
        async def deposit(self, amount: int) -> str:
            self.balance += await ledger(self.owner, amount)
            await wait_gate()
            return f"{self.owner}:{self.balance}"

    return Account


async def test_workflow_methods_on_a_registered_instance(database_url: str) -> None:
    runs: Counter[str] = Counter()
    first = new_dbos(database_url, shutdown_grace_period=0)
    reached = asyncio.Event()
    account_class = make_account_class(first, runs, asyncio.Event(), reached)
    alice = account_class("alice")
    first.register_instance(alice, "alice-account")

    async def start() -> WorkflowHandle[Any]:
        with SetWorkflowID("deposit-1"):
            return await first.start_workflow(alice.deposit, 5)

    await crash_at_gate(first, start, reached)
    row = await workflow_row(database_url, "deposit-1")
    assert row is not None
    assert row["class_name"].endswith("Account") and row["config_name"] == "alice-account"

    # Recovery finds the instance by its registered name and calls the method on it.
    second = new_dbos(database_url)
    account_class2 = make_account_class(second, runs, None, None)
    alice2, bob = account_class2("alice"), account_class2("bob")
    second.register_instance(alice2, "alice-account")
    second.register_instance(bob, "bob-account")
    async with second:
        assert await (await second.retrieve_workflow("deposit-1")).get_result() == "alice:5"
        assert alice2.balance == 5 and bob.balance == 0
        assert runs == {"ledger-alice": 1}  # replayed on alice2, not re-run
        # Direct calls and start_workflow on bound methods.
        assert await bob.deposit(3) == "bob:3"
        handle = await second.start_workflow(bob.deposit, 4)
        assert await handle.get_result() == "bob:7"
        status = await handle.get_status()
        assert status.config_name == "bob-account"
        # A method called on an unregistered instance is refused.
        with pytest.raises(DBOSError, match="register_instance"):
            await account_class2("carol").deposit(1)


async def test_non_serializable_argument_writes_no_row(database_url: str) -> None:
    dbos = new_dbos(database_url)
    runs: Counter[str] = Counter()

    @dbos.workflow(name="takes_anything")
    async def takes_anything(value: Any) -> None:
        runs["takes_anything"] += 1

    async with dbos:
        with pytest.raises(SerializationError, match="argument 0"):
            await takes_anything(object())
        with pytest.raises(SerializationError), SetWorkflowID("bad-arg"):
            await dbos.start_workflow(takes_anything, {"socket": object()})
        assert await count_workflows(database_url) == 0
        assert runs["takes_anything"] == 0
        # The chosen ID is still free.
        with SetWorkflowID("bad-arg"):
            await takes_anything({"fine": 1})
        assert await count_workflows(database_url) == 1


async def test_non_serializable_step_result_records_no_step(database_url: str) -> None:
    dbos = new_dbos(database_url)

    @dbos.step(name="returns_object")
    async def returns_object() -> Any:
        return object()

    @dbos.workflow(name="bad_result")
    async def bad_result() -> None:
        await returns_object()

    async with dbos:
        with SetWorkflowID("bad-result"), pytest.raises(SerializationError):
            await bad_result()
        assert await step_rows(database_url, "bad-result") == []
        row = await workflow_row(database_url, "bad-result")
        assert row is not None and row["status"] == "ERROR"
        assert '"SerializationError"' in row["stored_error"]


async def test_start_workflow_with_a_non_workflow_is_an_error(database_url: str) -> None:
    dbos = new_dbos(database_url)

    @dbos.step(name="just_a_step")
    async def just_a_step() -> None:
        pass

    async def plain() -> None:
        pass

    async with dbos:
        with pytest.raises(DBOSError, match="not a workflow"):
            await dbos.start_workflow(plain)
        with pytest.raises(DBOSError, match="not a workflow"):
            await dbos.start_workflow(just_a_step)
    assert await count_workflows(database_url) == 0


# ---- Lifecycle ----


async def test_exit_leaves_no_task_and_no_connection(database_url: str) -> None:
    name = unique_name("dbos_exit")
    dbos = new_dbos(database_url, connection_name=name, shutdown_grace_period=0)
    blocker = asyncio.Event()

    @dbos.step(name="work")
    async def work(i: int) -> int:
        await asyncio.sleep(0.001)
        return i

    @dbos.workflow(name="some_work")
    async def some_work(i: int) -> int:
        parts = await asyncio.gather(work(i), work(i + 1))
        return sum(parts)

    @dbos.workflow(name="never_done")
    async def never_done() -> None:
        await blocker.wait()

    assert other_tasks() == set()
    async with dbos:
        results = await asyncio.gather(*(some_work(i) for i in range(5)))
        assert results == [1, 3, 5, 7, 9]
        handle = await dbos.start_workflow(never_done)
        assert len(other_tasks()) >= 1  # the running workflow is a task
        assert await connections_named(database_url, name) >= 1
    assert other_tasks() == set()
    await wait_no_connections(database_url, name)
    # The unfinished workflow stays PENDING for recovery.
    assert await fetchval(database_url,
                          "SELECT status FROM dbos.workflow_status WHERE workflow_uuid = $1",
                          handle.workflow_id) == "PENDING"
    with pytest.raises(DBOSError, match="shut down"):
        await dbos.retrieve_workflow(handle.workflow_id)


async def test_steps_recorded_while_workflow_runs(database_url: str) -> None:
    """Checkpoints are written as each step completes, not at the end of the workflow."""
    dbos = new_dbos(database_url)
    release = asyncio.Event()

    @dbos.step(name="early")
    async def early() -> str:
        return "early"

    @dbos.step(name="late")
    async def late() -> str:
        await release.wait()
        return "late"

    @dbos.workflow(name="two_phase")
    async def two_phase() -> list[str]:
        return [await early(), await late()]

    async with dbos:
        with SetWorkflowID("two-phase"):
            handle = await dbos.start_workflow(two_phase)
        await wait_for_steps(database_url, "two-phase", 1)
        assert (await handle.get_status()).status == "PENDING"
        release.set()
        assert await handle.get_result() == ["early", "late"]

    async def succeeded() -> bool:
        row = await workflow_row(database_url, "two-phase")
        return row is not None and row["status"] == "SUCCESS"

    await wait_until(succeeded, what="two-phase to succeed")


async def test_exit_lets_running_workflows_finish_within_the_grace_period(
    database_url: str,
) -> None:
    dbos = new_dbos(database_url, shutdown_grace_period=30)
    started = asyncio.Event()

    @dbos.step(name="slow_step")
    async def slow_step(x: int) -> int:
        await asyncio.sleep(0.1)
        return x

    @dbos.workflow(name="late_child")
    async def late_child(x: int) -> int:
        return await slow_step(x)

    @dbos.workflow(name="finishing")
    async def finishing() -> str:
        started.set()
        await slow_step(1)
        # Started (not awaited) during the grace period: it is a running workflow too.
        await dbos.start_workflow(late_child, 2)
        return "finished"

    async with dbos:
        with SetWorkflowID("finishing"):
            handle = await dbos.start_workflow(finishing)
        await started.wait()
    assert other_tasks() == set()
    assert await handle.get_result() == "finished"
    for workflow_id in ("finishing", "finishing-1"):
        row = await workflow_row(database_url, workflow_id)
        assert row is not None and row["status"] == "SUCCESS", workflow_id


async def test_exit_cancels_a_workflow_until_it_ends_and_honours_its_shield(
    database_url: str,
) -> None:
    """Shutdown's cancellation is anyio's: a shielded section finishes first, and a body that
    swallows the cancellation is cancelled again at its next await, until it ends."""
    dbos = new_dbos(database_url, shutdown_grace_period=0)
    started = asyncio.Event()
    shielded_section_done = False
    swallowed = 0

    @dbos.workflow(name="stubborn")
    async def stubborn() -> None:
        nonlocal shielded_section_done, swallowed
        started.set()
        with anyio.CancelScope(shield=True):
            await asyncio.sleep(0.2)
        shielded_section_done = True
        while True:
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                swallowed += 1
                if swallowed == 3:
                    raise

    async with asyncio.timeout(30):
        async with dbos:
            with SetWorkflowID("stubborn"):
                await dbos.start_workflow(stubborn)
            await started.wait()
    assert other_tasks() == set()
    assert shielded_section_done and swallowed == 3
    row = await workflow_row(database_url, "stubborn")
    assert row is not None and row["status"] == "PENDING"  # it resumes on recovery


async def test_misuse_outside_the_lifecycle(database_url: str) -> None:
    dbos = new_dbos(database_url)

    @dbos.workflow(name="simple")
    async def simple() -> int:
        return 1

    with pytest.raises(DBOSError, match="enter it first"):
        await simple()
    async with dbos:
        with pytest.raises(NonExistentWorkflowError):
            await dbos.retrieve_workflow("no-such-workflow")
        assert await dbos.get_workflow_status("no-such-workflow") is None
        assert await simple() == 1
    with pytest.raises(DBOSError, match="shut down"):
        await simple()


async def test_recovered_workflow_keeps_its_deadline(database_url: str) -> None:
    def register(dbos: DBOS, reached: asyncio.Event | None) -> Any:
        wait_forever = make_gate(dbos, asyncio.Event(), reached)

        @dbos.workflow(name="deadlined")
        async def deadlined() -> None:
            await wait_forever()

        return deadlined

    first = new_dbos(database_url, shutdown_grace_period=0)
    reached = asyncio.Event()
    deadlined = register(first, reached)

    async def start() -> WorkflowHandle[Any]:
        with SetWorkflowTimeout(0.5), SetWorkflowID("deadlined"):
            return await first.start_workflow(deadlined)

    await crash_at_gate(first, start, reached)
    before = await workflow_row(database_url, "deadlined")
    assert before is not None and before["status"] == "PENDING"

    second = new_dbos(database_url)
    register(second, None)
    async with second:
        handle = await second.retrieve_workflow("deadlined")
        with pytest.raises(WorkflowCancelledError):
            await asyncio.wait_for(handle.get_result(), 30)
    after = await workflow_row(database_url, "deadlined")
    assert after is not None and after["status"] == "CANCELLED"
    assert after["recovery_attempts"] == 2  # it was recovered, then hit its original deadline
    assert after["workflow_deadline_epoch_ms"] == before["workflow_deadline_epoch_ms"]
