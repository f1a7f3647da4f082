"""Group commit: many workflows' checkpoints and outcomes in one statement, each row judged
on its own, and a lone workflow still one statement per write.

The writes made in one turn of the event loop go together; beyond that, a batch is made
deterministic by holding the first write in flight: the test locks that workflow's status
row, so its checkpoint waits in PostgreSQL while the others' steps finish and queue behind
it; when the lock goes, everything queued goes as one statement.
"""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg
import pytest
from helpers import execute, fetch, new_dbos, pool_statements, step_rows, wait_until, workflow_row

from dbos_async import (
    DBOSError,
    NondeterminismError,
    NonExistentWorkflowError,
    SetWorkflowID,
    WorkflowCancelledError,
)
from dbos_async._executor.messaging import NULL_TOPIC
from dbos_async._sysdb.notifications import NOTIFICATIONS_CHANNEL

BATCH_MARK = "WITH ORDINALITY AS v(workflow_uuid, function_id"
"""Text of the batched checkpoint statement (one row per workflow in its arrays)."""


def batches(logged: list[tuple[str, tuple[Any, ...]]]) -> list[list[tuple[str, int]]]:
    """The (workflow ID, step) rows of each batched checkpoint statement sent (the steps go
    as text, which the server casts)."""
    return [[(workflow_id, int(step)) for workflow_id, step in zip(args[0], args[1], strict=True)]
            for sql, args in logged if BATCH_MARK in sql]


async def lock_waiters(url: str) -> int:
    rows = await fetch(url, "SELECT count(*) AS n FROM pg_stat_activity "
                            "WHERE wait_event_type = 'Lock' AND datname = current_database()")
    return int(rows[0]["n"])


async def test_each_row_of_a_batch_gets_its_own_verdict(database_url: str) -> None:
    dbos = new_dbos(database_url)
    release_lead, release_rest = asyncio.Event(), asyncio.Event()
    arrived: set[str] = set()
    everyone_in = asyncio.Event()
    healthy = [f"healthy-{i}" for i in range(6)]
    others = [*healthy, "cancelled", "fenced", "nondeterministic"]

    @dbos.step(name="held", cancellable=False)
    async def held(workflow_id: str) -> str:
        arrived.add(workflow_id)
        if arrived >= {"lead", *others}:
            everyone_in.set()
        await (release_lead if workflow_id == "lead" else release_rest).wait()
        return workflow_id

    @dbos.step(name="after")
    async def after(value: str) -> str:
        return value + "!"

    @dbos.workflow()
    async def work(workflow_id: str) -> str:
        return await after(await held(workflow_id))

    async with dbos:
        handles = {}
        for workflow_id in ["lead", *others]:
            with SetWorkflowID(workflow_id):
                handles[workflow_id] = await dbos.start_workflow(work, workflow_id)
        await asyncio.wait_for(everyone_in.wait(), 30)
        # Three rows an outside writer changes while their steps run.
        await execute(database_url, "UPDATE dbos.workflow_status SET status = 'CANCELLED' "
                                    "WHERE workflow_uuid = 'cancelled'")
        await execute(database_url, "UPDATE dbos.workflow_status SET owner_xid = 'elsewhere' "
                                    "WHERE workflow_uuid = 'fenced'")
        await execute(database_url, "INSERT INTO dbos.operation_outputs "
                                    "(workflow_uuid, function_id, function_name, output) "
                                    "VALUES ('nondeterministic', 0, 'another_step', 'null')")
        blocker = await asyncpg.connect(database_url)
        try:
            async with pool_statements(dbos) as logged:
                tx = blocker.transaction()
                await tx.start()
                await blocker.execute("SELECT 1 FROM dbos.workflow_status "
                                      "WHERE workflow_uuid = 'lead' FOR UPDATE")
                release_lead.set()  # its checkpoint goes alone and waits for the lock
                await wait_until(lambda: _at_least(lock_waiters(database_url), 1),
                                 what="the lead's checkpoint waiting for its row")
                release_rest.set()  # the others finish and queue behind it
                await tx.rollback()
                results = {w: await asyncio.wait_for(handles[w].get_result(), 30)
                           for w in ["lead", *healthy]}
                with pytest.raises(WorkflowCancelledError):
                    await asyncio.wait_for(handles["cancelled"].get_result(), 30)
                with pytest.raises(NondeterminismError):
                    await asyncio.wait_for(handles["nondeterministic"].get_result(), 30)
        finally:
            await blocker.close()

    assert results == {w: w + "!" for w in ["lead", *healthy]}
    # The nine queued checkpoints went as one statement, the lead's alone before it (its
    # next step, quick to follow, joined them).
    assert {(w, 0) for w in others} <= set(batches(logged)[0])
    for workflow_id in healthy:
        assert [r.function_name for r in await step_rows(database_url, workflow_id)] \
            == ["held", "after"]
    # The refused rows wrote nothing; the fenced-out workflow belongs to its new owner.
    assert await step_rows(database_url, "cancelled") == []
    assert await step_rows(database_url, "fenced") == []
    fenced = await workflow_row(database_url, "fenced")
    assert fenced is not None and (fenced["status"], fenced["owner_xid"]) \
        == ("PENDING", "elsewhere")
    recorded = await step_rows(database_url, "nondeterministic")
    assert [r.function_name for r in recorded] == ["another_step"]
    row = await workflow_row(database_url, "nondeterministic")
    assert row is not None and row["status"] == "ERROR"


