"""Database outages shorter and longer than ``db_retry_timeout``: workflows pause and
continue, in the same process, when the server comes back.

The server is a private cluster stopped and started on its port. Each outage catches
workflows at every kind of database write: a step's checkpoint (the step body returns while
the server is down), a workflow's outcome, a ``recv`` waiting for its message, a queue whose
claim loop must claim the rest, and a child start. None may fail for the outage, and no step
body may run twice, however long the outage lasts relative to ``db_retry_timeout``; a
caller outside workflows waiting past that deadline gets :class:`DatabaseUnavailableError`
of its own, and the workflow still finishes.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from typing import Any

import pytest

from dbos_async import DBOS, DatabaseUnavailableError, Queue, SetWorkflowID
from tests.helpers import fetch, new_dbos, wait_until
from tests.helpers.cluster import Cluster

pytestmark = pytest.mark.chaos

RETRY_TIMEOUT = 1.0
ENTRY_RETRY_TIMEOUT = 8.0
"""db_retry_timeout of an entry that must wait out an outage of half of it."""


class Outage:
    """The gate that step bodies and workflow bodies wait at: opened once the server is
    down, so what they do next (a checkpoint, an outcome) meets the outage."""

    def __init__(self) -> None:
        self.down = asyncio.Event()
        self.arrived = Counter[str]()
        self.runs = Counter[str]()


def register(dbos: DBOS, outage: Outage) -> tuple[Queue, dict[str, Any]]:
    queue = dbos.register_queue(Queue("outage_queue", concurrency=2))

    @dbos.step()
    async def record(workflow_id: str, n: int) -> int:
        outage.runs[f"{workflow_id}:{n}"] += 1
        return n

    @dbos.step()
    async def blocking(workflow_id: str) -> str:
        outage.runs[f"{workflow_id}:blocking"] += 1
        outage.arrived["blocking"] += 1
        await outage.down.wait()
        return "after"

    @dbos.workflow()
    async def stepper(workflow_id: str) -> list[object]:
        first = await record(workflow_id, 1)
        middle = await blocking(workflow_id)  # its checkpoint is written during the outage
        last = await record(workflow_id, 3)
        return [first, middle, last]

    @dbos.workflow()
    async def finisher(workflow_id: str) -> str:
        await record(workflow_id, 1)
        outage.arrived["finisher"] += 1
        await outage.down.wait()
        return "finished"  # its outcome is written during the outage

    @dbos.workflow()
    async def receiver() -> object:
        outage.arrived["receiver"] += 1
        return await dbos.recv("go", timeout=300)

    @dbos.workflow()
    async def child(workflow_id: str) -> int:
        return await record(workflow_id, 7)

    @dbos.workflow()
    async def parent(workflow_id: str) -> int:
        outage.arrived["parent"] += 1
        await outage.down.wait()
        return await child(workflow_id)  # the child's start is written during the outage

    return queue, {"stepper": stepper, "finisher": finisher, "receiver": receiver,
                   "parent": parent}


@pytest.mark.parametrize("multiple", [0.5, 1.5, 3.0])
async def test_an_outage_pauses_workflows_which_continue_when_the_database_returns(
        cluster: Cluster, multiple: float, scale: int, chaos_figures: Counter[str]) -> None:
    outage = Outage()
    dbos = new_dbos(cluster.url(f"outage_{int(multiple * 10)}"),
                    db_retry_timeout=RETRY_TIMEOUT, connect_timeout=1.0)
    queue, workflows = register(dbos, outage)
    each = 3 * scale
    async with dbos:
        handles = []
        for i in range(each):
            handles.append(await dbos.start_workflow(workflows["stepper"], f"s{i}"))
            handles.append(await dbos.start_workflow(workflows["finisher"], f"f{i}"))
            handles.append(await dbos.start_workflow(workflows["parent"], f"p{i}"))
        receivers = [await dbos.start_workflow(workflows["receiver"]) for _ in range(each)]
        # Two run at once; the others wait on the queue through the outage.
        queued = [await queue.enqueue(workflows["stepper"], f"q{i}") for i in range(each + 2)]

        await wait_until(lambda: _arrived(outage, each), patience=60,
                         what="every workflow to reach its place")
        cluster.stop()
        stopped = time.monotonic()
        outage.down.set()  # blocked bodies go on: their writes meet the outage
        await wait_until(lambda: _state(dbos, "unreachable"), patience=30,
                         what="health() to report the database unreachable")
        assert not dbos.health().healthy

        # A caller outside workflows gives up after db_retry_timeout, clearly; a start
        # says the database is unreachable (not that the executor ID is not held).
        if multiple > 1:
            with pytest.raises(DatabaseUnavailableError, match=f"127.0.0.1:{cluster.port}"):
                await dbos.get_workflow_status(handles[0].workflow_id)
            with pytest.raises(DatabaseUnavailableError) as refused, \
                    SetWorkflowID("started-during-the-outage"):
                await dbos.start_workflow(workflows["finisher"], "never")
            assert "system database" in str(refused.value)
            assert "unreachable" in str(refused.value) or "unavailable" in str(refused.value)
            assert "not held" not in str(refused.value)

        await asyncio.sleep(max(0.0, multiple * RETRY_TIMEOUT - (time.monotonic() - stopped)))
        cluster.start()
        chaos_figures["restarts"] += 1
        for handle in receivers:
            await dbos.send(handle.workflow_id, "message", topic="go")

        results = [await h.get_result() for h in (*handles, *receivers, *queued)]
        assert results.count("finished") == each
        assert results.count("message") == each
        assert results.count([1, "after", 3]) == 2 * each + 2
        assert results.count(7) == each
        await wait_until(lambda: _state(dbos, "reachable"), patience=30,
                         what="health() to report the database reachable again")
        await wait_until(lambda: _healthy(dbos), patience=30, what="the executor healthy again")

    # Not one step body ran twice, and nothing ended for the outage.
    assert {name: runs for name, runs in outage.runs.items() if runs != 1} == {}
    statuses = await fetch(cluster.url(f"outage_{int(multiple * 10)}"),
                           "SELECT status, count(*) FROM dbos.workflow_status GROUP BY status")
    assert {r["status"]: r["count"] for r in statuses} == {"SUCCESS": 6 * each + 2}
    chaos_figures["workflows_checked"] += 6 * each + 2
    chaos_figures["steps_rerun_after_checkpoint"] += sum(r - 1 for r in outage.runs.values())


async def _arrived(outage: Outage, each: int) -> bool:
    return (outage.arrived["finisher"] >= each and outage.arrived["parent"] >= each
            and outage.arrived["receiver"] >= each and outage.arrived["blocking"] >= each + 2)


async def _state(dbos: DBOS, state: str) -> bool:
    database = dbos.health().database
    return database is not None and database.state == state


async def _healthy(dbos: DBOS) -> bool:
    return dbos.health().healthy


@pytest.mark.parametrize("multiple", [0.5, 3.0])
async def test_an_outage_while_entering_is_waited_out_or_said_clearly(
        cluster: Cluster, multiple: float) -> None:
    """Entering waits out an outage shorter than db_retry_timeout; a longer one is a clear
    DatabaseUnavailableError (entering is a caller outside workflows), and nothing is left
    behind: entering again once the database is back recovers every workflow, and no
    checkpointed step runs again."""
    outage = Outage()
    url = cluster.url(f"entry_outage_{int(multiple * 10)}")
    # The outage lasts ``multiple`` retry timeouts and then as long as the server takes to
    # start, which a loaded machine stretches by a second or more: a retry timeout long
    # enough that half of it leaves that room, where the outage must be waited out (and
    # a startup_wait as long: the new entry's pool has not met this server yet).
    waits: dict[str, float] = ({"db_retry_timeout": ENTRY_RETRY_TIMEOUT,
                                "startup_wait": ENTRY_RETRY_TIMEOUT} if multiple < 1
                               else {"db_retry_timeout": RETRY_TIMEOUT})
    retry_timeout = waits["db_retry_timeout"]
    dbos = new_dbos(url, connect_timeout=1.0, shutdown_grace_period=0, **waits)
    _, workflows = register(dbos, outage)
    async with dbos:
        handles = [await dbos.start_workflow(workflows["stepper"], f"e{i}") for i in range(3)]
        await wait_until(lambda: _true(outage.arrived["blocking"] >= 3), patience=60,
                         what="the workflows to reach their blocking step")
    # Left PENDING, with their first step checkpointed; the next entry recovers them.
    outage.down.set()
    cluster.stop()
    entry = asyncio.create_task(dbos.__aenter__())
    await asyncio.sleep(multiple * retry_timeout)  # the outage's length, not a wait
    # In a thread: the entry keeps retrying (on its own clock) while the server starts.
    await asyncio.to_thread(cluster.start)
    if multiple < 1:
        await entry
    else:
        with pytest.raises(DatabaseUnavailableError, match=f"127.0.0.1:{cluster.port}"):
            await entry
        assert dbos.health().state == "closed"
        await dbos.__aenter__()
    try:
        for handle in handles:
            recovered = await dbos.retrieve_workflow(handle.workflow_id)
            assert await recovered.get_result() == [1, "after", 3]
    finally:
        await dbos.__aexit__(None, None, None)
    # The first step's checkpoint held: it ran once; the blocking step ran again only
    # because its first run was cut off before its checkpoint (at least once).
    assert {name: runs for name, runs in outage.runs.items()
            if runs != 1 and not name.endswith(":blocking")} == {}


async def _true(value: bool) -> bool:
    return value


async def test_an_exit_during_an_outage_gives_the_outcomes_being_written_the_grace_period(
        cluster: Cluster) -> None:
    """A workflow's run ends with its body, and its outcome is written after it. Exiting
    while the outcome meets an outage waits for it as long as the grace period lasts, then
    stops the write, rather than wait for the database forever: the workflow stays
    PENDING, and the next entry recovers it without running its step again."""
    outage = Outage()
    url = cluster.url("exit_outage")
    dbos = new_dbos(url, db_retry_timeout=RETRY_TIMEOUT, connect_timeout=1.0,
                    shutdown_grace_period=0.5)
    _, workflows = register(dbos, outage)
    async with asyncio.timeout(60):
        async with dbos:
            handle = await dbos.start_workflow(workflows["finisher"], "x")
            await wait_until(lambda: _true(outage.arrived["finisher"] == 1), patience=60,
                             what="the workflow to reach its end")
            cluster.stop()
            outage.down.set()  # the body returns: its outcome meets the outage
            await wait_until(lambda: _state(dbos, "unreachable"), patience=30,
                             what="the outcome to meet the outage")
    await asyncio.to_thread(cluster.start)
    statuses = await fetch(url, "SELECT status FROM dbos.workflow_status "
                                "WHERE workflow_uuid = $1", handle.workflow_id)
    assert [r["status"] for r in statuses] == ["PENDING"]
    async with dbos:
        recovered = await dbos.retrieve_workflow(handle.workflow_id)
        assert await recovered.get_result() == "finished"
    assert outage.runs == Counter({"x:1": 1})
