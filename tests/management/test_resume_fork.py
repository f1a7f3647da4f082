"""Resume, fork and rewind: what runs again and what replays from the checkpoints, the
history a fork copies, a rewind in place, and bad input."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest
from helpers import execute, fetch, new_dbos, step_rows, workflow_row

from dbos_async import (
    DBOS,
    DBOSError,
    NonExistentWorkflowError,
    SetWorkflowID,
    WorkflowCancelledError,
)

PATIENCE = 15.0


class Counted:
    """A workflow of three counted steps (positions 0, 1, 2), each publishing an event;
    the middle one can be held on a gate."""

    def __init__(self, dbos: DBOS) -> None:
        self.runs: Counter[str] = Counter()
        self.gate = asyncio.Event()
        self.gate.set()
        self.at_gate = asyncio.Event()

        @dbos.step(name="one")
        async def one(x: int) -> int:
            self.runs["one"] += 1
            return x + 1

        @dbos.step(name="two")
        async def two(x: int) -> int:
            self.runs["two"] += 1
            self.at_gate.set()
            await self.gate.wait()
            return x * 10

        @dbos.step(name="three")
        async def three(x: int) -> int:
            self.runs["three"] += 1
            return x + 3

        @dbos.workflow(name="counted")
        async def counted(x: int) -> int:
            return await three(await two(await one(x)))

        self.workflow = counted


async def test_resume_after_cancel_does_not_rerun_earlier_steps(database_url: str) -> None:
    dbos = new_dbos(database_url)
    flow = Counted(dbos)
    flow.gate.clear()
    async with dbos:
        with SetWorkflowID("r1"):
            handle = await dbos.start_workflow(flow.workflow, 1)
        await asyncio.wait_for(flow.at_gate.wait(), PATIENCE)
        await dbos.cancel_workflow("r1")
        with pytest.raises(WorkflowCancelledError):
            await asyncio.wait_for(handle.get_result(), PATIENCE)
        assert (await workflow_row(database_url, "r1"))["status"] == "CANCELLED"

        flow.gate.set()
        resumed = await dbos.resume_workflow("r1")
        assert resumed.workflow_id == "r1"
        assert await asyncio.wait_for(resumed.get_result(), PATIENCE) == 23
        # "one" ran once; "two" was interrupted, so it ran again; "three" once.
        assert flow.runs == Counter(one=1, two=2, three=1)
        row = await workflow_row(database_url, "r1")
        assert row["status"] == "SUCCESS" and row["queue_name"] == "_dbos_internal_queue"
        assert [s.function_name for s in await step_rows(database_url, "r1")] == [
            "one", "two", "three"]


async def test_resume_dead_lettered_and_many(database_url: str) -> None:
    dbos = new_dbos(database_url)
    flow = Counted(dbos)
    flow.gate.clear()
    async with dbos:
        handles = []
        for wid in ("d1", "d2"):
            with SetWorkflowID(wid):
                handles.append(await dbos.start_workflow(flow.workflow, 2))
        await asyncio.wait_for(flow.at_gate.wait(), PATIENCE)
        await dbos.cancel_workflows(["d1", "d2"])
        for h in handles:
            with pytest.raises(WorkflowCancelledError):
                await asyncio.wait_for(h.get_result(), PATIENCE)
        # As recovery leaves a workflow that ran out of attempts.
        await execute(database_url, """UPDATE dbos.workflow_status
            SET status = 'MAX_RECOVERY_ATTEMPTS_EXCEEDED', recovery_attempts = 101
            WHERE workflow_uuid = 'd1'""")
        flow.gate.set()
        resumed = await dbos.resume_workflows(["d1", "d2"], queue="_dbos_internal_queue")
        assert [await asyncio.wait_for(h.get_result(), PATIENCE) for h in resumed] == [33, 33]
        assert (await workflow_row(database_url, "d1"))["recovery_attempts"] == 1


async def test_resume_completed_is_a_noop(database_url: str) -> None:
    dbos = new_dbos(database_url)
    flow = Counted(dbos)
    async with dbos:
        with SetWorkflowID("done"):
            assert await flow.workflow(1) == 23
        before = await workflow_row(database_url, "done")
        handle = await dbos.resume_workflow("done")
        assert await handle.get_result() == 23
        after = await workflow_row(database_url, "done")
        assert after["status"] == "SUCCESS" and after["updated_at"] == before["updated_at"]
        assert after["queue_name"] is None
        assert flow.runs == Counter(one=1, two=1, three=1)

        @dbos.workflow(name="fails")
        async def fails() -> None:
            raise ValueError("no")

        with SetWorkflowID("failed"), pytest.raises(ValueError):
            await fails()
        handle = await dbos.resume_workflow("failed")
        with pytest.raises(ValueError, match="no"):
            await handle.get_result()
        assert (await workflow_row(database_url, "failed"))["status"] == "ERROR"


async def test_unknown_ids(database_url: str) -> None:
    dbos = new_dbos(database_url)
    flow = Counted(dbos)
    async with dbos:
        with SetWorkflowID("known"):
            await flow.workflow(1)
        with pytest.raises(NonExistentWorkflowError, match="nope"):
            await dbos.resume_workflows(["known", "nope"])
        with pytest.raises(NonExistentWorkflowError, match="nope"):
            await dbos.fork_workflow("nope", 0)
        with pytest.raises(NonExistentWorkflowError, match="nope"):
            await dbos.rewind_workflow("nope", 0)


@pytest.mark.parametrize("start_step", [0, 1, 2, 3])
async def test_fork_reruns_only_steps_from_start(database_url: str, start_step: int) -> None:
    dbos = new_dbos(database_url)
    flow = Counted(dbos)
    async with dbos:
        with SetWorkflowID("orig"):
            assert await flow.workflow(1) == 23
        flow.runs.clear()
        with SetWorkflowID("forked"):
            handle = await dbos.fork_workflow("orig", start_step)
        assert handle.workflow_id == "forked"
        assert await asyncio.wait_for(handle.get_result(), PATIENCE) == 23
        names = ["one", "two", "three"]
        assert flow.runs == Counter({n: 1 for n in names[start_step:]})
        fork = await dbos.get_workflow_status("forked")
        assert fork is not None
        assert fork.forked_from == "orig" and fork.name == "counted"
        assert fork.queue_name == "_dbos_internal_queue" and fork.status == "SUCCESS"
        assert (await workflow_row(database_url, "orig"))["was_forked_from"] is True
        assert [s.function_name for s in await step_rows(database_url, "forked")] == names
        [listed] = await dbos.list_workflows(forked_from="orig")
        assert listed.workflow_id == "forked" and listed.input is not None
        assert listed.input.args == (1,)


async def test_fork_bad_steps(database_url: str) -> None:
    dbos = new_dbos(database_url)
    flow = Counted(dbos)
    async with dbos:
        with SetWorkflowID("orig"):
            await flow.workflow(1)
        for bad in (4, 100, -1):
            with pytest.raises(DBOSError, match="out of range"):
                await dbos.fork_workflow("orig", bad)
        with SetWorkflowID("orig"), pytest.raises(DBOSError, match="exists"):
            await dbos.fork_workflow("orig", 1)
        # Nothing was left behind by the refused forks.
        rows = await fetch(database_url, "SELECT workflow_uuid FROM dbos.workflow_status")
        assert [r["workflow_uuid"] for r in rows] == ["orig"]


async def test_fork_copies_events_streams_and_replaces_children(database_url: str) -> None:
    dbos = new_dbos(database_url)
    runs: Counter[str] = Counter()

    @dbos.workflow(name="kid")
    async def kid(tag: str) -> str:
        runs[tag] += 1
        return f"kid-{tag}"

    @dbos.step(name="mark")
    async def mark() -> None:
        runs["mark"] += 1

    @dbos.workflow(name="parent")
    async def parent() -> str:
        first = await kid("a")                      # 0: child "p-0"
        await dbos.set_event("stage", "one")        # 1
        await dbos.write_stream("s", 1)             # 2
        await mark()                                # 3
        await dbos.set_event("stage", "two")        # 4
        await dbos.write_stream("s", 2)             # 5
        return first

    async with dbos:
        with SetWorkflowID("p"):
            assert await parent() == "kid-a"
        with SetWorkflowID("other-kid"):
            assert await kid("b") == "kid-b"
        runs.clear()
        # Forked onto a queue nobody serves, to see what was copied before it runs.
        with SetWorkflowID("pf"):
            handle = await dbos.fork_workflow("p", 3, queue="nobody-serves-this",
                                              replacement_children={"p-0": "other-kid"})
        steps = await step_rows(database_url, "pf")
        assert [s.function_id for s in steps] == [0, 1, 2]
        assert steps[0].child_workflow_id == "other-kid"
        assert await dbos.get_event("pf", "stage", timeout=0) == "one"
        history = await fetch(database_url, """SELECT function_id, key FROM
            dbos.workflow_events_history WHERE workflow_uuid = 'pf' ORDER BY function_id""")
        assert [(r["function_id"], r["key"]) for r in history] == [(1, "stage")]
        streams = await fetch(database_url, """SELECT "offset", value FROM dbos.streams
            WHERE workflow_uuid = 'pf' ORDER BY "offset" """)
        assert [r["value"] for r in streams] == ["1"]
        # Now let it run: resume moves it to the internal queue.
        await dbos.resume_workflow("pf")
        assert await asyncio.wait_for(handle.get_result(), PATIENCE) == "kid-b"
        assert runs == Counter(mark=1)
        assert [v async for v in dbos.read_stream("pf", "s")] == [1, 2]
        assert await dbos.get_event("pf", "stage", timeout=0) == "two"


async def test_rewind_in_place(database_url: str) -> None:
    dbos = new_dbos(database_url)
    runs: Counter[str] = Counter()

    @dbos.step(name="count")
    async def count(tag: str) -> str:
        runs[tag] += 1
        return tag

    @dbos.workflow(name="rewound")
    async def rewound() -> str:
        await count("a")                          # 0
        await dbos.set_event("k", "before")       # 1
        await dbos.write_stream("s", "x")         # 2
        await count("b")                          # 3
        await dbos.set_event("k", "after")        # 4
        await dbos.close_stream("s")              # 5
        msg = await dbos.recv("t", timeout=5)     # 6, 7
        return f"{msg}"

    async with dbos:
        with SetWorkflowID("rw"):
            handle = await dbos.start_workflow(rewound)
        await dbos.send("rw", "first", topic="t")
        assert await asyncio.wait_for(handle.get_result(), PATIENCE) == "first"
        assert runs == Counter(a=1, b=1)
        with pytest.raises(DBOSError, match="out of range"):
            await dbos.rewind_workflow("rw", 9)

        runs.clear()
        handle = await dbos.rewind_workflow("rw", 3)
        # The consumed message went with the discarded run; send another.
        await dbos.send("rw", "second", topic="t")
        assert await asyncio.wait_for(handle.get_result(), PATIENCE) == "second"
        assert runs == Counter(b=1)
        assert await dbos.get_event("rw", "k", timeout=0) == "after"
        assert [v async for v in dbos.read_stream("rw", "s")] == ["x"]
        messages = await fetch(database_url, """SELECT message FROM dbos.notifications
            WHERE destination_uuid = 'rw'""")
        assert [m["message"] for m in messages] == ['"second"']
        row = await workflow_row(database_url, "rw")
        assert row["status"] == "SUCCESS" and row["recovery_attempts"] == 1


async def test_rewind_rolls_back_events_and_refuses_running(database_url: str) -> None:
    dbos = new_dbos(database_url)
    @dbos.workflow(name="eventful")
    async def eventful() -> None:
        await dbos.set_event("k", 1)       # 0
        await dbos.set_event("k", 2)       # 1
        await dbos.set_event("only-late", 3)  # 2
        await dbos.sleep(0)                # 3

    @dbos.workflow(name="waits")
    async def waits() -> None:
        await dbos.recv("never", timeout=60)

    async with dbos:
        with SetWorkflowID("ev"):
            await eventful()
        # Rewind onto a queue nobody serves, to see the rolled-back state before a replay.
        await dbos.rewind_workflow("ev", 1, queue="nobody-serves-this")
        assert await dbos.get_all_events("ev") == {"k": 1}
        row = await workflow_row(database_url, "ev")
        assert row["status"] == "ENQUEUED" and row["stored_output"] is None
        with SetWorkflowID("busy"):
            await dbos.start_workflow(waits)
        with pytest.raises(DBOSError, match="cancel it first"):
            await dbos.rewind_workflow("busy", 0)
        await dbos.cancel_workflow("busy")