async def test_a_run_whose_fence_moved_adopts_the_outcome_its_new_owner_records(
        database_url: str) -> None:
    """A workflow's outcome is handed over as its body ends. When the fence moved meanwhile
    (another execution took the workflow over), the write is refused, and the run waits for
    what the new owner records and reports that, not its own value."""
    dbos = new_dbos(database_url)
    waiting, release = asyncio.Event(), asyncio.Event()

    @dbos.workflow()
    async def finishing() -> str:
        waiting.set()
        await release.wait()
        return "mine"

    async with dbos:
        with SetWorkflowID("taken-over"):
            handle = await dbos.start_workflow(finishing)
        await asyncio.wait_for(waiting.wait(), 30)
        await execute(database_url, "UPDATE dbos.workflow_status SET owner_xid = 'elsewhere' "
                                    "WHERE workflow_uuid = 'taken-over'")
        async with pool_statements(dbos) as logged:
            release.set()
            await wait_until(lambda: _true(any("workflow_output" in sql for sql, _ in logged)),
                             what="the outcome's write to be refused")
        result = asyncio.ensure_future(handle.get_result())
        await asyncio.sleep(0)
        assert not result.done()  # it waits for the new owner
        await execute(database_url, "INSERT INTO dbos.workflow_output (workflow_uuid, output) "
                                    "VALUES ('taken-over', '\"theirs\"')")
        await execute(database_url, "UPDATE dbos.workflow_status SET status = 'SUCCESS', "
                                    "owner_xid = NULL WHERE workflow_uuid = 'taken-over'")
        await execute(database_url, "SELECT pg_notify('dbos_workflow_completion_channel', "
                                    "'taken-over')")
        assert await asyncio.wait_for(result, 30) == "theirs"
    row = await workflow_row(database_url, "taken-over")
    assert row is not None and row["status"] == "SUCCESS"


async def _true(value: bool) -> bool:
    return value


async def _at_least(count: Any, n: int) -> bool:
    return int(await count) >= n


