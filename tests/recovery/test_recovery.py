"""Recovery: real crashes, executors racing for a workflow, stale executions, and the errors
recovery reports (nondeterminism, unregistered workflows).

The crash tests SIGKILL a real worker process (``tests/helpers/recovery_worker.py``) in the
middle of a workflow and let a second process, with the same executor ID and application
version, finish it. The in-process tests create the PENDING state the way a crash leaves it:
an instance exits with ``shutdown_grace_period=0`` while a step is blocked, which cancels the
body and leaves the row PENDING with its completed steps checkpointed.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from helpers import (
    execute,
    fetch,
    new_dbos,
    step_rows,
    take_executor_id_away,
    wait_for_steps,
    wait_until,
    workflow_row,
)

from dbos_async import (
    DBOS,
    DBOSClient,
    NondeterminismError,
    RecordedError,
    SetWorkflowID,
    WorkflowHandle,
    WorkflowNotRegisteredError,
)

WORKER = Path(__file__).resolve().parents[1] / "helpers" / "recovery_worker.py"
LOAD_WORKFLOWS, LOAD_STEPS = 200, 6  # as in the worker's "load" kind


# ---- Crash and restart with real processes ----


async def spawn_worker(url: str, mode: str, kind: str,
                       workflow_id: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable, str(WORKER), url, mode, kind, workflow_id,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )


async def wait_steps_or_exit(url: str, workflow_id: str, count: int,
                             proc: asyncio.subprocess.Process) -> None:
    """Wait until ``count`` steps are recorded; fail at once if the worker died instead."""

    async def ready() -> bool:
        if proc.returncode is not None:
            _, err = await proc.communicate()
            raise AssertionError(f"worker exited early ({proc.returncode}): {err.decode()}")
        try:
            return len(await step_rows(url, workflow_id)) >= count
        except asyncpg.UndefinedTableError:
            return False  # the worker has not created the system schema yet

    await wait_until(ready, patience=60, what=f"{count} recorded steps of {workflow_id}")


async def kill(proc: asyncio.subprocess.Process) -> None:
    proc.kill()  # SIGKILL: no shutdown code runs, exactly like a crash.
    await proc.communicate()
    assert proc.returncode == -9


async def recover_in_new_process(url: str, kind: str, workflow_id: str) -> Any:
    proc = await spawn_worker(url, "recover", kind, workflow_id)
    try:
        out, err = await asyncio.wait_for(proc.communicate(), 120)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.communicate()
    assert proc.returncode == 0, err.decode()
    return json.loads(out.decode().strip().splitlines()[-1])


async def side_effect_counts(url: str) -> Counter[str]:
    rows = await fetch(url, "SELECT step, count(*) AS n FROM side_effects GROUP BY step")
    return Counter({r["step"]: int(r["n"]) for r in rows})


@pytest.fixture
async def side_effects_url(database_url: str) -> str:
    await execute(database_url, "CREATE TABLE side_effects (step text NOT NULL)")
    return database_url


async def test_sigkilled_workflow_is_recovered_by_a_new_process(side_effects_url: str) -> None:
    url, workflow_id = side_effects_url, "crash-sequential"
    first = await spawn_worker(url, "start", "sequential", workflow_id)
    try:
        await wait_steps_or_exit(url, workflow_id, 2, first)
    finally:
        await kill(first)

    # Nothing writes any more: this is exactly what the crash left behind.
    recorded = {r.function_id for r in await step_rows(url, workflow_id)}
    row = await workflow_row(url, workflow_id)
    assert row is not None and row["status"] == "PENDING", "the kill must land mid-workflow"
    assert 2 <= len(recorded) < 5 and recorded == set(range(len(recorded)))
    in_flight = len(recorded)  # the step that was running when the process died

    result = await recover_in_new_process(url, "sequential", workflow_id)
    assert result == [f"done-{i}" for i in range(5)]

    row = await workflow_row(url, workflow_id)
    assert row is not None and row["status"] == "SUCCESS"
    assert json.loads(row["stored_output"]) == result
    assert row["recovery_attempts"] == 2  # created once, claimed once by the recovery
    rows = await step_rows(url, workflow_id)
    assert [(r.function_id, r.function_name, r.output) for r in rows] == [
        (i, "seq_step", f"done-{i}") for i in range(5)
    ]

    counts = await side_effect_counts(url)
    for i in range(5):
        if i == in_flight:
            # The step in flight at the kill may already have done its side effect; it was
            # not checkpointed, so the recovery ran it again: at-least-once, at most twice
            # here (once per process). Every other step ran exactly once: the recorded ones
            # were replayed from their checkpoints, the later ones ran only after recovery.
            assert 1 <= counts[f"seq-{i}"] <= 2
        else:
            assert counts[f"seq-{i}"] == 1, (i, counts)


async def test_sigkilled_fanout_replays_deterministically(side_effects_url: str) -> None:
    url, workflow_id = side_effects_url, "crash-fanout"
    first = await spawn_worker(url, "start", "fanout", workflow_id)
    try:
        await wait_steps_or_exit(url, workflow_id, 1, first)
    finally:
        await kill(first)

    before = {r.function_id: r.output for r in await step_rows(url, workflow_id)}
    row = await workflow_row(url, workflow_id)
    assert row is not None and row["status"] == "PENDING", "the kill must land mid-workflow"
    assert before and 4 not in before
    # Each gathered call owns the step ID of its position in the call order.
    assert all(before[i] == i * i for i in before)

    result = await recover_in_new_process(url, "fanout", workflow_id)
    assert result == {"squares": [0, 1, 4, 9], "total": 14}
    rows = await step_rows(url, workflow_id)
    assert [(r.function_id, r.function_name, r.output) for r in rows] == [
        (0, "fan_step", 0), (1, "fan_step", 1), (2, "fan_step", 4), (3, "fan_step", 9),
        (4, "sum_step", 14),
    ]
    counts = await side_effect_counts(url)
    for i in range(4):
        if i in before:
            assert counts[f"fan-{i}"] == 1  # checkpointed before the kill: replayed
        else:
            # In flight at the kill (gather starts them all at once): ran again on recovery.
            assert 1 <= counts[f"fan-{i}"] <= 2
    assert counts["sum"] == 1


@pytest.mark.parametrize("keys", ["", "acme,globex,initech"], ids=["unsharded", "sharded"])
async def test_sigkill_under_group_committed_load_loses_nothing(side_effects_url: str,
                                                                keys: str) -> None:
    """200 workflows stepping together (their checkpoints group-committed, several per
    statement) are SIGKILLed mid-way: a new process finishes every one, every step
    checkpointed before the kill was replayed, not run again, and each workflow continued
    only past committed checkpoints (its recorded steps are a prefix of its steps)."""
    url, prefix = side_effects_url, "load"
    members = [f"{prefix}-{n}" for n in range(LOAD_WORKFLOWS)]
    first = await asyncio.create_subprocess_exec(
        sys.executable, str(WORKER), url, "start", "load", prefix, keys,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)

    async def a_third_recorded() -> bool:
        if first.returncode is not None:
            raise AssertionError((await first.communicate())[1].decode())
        try:
            rows = await fetch(url, "SELECT count(*) AS n FROM dbos.operation_outputs")
        except asyncpg.UndefinedTableError:
            return False  # the worker has not created the system schema yet
        return int(rows[0]["n"]) >= LOAD_WORKFLOWS * LOAD_STEPS // 3

    try:
        assert first.stdout is not None
        line = await asyncio.wait_for(first.stdout.readline(), 120)
        assert line.strip() == b"started", line  # every workflow of the load exists
        await wait_until(a_third_recorded, patience=120, what="a third of the steps recorded")
    finally:
        await kill(first)

    recorded: dict[str, set[int]] = {m: set() for m in members}
    for r in await fetch(url, "SELECT workflow_uuid, function_id FROM dbos.operation_outputs"):
        recorded[r["workflow_uuid"]].add(r["function_id"])
    statuses = Counter(r["status"] for r in await fetch(
        url, "SELECT status FROM dbos.workflow_status"))
    assert statuses["PENDING"] > 0, "the kill must land mid-load"
    for member in members:
        assert recorded[member] == set(range(len(recorded[member]))), member

    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(WORKER), url, "recover", "load", prefix, keys,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 240)
    assert proc.returncode == 0, err.decode()
    results = json.loads(out.decode().strip().splitlines()[-1])
    assert results == {f"{prefix}-{n}": [n * LOAD_STEPS + i for i in range(LOAD_STEPS)]
                       for n in range(LOAD_WORKFLOWS)}
    counts = await side_effect_counts(url)
    for n, member in enumerate(members):
        for i in range(LOAD_STEPS):
            ran = counts[f"load-{n}-{i}"]
            if i in recorded[member]:
                assert ran == 1, (member, i, ran)  # checkpointed before the kill: replayed
            else:
                assert 1 <= ran <= 2, (member, i, ran)  # in flight at the kill, or later


# ---- Executors racing for the same workflow ----


def register_race(dbos: DBOS, label: str, gate: asyncio.Event | None,
                  reached: asyncio.Event | None, runs: Counter[tuple[str, int]]) -> Any:
    """A 4-step workflow; step 1 signals ``reached`` and waits on ``gate`` (if given)."""

    @dbos.step(name="race_step")
    async def race_step(i: int) -> str:
        runs[label, i] += 1
        if i == 1:
            if reached is not None:
                reached.set()
            if gate is not None:
                await gate.wait()
        await asyncio.sleep(0.01)
        return f"{label}-{i}"

    @dbos.workflow(name="race_wf")
    async def race_wf() -> list[str]:
        return [await race_step(i) for i in range(4)]

    return race_wf


async def leave_pending(url: str, runs: Counter[tuple[str, int]], workflow_id: str) -> None:
    """Run race_wf in an instance until step 1, then exit with no grace: PENDING, step 0 done."""
    dbos = new_dbos(url, shutdown_grace_period=0)
    reached = asyncio.Event()
    race_wf = register_race(dbos, "A", asyncio.Event(), reached, runs)
    async with dbos:
        with SetWorkflowID(workflow_id):
            await dbos.start_workflow(race_wf)
        await asyncio.wait_for(reached.wait(), 30)
    row = await workflow_row(url, workflow_id)
    assert row is not None and row["status"] == "PENDING"
    assert [r.function_id for r in await step_rows(url, workflow_id)] == [0]


async def test_two_executors_racing_to_take_over_one_workflow(database_url: str) -> None:
    url, workflow_id = database_url, "raced"
    runs: Counter[tuple[str, int]] = Counter()
    await leave_pending(url, runs, workflow_id)

    # The workflow's executor is gone. Two live executors of the same version, with IDs of
    # their own, both watch for dead executors and race to take it over: exactly one does.
    b = new_dbos(url, executor_id="taker-b", failover_after=0.2)
    c = new_dbos(url, executor_id="taker-c", failover_after=0.2)
    register_race(b, "B", None, None, runs)
    register_race(c, "C", None, None, runs)
    async with b, c:
        result = await asyncio.wait_for((await b.retrieve_workflow(workflow_id)).get_result(),
                                        60)
        # Both keep scanning after the take-over; neither claims it again.
        def scans_of_both() -> int:
            return b._current_runtime.failover_scans + c._current_runtime.failover_scans

        scans = scans_of_both()

        async def scanned_more() -> bool:
            return scans_of_both() > scans + 10

        await wait_until(scanned_more, what="more failover scans")

    row = await workflow_row(url, workflow_id)
    assert row is not None and row["status"] == "SUCCESS"
    assert json.loads(row["stored_output"]) == result
    assert row["recovery_attempts"] == 2  # created, then claimed once
    winner = result[1][0]
    assert winner in "BC" and row["executor_id"] == f"taker-{winner.lower()}"
    assert result == ["A-0"] + [f"{winner}-{i}" for i in (1, 2, 3)]
    loser = "C" if winner == "B" else "B"
    assert [(r.function_id, r.function_name) for r in await step_rows(url, workflow_id)] == [
        (i, "race_step") for i in range(4)]
    assert all(runs[winner, i] == 1 for i in (1, 2, 3)) and runs[winner, 0] == 0
    assert not any(runs[loser, i] for i in range(4))


async def test_stale_execution_stops_at_its_next_checkpoint(database_url: str) -> None:
    url, workflow_id = database_url, "stale"
    runs: Counter[tuple[str, int]] = Counter()
    a = new_dbos(url, failover_after=None)
    gate_a, reached_a = asyncio.Event(), asyncio.Event()
    race_wf = register_race(a, "A", gate_a, reached_a, runs)
    async with a:
        with SetWorkflowID(workflow_id):
            handle_a = await a.start_workflow(race_wf)
        await asyncio.wait_for(reached_a.wait(), 30)
        # A's execution is alive, blocked in step 1, but A looks dead to other executors
        # (as across a network partition); B takes the workflow over.
        await take_executor_id_away(url, a)
        b = new_dbos(url, executor_id="taker", failover_after=0.2)
        register_race(b, "B", None, None, runs)
        async with b:
            result_b = await asyncio.wait_for(
                (await b.retrieve_workflow(workflow_id)).get_result(), 60
            )
        assert result_b == ["A-0", "B-1", "B-2", "B-3"]
        # Now A's step 1 finishes; its checkpoint is refused, so A stops there and its
        # handle reports the outcome B recorded.
        gate_a.set()
        result_a = await asyncio.wait_for(handle_a.get_result(), 60)
    assert result_a == result_b
    assert runs["A", 1] == 1 and runs["A", 2] == runs["A", 3] == 0
    rows = await step_rows(url, workflow_id)
    assert [r.output for r in rows] == ["A-0", "B-1", "B-2", "B-3"]
    row = await workflow_row(url, workflow_id)
    assert row is not None and row["status"] == "SUCCESS"
    assert json.loads(row["stored_output"]) == result_b
    assert row["executor_id"] == "taker"


# ---- Nondeterminism ----


async def test_replay_calling_a_different_step_is_nondeterminism(database_url: str) -> None:
    url, workflow_id = database_url, "nondeterministic"
    runs: Counter[str] = Counter()

    first = new_dbos(url, shutdown_grace_period=0)
    reached = asyncio.Event()

    @first.step(name="charge_card")
    async def charge_card() -> str:
        runs["charge_card"] += 1
        return "charged"

    @first.step(name="hold")
    async def hold() -> None:
        reached.set()
        await asyncio.Event().wait()

    @first.workflow(name="payment")
    async def payment_v1() -> str:
        await charge_card()
        await hold()
        return "done"

    async with first:
        with SetWorkflowID(workflow_id):
            await first.start_workflow(payment_v1)
        await asyncio.wait_for(reached.wait(), 30)
    assert [r.function_name for r in await step_rows(url, workflow_id)] == ["charge_card"]

    # The "new code" calls another step at position 0.
    second = new_dbos(url)

    @second.step(name="refund_card")
    async def refund_card() -> str:
        runs["refund_card"] += 1
        return "refunded"

    @second.workflow(name="payment")
    async def payment_v2() -> str:
        await refund_card()
        return "done"

    async with second:
        handle = await second.retrieve_workflow(workflow_id)
        with pytest.raises(NondeterminismError) as caught:
            await asyncio.wait_for(handle.get_result(), 60)
    message = str(caught.value)
    assert "charge_card" in message and "refund_card" in message
    assert caught.value.recorded == "charge_card" and caught.value.called == "refund_card"
    assert caught.value.step_id == 0
    assert runs == {"charge_card": 1}  # the differently named step never ran
    row = await workflow_row(url, workflow_id)
    assert row is not None and row["status"] == "ERROR"
    error = json.loads(row["stored_error"])
    assert error["name"] == "NondeterminismError"
    assert "charge_card" in error["message"] and "refund_card" in error["message"]

    # Read back from the database by another process, it is still a NondeterminismError.
    async with DBOSClient(system_database_url=url) as client:
        with pytest.raises(NondeterminismError) as recorded:
            await (await client.retrieve_workflow(workflow_id)).get_result()
    assert isinstance(recorded.value, RecordedError)
    assert (recorded.value.workflow_id, recorded.value.step_id) == (workflow_id, 0)
    assert (recorded.value.recorded, recorded.value.called) == ("charge_card", "refund_card")


# ---- Unknown workflow on recovery ----


async def test_unregistered_workflow_is_reported_and_left_pending(
    database_url: str, caplog: pytest.LogCaptureFixture,
) -> None:
    url = database_url
    first = new_dbos(url, shutdown_grace_period=0)
    reached = asyncio.Event()

    @first.workflow(name="legacy_job")
    async def legacy_job() -> None:
        reached.set()
        await asyncio.Event().wait()

    runs: Counter[tuple[str, int]] = Counter()
    race_wf = register_race(first, "A", asyncio.Event(), None, runs)

    async with first:
        with SetWorkflowID("orphan"):
            await first.start_workflow(legacy_job)
        with SetWorkflowID("recoverable"):
            await first.start_workflow(race_wf)
        await asyncio.wait_for(reached.wait(), 30)
        await wait_for_steps(url, "recoverable", 1)

    # The recovering instance knows race_wf but not legacy_job.
    second = new_dbos(url)
    register_race(second, "B", None, None, runs)
    with caplog.at_level(logging.ERROR, logger="dbos_async"):
        async with second:
            [error] = second.recovery_errors
            assert isinstance(error, WorkflowNotRegisteredError)
            assert error.workflow_id == "orphan" and error.name == "legacy_job"
            assert "orphan" in str(error) and "legacy_job" in str(error)
            # The other pending workflow was recovered regardless.
            recovered = await second.retrieve_workflow("recoverable")
            assert await asyncio.wait_for(recovered.get_result(), 60) == [
                "A-0", "B-1", "B-2", "B-3",
            ]
    assert any("orphan" in r.getMessage() and "legacy_job" in r.getMessage()
               for r in caplog.records if r.levelno >= logging.ERROR)
    row = await workflow_row(url, "orphan")
    assert row is not None and row["status"] == "PENDING"
    assert await step_rows(url, "orphan") == []


async def test_recovered_handles_are_returned(database_url: str) -> None:
    """``recover_pending_workflows`` on a running instance resumes workflows left PENDING
    by another (crashed) instance of the same executor, and returns their handles."""
    runs: Counter[tuple[str, int]] = Counter()
    await leave_pending(database_url, runs, "late-recovery")
    b = new_dbos(database_url)
    register_race(b, "B", None, None, runs)
    async with b:
        # Entering already recovered it; a second pass finds nothing new to claim.
        again = await b.recover_pending_workflows()
        assert again == []
        handle: WorkflowHandle[Any] = await b.retrieve_workflow("late-recovery")
        assert await handle.get_result() == ["A-0", "B-1", "B-2", "B-3"]


async def test_recovery_while_workflows_start_runs_nothing_twice(database_url: str) -> None:
    """recover_pending_workflows in a loop while workflows start: a workflow inserted PENDING
    but not yet launched is never taken for a crashed one."""
    dbos = new_dbos(database_url, pool_size=8)
    runs: Counter[int] = Counter()

    @dbos.step(name="count_run")
    async def count_run(i: int) -> None:
        runs[i] += 1

    @dbos.workflow(name="counted")
    async def counted(i: int) -> int:
        await count_run(i)
        return i

    async with dbos:
        async def recover_until(done: asyncio.Future[Any]) -> None:
            while not done.done():
                await dbos.recover_pending_workflows()
                await asyncio.sleep(0)

        starts = asyncio.ensure_future(asyncio.gather(
            *(dbos.start_workflow(counted, i) for i in range(300))))
        await recover_until(starts)
        assert await dbos.wait_all(starts.result()) == list(range(300))
    assert runs == Counter(range(300))
    attempts = await fetch(database_url, "SELECT DISTINCT recovery_attempts "
                                         "FROM dbos.workflow_status WHERE name = 'counted'")
    assert [r["recovery_attempts"] for r in attempts] == [1]


async def test_replay_starting_a_different_child_is_nondeterminism(database_url: str) -> None:
    url, workflow_id = database_url, "nondeterministic-child"
    first = new_dbos(url, shutdown_grace_period=0)
    reached = asyncio.Event()

    @first.workflow(name="ship")
    async def ship() -> str:
        return "shipped"

    @first.step(name="hold")
    async def hold() -> None:
        reached.set()
        await asyncio.Event().wait()

    @first.workflow(name="fulfil")
    async def fulfil_v1() -> str:
        await ship()
        await hold()
        return "done"

    async with first:
        with SetWorkflowID(workflow_id):
            await first.start_workflow(fulfil_v1)
        await asyncio.wait_for(reached.wait(), 30)
    [row] = await step_rows(url, workflow_id)
    assert (row.function_name, row.child_workflow_id) == ("ship", f"{workflow_id}-0")

    second = new_dbos(url)
    delivered: list[str] = []

    @second.workflow(name="deliver")
    async def deliver() -> str:
        delivered.append("deliver")
        return "delivered"

    @second.workflow(name="fulfil")
    async def fulfil_v2() -> str:
        await deliver()
        return "done"

    async with second:
        handle = await second.retrieve_workflow(workflow_id)
        with pytest.raises(NondeterminismError) as caught:
            await asyncio.wait_for(handle.get_result(), 60)
    assert "ship" in str(caught.value) and "deliver" in str(caught.value)
    assert delivered == []  # the different child was never started
    assert await fetch(url, "SELECT 1 FROM dbos.workflow_status WHERE name = 'deliver'") == []