async def test_concurrent_workflows_share_statements(database_url: str) -> None:
    """Workflows stepping together send far fewer statements than rows; each result and
    each checkpoint is still there."""
    dbos = new_dbos(database_url)
    go, all_running = asyncio.Event(), asyncio.Event()
    count = 40
    running: set[int] = set()

    @dbos.step()
    async def gated(i: int) -> int:
        running.add(i)
        if len(running) == count:
            all_running.set()
        await go.wait()
        return i

    @dbos.step()
    async def double(i: int) -> int:
        return 2 * i

    @dbos.workflow()
    async def work(i: int) -> int:
        return await double(await gated(i))

    async with dbos:
        handles = [await dbos.start_workflow(work, i) for i in range(count)]
        await asyncio.wait_for(all_running.wait(), 30)
        async with pool_statements(dbos) as logged:
            go.set()
            results = [await asyncio.wait_for(h.get_result(), 30) for h in handles]
    assert results == [2 * i for i in range(count)]
    checkpoints = [sql for sql, _ in logged if "operation_outputs" in sql]
    # 80 checkpoints; released together, each step's writes go in a few statements.
    assert len(checkpoints) < count
    assert sum(len(b) for b in batches(logged)) > count
    rows = await fetch(database_url, "SELECT count(*) AS n FROM dbos.operation_outputs")
    assert rows[0]["n"] == 2 * count


async def test_the_writes_of_one_loop_turn_go_as_one_statement(database_url: str) -> None:
    """Steps that end in the same turn of the event loop (released by one event) send one
    checkpoint statement between them: the first does not go alone ahead of the rest."""
    dbos = new_dbos(database_url)
    go, all_waiting = asyncio.Event(), asyncio.Event()
    count = 10
    waiting: set[int] = set()

    @dbos.step()
    async def gated(i: int) -> int:
        waiting.add(i)
        if len(waiting) == count:
            all_waiting.set()
        await go.wait()
        return i

    @dbos.workflow()
    async def work(i: int) -> int:
        return await gated(i)

    async with dbos:
        handles = [await dbos.start_workflow(work, i) for i in range(count)]
        await asyncio.wait_for(all_waiting.wait(), 30)
        async with pool_statements(dbos) as logged:
            go.set()
            results = [await asyncio.wait_for(h.get_result(), 30) for h in handles]
    assert results == list(range(count))
    checkpoints = [sql for sql, _ in logged if "operation_outputs" in sql]
    assert len(checkpoints) == 1, checkpoints
    assert sorted(batches(logged)[0]) == sorted((h.workflow_id, 0) for h in handles)


async def test_a_lone_workflow_sends_one_statement_per_write(database_url: str) -> None:
    dbos = new_dbos(database_url)

    @dbos.step()
    async def one(i: int) -> int:
        return i + 1

    @dbos.workflow()
    async def three_steps(i: int) -> int:
        return await one(await one(await one(i)))

    async with dbos:
        await (await dbos.start_workflow(three_steps, 0)).get_result()  # warm
        async with pool_statements(dbos) as logged:
            handle = await dbos.start_workflow(three_steps, 10)
            assert await handle.get_result() == 13
    writes = [sql for sql, _ in logged if "INSERT" in sql or "UPDATE" in sql]
    # The start, three checkpoints and the outcome: one statement each, none batched.
    assert len(writes) == 5, writes
    assert batches(logged) == []


START_MARK = "SELECT status.* FROM v JOIN status"
"""Text of the batched start statement."""


async def _starts_behind_a_held_one(dbos: Any, database_url: str, work: Any,
                                    workflow_ids: list[str]) -> list[Any]:
    """Start ``workflow_ids`` together while the start of the existing workflow "lead"
    waits for its row lock, so they queue behind it and go as one batch; the outcome of
    each start (its handle or its error), in order."""

    async def start(workflow_id: str) -> Any:
        with SetWorkflowID(workflow_id):
            return await dbos.start_workflow(work, workflow_id)

    blocker = await asyncpg.connect(database_url)
    try:
        tx = blocker.transaction()
        await tx.start()
        await blocker.execute("SELECT 1 FROM dbos.workflow_status "
                              "WHERE workflow_uuid = 'lead' FOR UPDATE")
        lead = asyncio.create_task(start("lead"))
        await wait_until(lambda: _at_least(lock_waiters(database_url), 1),
                         what="the lead's start waiting for its row")
        rest = [asyncio.create_task(start(w)) for w in workflow_ids]
        await tx.rollback()  # the others have queued behind the lead meanwhile
        await lead
        return list(await asyncio.gather(*rest, return_exceptions=True))
    finally:
        await blocker.close()


async def test_concurrent_starts_go_as_one_statement(database_url: str) -> None:
    """Starts queued behind one in flight go together; each gets its own verdict: a new
    workflow runs once, a second start of the same ID gets the same workflow, an ID taken
    by another function is refused for that caller only."""
    dbos = new_dbos(database_url)
    runs: list[str] = []

    @dbos.workflow()
    async def work(workflow_id: str) -> str:
        runs.append(workflow_id)
        return workflow_id + "!"

    @dbos.workflow()
    async def other() -> None:
        return None

    fresh = [f"fresh-{i}" for i in range(8)]
    async with dbos:
        with SetWorkflowID("lead"):
            await (await dbos.start_workflow(work, "lead")).get_result()
        with SetWorkflowID("taken"):
            await (await dbos.start_workflow(other)).get_result()
        async with pool_statements(dbos) as logged:
            outcomes = await _starts_behind_a_held_one(
                dbos, database_url, work, [*fresh, "fresh-0", "taken"])
            results = [await asyncio.wait_for(h.get_result(), 30) for h in outcomes[:9]]
    assert results == [w + "!" for w in [*fresh, "fresh-0"]]
    assert isinstance(outcomes[9], DBOSError) and "already used by workflow" in str(outcomes[9])
    assert sorted(runs) == sorted(["lead", *fresh])  # "fresh-0" ran once
    started = [args for sql, args in logged if START_MARK in sql]
    # The queued starts went as one statement (the repeated ID alone after it).
    assert len(started) == 1 and set(started[0][0]) == {*fresh, "taken"}
    rows = await fetch(database_url, "SELECT count(*) AS n FROM dbos.workflow_input")
    assert rows[0]["n"] == 2 + len(fresh)


async def test_a_start_the_database_refuses_fails_alone(database_url: str) -> None:
    """A batch PostgreSQL refuses because of one row goes again row by row: that row's
    caller gets the error, the others start, and the refused row leaves nothing behind."""
    dbos = new_dbos(database_url)

    @dbos.workflow()
    async def work(workflow_id: str) -> str:
        return workflow_id + "!"

    async with dbos:
        with SetWorkflowID("lead"):
            await (await dbos.start_workflow(work, "lead")).get_result()
        await execute(database_url, """
            CREATE FUNCTION refuse_poison() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
              IF NEW.workflow_uuid = 'poison' THEN RAISE EXCEPTION 'poison refused'; END IF;
              RETURN NEW;
            END $$;
            CREATE TRIGGER refuse_poison BEFORE INSERT ON dbos.workflow_status
              FOR EACH ROW EXECUTE FUNCTION refuse_poison();""")
        healthy = [f"healthy-{i}" for i in range(5)]
        outcomes = await _starts_behind_a_held_one(dbos, database_url, work,
                                                   [*healthy, "poison"])
        results = [await asyncio.wait_for(h.get_result(), 30) for h in outcomes[:5]]
    assert results == [w + "!" for w in healthy]
    assert isinstance(outcomes[5], DBOSError) and "poison refused" in str(outcomes[5])
    assert "'poison'" in str(outcomes[5])
    assert await workflow_row(database_url, "poison") is None


SEND_MARK = "AS m(message_uuid, destination_uuid, topic, message, serialization)"
"""Text of the batched message insert (a send from outside a workflow)."""


def sent_batches(logged: list[tuple[str, tuple[Any, ...]]]) -> list[list[str]]:
    """The destinations of each message insert sent, in order (the array of destinations
    is the fourth from last argument)."""
    return [list(args[-4]) for sql, args in logged if SEND_MARK in sql]


async def test_sends_made_together_go_as_one_statement_and_a_missing_destination_fails_alone(
        database_url: str) -> None:
    """Sends from outside a workflow made in one turn of the event loop are one insert; a
    batch the foreign key refuses (a destination that does not exist) goes again row by
    row, so only that caller gets NonExistentWorkflowError and every other message lands."""
    dbos = new_dbos(database_url)

    @dbos.workflow()
    async def receiver() -> Any:
        return await dbos.recv(timeout=60)

    names = [f"receiver-{i}" for i in range(6)]
    async with dbos:
        handles = {}
        for name in names:
            with SetWorkflowID(name):
                handles[name] = await dbos.start_workflow(receiver)
        async with pool_statements(dbos) as logged:
            together = await asyncio.gather(*(dbos.send(n, n.upper()) for n in names[:3]))
            mixed = await asyncio.gather(*(dbos.send(n, n.upper()) for n in names[3:]),
                                         dbos.send("nobody", 1), return_exceptions=True)
        results = {n: await asyncio.wait_for(h.get_result(), 30) for n, h in handles.items()}
    assert together == [None, None, None]
    assert mixed[:3] == [None, None, None]
    assert isinstance(mixed[3], NonExistentWorkflowError) and "nobody" in str(mixed[3])
    assert results == {n: n.upper() for n in names}
    assert sent_batches(logged) == [names[:3], [*names[3:], "nobody"],
                                    *([n] for n in [*names[3:], "nobody"])]
    stored = await fetch(database_url, "SELECT destination_uuid FROM dbos.notifications")
    assert sorted(r["destination_uuid"] for r in stored) == names  # each once, none to nobody


CONSUME_MARK = "AS waiting(workflow_uuid, function_id, owner_xid, topic, ord)"
"""Text of the batched consuming write of recv (one row per waiting workflow)."""


async def test_receivers_woken_together_consume_in_one_statement(database_url: str) -> None:
    """Receivers woken while another's consuming write is held in flight (its status row
    locked) consume their messages together, in one statement, each its own; one no longer
    owned by this execution consumes nothing, alone, and the others are not held up."""
    dbos = new_dbos(database_url)

    @dbos.workflow()
    async def receiver() -> Any:
        return await dbos.recv()

    names = [f"receiver-{i}" for i in range(8)]
    async with dbos:
        handles = {}
        for name in ["lead", *names, "fenced"]:
            with SetWorkflowID(name):
                handles[name] = await dbos.start_workflow(receiver)
        sysdb = dbos._system_database
        dispatcher = sysdb.notifications
        assert dispatcher is not None
        consumes = sysdb._consumes

        async def all_waiting() -> bool:
            return not consumes._lanes and all(
                dispatcher.waiters_on(NOTIFICATIONS_CHANNEL, sysdb.waiter_key(n, NULL_TOPIC))
                for n in handles)

        await wait_until(all_waiting, what="every receiver waiting")
        await execute(database_url, "UPDATE dbos.workflow_status SET owner_xid = 'elsewhere' "
                                    "WHERE workflow_uuid = 'fenced'")
        conn = await asyncpg.connect(database_url)
        async with pool_statements(dbos) as logged:
            try:  # the lock goes before the pool is read back, whatever happens
                lock = conn.transaction()
                await lock.start()
                await conn.execute("SELECT 1 FROM dbos.workflow_status "
                                   "WHERE workflow_uuid = 'lead' FOR NO KEY UPDATE")
                await dbos.send("lead", "LEAD")

                async def lead_held() -> bool:
                    return await lock_waiters(database_url) >= 1

                await wait_until(lead_held, what="the lead's consuming write to wait")
                await asyncio.gather(*(dbos.send(n, n.upper()) for n in [*names, "fenced"]))

                async def queued() -> bool:
                    return sum(len(lane.waiting) for lane in consumes._lanes.values()) >= 9

                await wait_until(queued, what="the other receivers' writes to queue")
            finally:
                await conn.close()
            results = {n: await asyncio.wait_for(handles[n].get_result(), 30)
                       for n in ["lead", *names]}
    assert results == {"lead": "LEAD", **{n: n.upper() for n in names}}
    assert [sorted(args[0]) for sql, args in logged if CONSUME_MARK in sql] == [
        sorted([*names, "fenced"])]
    rows = await fetch(database_url, "SELECT destination_uuid, consumed FROM dbos.notifications")
    assert {r["destination_uuid"]: r["consumed"] for r in rows} == {
        "lead": True, **dict.fromkeys(names, True), "fenced": False}
