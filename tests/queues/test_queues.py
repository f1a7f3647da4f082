"""Queues in one process: enqueue options, priorities, deduplication, delays, debouncing,
enqueue from a workflow, dead-lettering, and bad input. Limits across processes are in
``test_queues_processes.py``."""

from __future__ import annotations

import asyncio
import math
from collections import Counter
from typing import Any

import asyncpg
import pytest
from helpers import APP_VERSION, EXECUTOR_ID, execute, fetch, fetchval, new_dbos, wait_until

from dbos_async import (
    DBOS,
    ConfigurationError,
    DBOSError,
    DeadLetteredError,
    Queue,
    QueueDeduplicatedError,
    QueueNotFoundError,
    RateLimit,
    SetEnqueueOptions,
    SetWorkflowID,
    WorkflowNotRegisteredError,
)
from dbos_async._executor.claim_gate import ClaimGate
from dbos_async.testing import TestClock


def with_workflows(dbos: DBOS) -> tuple[dict[str, Any], list[str]]:
    """Register the test workflows; returns them and the log their bodies append to."""
    log: list[str] = []
    release = asyncio.Event()
    held: list[str] = []

    @dbos.step(name="note")
    async def note(text: str) -> str:
        log.append(text)
        return text

    @dbos.workflow(name="echo")
    async def echo(text: str) -> str:
        return await note(text)

    @dbos.step(name="hold")
    async def hold() -> None:
        held.append("holding")
        await release.wait()

    @dbos.workflow(name="blocker")
    async def blocker(text: str) -> str:
        await note(text)
        await hold()
        return text

    wfs: dict[str, Any] = {"echo": echo, "blocker": blocker, "hold": hold, "release": release,
                           "held": held}
    return wfs, log


async def statuses(url: str, queue: str) -> dict[str, str]:
    rows = await fetch(url, "SELECT workflow_uuid, status FROM dbos.workflow_status "
                            "WHERE queue_name = $1", queue)
    return {r["workflow_uuid"]: r["status"] for r in rows}


# ---- Basics and options ----


async def test_enqueue_runs_and_returns_a_typed_handle(database_url: str) -> None:
    dbos = new_dbos(database_url)
    queue = dbos.queue("basic", polling_interval=0.2)
    wfs, log = with_workflows(dbos)
    async with dbos:
        with SetWorkflowID("chosen-id"):
            handle = await queue.enqueue(wfs["echo"], "hello")
        assert handle.workflow_id == "chosen-id"
        assert await handle.get_result() == "hello"
        status = await handle.get_status()
        assert status.queue_name == "basic" and status.status == "SUCCESS"
        # The same ID again returns the finished workflow; nothing runs twice.
        with SetEnqueueOptions(workflow_id="chosen-id"):
            again = await queue.enqueue(wfs["echo"], "other")
        assert await again.get_result() == "hello"
        assert log == ["hello"]
        stored = await fetch(database_url, "SELECT name, concurrency FROM dbos.queues")
        assert {r["name"] for r in stored} == {"basic"}


async def test_priorities_run_lowest_first(database_url: str) -> None:
    producer = new_dbos(database_url)
    producer.listen()  # dispatches none of the test queues
    wfs, _ = with_workflows(producer)
    queue = producer.queue("prio", worker_concurrency=1, polling_interval=0.2)
    async with producer:
        for text, priority in [("c", 5), ("a", 1), ("d", 5), ("b", 2), ("z", 0)]:
            with SetEnqueueOptions(priority=priority):
                await queue.enqueue(wfs["echo"], text)
            await asyncio.sleep(0.002)  # equal priorities run by age (created_at, in ms)
    consumer = new_dbos(database_url)
    consumer.queue("prio", worker_concurrency=1, polling_interval=0.2)
    _, log = with_workflows(consumer)
    async with consumer:
        async def done() -> bool:
            return len(log) == 5

        await wait_until(done, what="five workflows")
    assert log == ["z", "a", "b", "c", "d"]


async def test_deduplication_reject_and_return_existing(database_url: str) -> None:
    dbos = new_dbos(database_url)
    queue = dbos.queue("dedup", polling_interval=0.2)
    wfs, log = with_workflows(dbos)
    async with dbos:
        with SetEnqueueOptions(deduplication_id="order-1"):
            first = await queue.enqueue(wfs["blocker"], "first")
            with pytest.raises(QueueDeduplicatedError) as caught:
                await queue.enqueue(wfs["blocker"], "second")
            assert "dedup" in str(caught.value) and "order-1" in str(caught.value)
            assert caught.value.queue_name == "dedup"
            assert caught.value.workflow_id == first.workflow_id
            with SetEnqueueOptions(deduplication_policy="return_existing"):
                existing = await queue.enqueue(wfs["blocker"], "third")
            assert existing.workflow_id == first.workflow_id
        wfs["release"].set()
        assert await first.get_result() == "first"
        # Finished: the deduplication ID is free again.
        with SetEnqueueOptions(deduplication_id="order-1"):
            later = await queue.enqueue(wfs["echo"], "later")
        assert await later.get_result() == "later"
        assert log == ["first", "later"]


async def test_delayed_start(database_url: str) -> None:
    clock = TestClock()
    dbos = new_dbos(database_url, clock=clock)
    queue = dbos.queue("later", polling_interval=0.2)
    wfs, _ = with_workflows(dbos)
    async with dbos:
        with SetEnqueueOptions(delay=40):
            handle = await queue.enqueue(wfs["echo"], "late")
        await clock.advance(seconds=39)
        assert (await handle.get_status()).status == "DELAYED"
        await clock.advance(seconds=1)
        assert await handle.get_result() == "late"
        row = (await fetch(database_url, "SELECT created_at, delay_until_epoch_ms, "
                                         "started_at_epoch_ms FROM dbos.workflow_status "
                                         "WHERE workflow_uuid = $1", handle.workflow_id))[0]
        assert row["started_at_epoch_ms"] == row["delay_until_epoch_ms"] \
            == row["created_at"] + 40_000


async def test_debounce_collapses_a_burst_into_one_run_with_the_latest_arguments(
        database_url: str) -> None:
    clock = TestClock()
    dbos = new_dbos(database_url, clock=clock)
    queue = dbos.queue("bounce", polling_interval=0.2)
    wfs, log = with_workflows(dbos)
    async with dbos:
        debouncer = queue.debouncer(wfs["echo"], period=30, max_delay=300)
        handles = []
        for i in range(5):  # a call every 10 s: the window never closes
            handles.append(await debouncer.debounce("user-1", f"v{i}"))
            await clock.advance(seconds=10)
        other = await debouncer.debounce("user-2", "w")
        assert len({h.workflow_id for h in handles}) == 1
        assert other.workflow_id != handles[0].workflow_id
        assert log == []
        await clock.advance(seconds=30)
        assert await handles[-1].get_result() == "v4"
        assert await other.get_result() == "w"
        # The window closed: the same key starts a new workflow.
        after = await debouncer.debounce("user-1", "next")
        assert after.workflow_id != handles[0].workflow_id
        await clock.advance(seconds=30)
        assert await after.get_result() == "next"
        assert sorted(log) == ["next", "v4", "w"]


async def test_debounce_is_bounded_by_max_delay(database_url: str) -> None:
    clock = TestClock()
    dbos = new_dbos(database_url, clock=clock)
    queue = dbos.queue("bounded", polling_interval=0.2)
    wfs, _ = with_workflows(dbos)
    async with dbos:
        debouncer = queue.debouncer(wfs["echo"], period=3, max_delay=6)
        first = await debouncer.debounce("k", "a")
        for _ in range(5):  # keeps pushing the start back, to 5 + 3 s
            await clock.advance(seconds=1)
            assert (await debouncer.debounce("k", "b")).workflow_id == first.workflow_id
        await clock.advance(seconds=1)  # 6 s: max_delay, before the period's end
        assert await first.get_result() == "b"
        row = (await fetch(database_url, "SELECT created_at, delay_until_epoch_ms, "
                                         "debounce_deadline_epoch_ms, started_at_epoch_ms "
                                         "FROM dbos.workflow_status WHERE workflow_uuid = $1",
                           first.workflow_id))[0]
        assert row["delay_until_epoch_ms"] == row["debounce_deadline_epoch_ms"] \
            == row["started_at_epoch_ms"] == row["created_at"] + 6000


async def test_debounce_from_a_workflow_is_checkpointed(database_url: str) -> None:
    """A replayed workflow gets the handles its debounces returned, instead of debouncing
    again after the burst has run (which would start a second workflow)."""

    def register(dbos: DBOS) -> tuple[Any, dict[str, Any], list[str]]:
        queue = dbos.queue("bounce-in-workflow", polling_interval=0.2)
        wfs, log = with_workflows(dbos)
        debouncer = queue.debouncer(wfs["echo"], period=0.3)

        @dbos.workflow(name="bouncing_parent")
        async def bouncing_parent() -> list[str]:
            handles = [await debouncer.debounce("key", text) for text in ("a", "b")]
            await wfs["hold"]()
            return [h.workflow_id for h in handles]

        return bouncing_parent, wfs, log

    first = new_dbos(database_url, shutdown_grace_period=0)
    bouncing_parent, wfs, log = register(first)
    async with first:
        with SetWorkflowID("bouncing-parent"):
            await first.start_workflow(bouncing_parent)

        async def burst_ran() -> bool:
            done = await fetchval(database_url, "SELECT count(*) FROM dbos.workflow_status "
                                                "WHERE name = 'echo' AND status = 'SUCCESS'")
            return bool(wfs["held"]) and done == 1

        await wait_until(burst_ran, what="the parent holding and the burst run")
        assert log == ["b"]
    second = new_dbos(database_url)
    _, wfs, replay_log = register(second)
    wfs["release"].set()
    async with second:
        ids = await (await second.retrieve_workflow("bouncing-parent")).get_result()
    assert replay_log == []
    [debounced] = await fetch(database_url, "SELECT workflow_uuid, status FROM dbos.workflow_status"
                                            " WHERE name = 'echo'")
    assert ids == [debounced["workflow_uuid"]] * 2 and debounced["status"] == "SUCCESS"
    steps = await child_steps(database_url, "bouncing-parent")
    assert steps == [("echo", ids[0], False), ("echo", ids[0], False), ("hold", None, False)]


async def test_enqueue_from_a_workflow_is_replayed_without_duplicates(
        database_url: str) -> None:
    first = new_dbos(database_url, shutdown_grace_period=0)
    first.queue("children", polling_interval=0.2)
    wfs, log = with_workflows(first)

    @first.workflow(name="parent")
    async def parent() -> list[str]:
        queue = await first.get_queue("children")
        child = await queue.enqueue(wfs["echo"], "child")
        await wfs["blocker"]("parent-waits")  # a child workflow that blocks until released
        return [await child.get_result()]

    async with first:
        with SetWorkflowID("the-parent"):
            await first.start_workflow(parent)

        async def enqueued() -> bool:
            return "parent-waits" in log

        await wait_until(enqueued, what="the parent to reach its blocking child")
    # The parent and its blocking child are PENDING; recovery replays the parent.
    second = new_dbos(database_url)
    second.queue("children", polling_interval=0.2)
    wfs2, _ = with_workflows(second)

    @second.workflow(name="parent")
    async def parent2() -> list[str]:
        queue = await second.get_queue("children")
        child = await queue.enqueue(wfs2["echo"], "child")
        await wfs2["blocker"]("parent-waits")
        return [await child.get_result()]

    async with second:
        wfs2["release"].set()
        handle = await second.retrieve_workflow("the-parent")
        assert await handle.get_result() == ["child"]
    children = await fetch(database_url, "SELECT workflow_uuid FROM dbos.workflow_status "
                                         "WHERE parent_workflow_id = 'the-parent' "
                                         "AND queue_name = 'children'")
    assert [r["workflow_uuid"] for r in children] == ["the-parent-0"]


async def test_deduplication_inside_a_workflow_is_replayed(database_url: str) -> None:
    """A replay gets what deduplication gave the first execution (the rejection, the holder's
    handle), even though the holder has finished and the ID is free by then."""

    def register(dbos: DBOS) -> tuple[Queue, Any, Any, list[str]]:
        queue = dbos.queue("dedup-in-workflow", polling_interval=0.2)
        wfs, log = with_workflows(dbos)

        @dbos.workflow(name="dedup_parent")
        async def dedup_parent() -> list[str]:
            outcome = "enqueued"
            try:
                with SetEnqueueOptions(deduplication_id="d-1"):
                    await queue.enqueue(wfs["echo"], "rejected")
            except QueueDeduplicatedError as error:
                outcome = f"rejected while {error.workflow_id} held it"
            with SetEnqueueOptions(deduplication_id="d-1",
                                   deduplication_policy="return_existing"):
                existing = await queue.enqueue(wfs["echo"], "returned")
            await wfs["hold"]()
            return [outcome, existing.workflow_id]

        return queue, wfs, dedup_parent, log

    first = new_dbos(database_url, shutdown_grace_period=0)
    queue, wfs, dedup_parent, _ = register(first)
    async with first:
        with SetWorkflowID("dedup-holder"), SetEnqueueOptions(deduplication_id="d-1"):
            await queue.enqueue(wfs["blocker"], "holder")
        with SetWorkflowID("dedup-parent"):
            await first.start_workflow(dedup_parent)

        async def both_holding() -> bool:
            return len(wfs["held"]) == 2  # the holder (a blocker) and the parent

        await wait_until(both_holding, what="the holder and the parent to hold")
        await first.cancel_workflow("dedup-holder")  # frees the deduplication ID
    second = new_dbos(database_url)
    _, wfs, _, log = register(second)
    wfs["release"].set()
    async with second:
        result = await (await second.retrieve_workflow("dedup-parent")).get_result()
    assert result == ["rejected while dedup-holder held it", "dedup-holder"]
    assert log == []  # neither enqueue ran anything on replay
    workflows = await fetch(database_url, "SELECT workflow_uuid, status FROM dbos.workflow_status"
                                          " ORDER BY workflow_uuid")
    assert [tuple(r) for r in workflows] == [("dedup-holder", "CANCELLED"),
                                             ("dedup-parent", "SUCCESS")]
    steps = await child_steps(database_url, "dedup-parent")
    assert steps == [("echo", None, True), ("echo", "dedup-holder", False), ("hold", None, False)]


async def child_steps(url: str, workflow_id: str) -> list[tuple[str, str | None, bool]]:
    rows = await fetch(url, "SELECT function_name, child_workflow_id, error IS NOT NULL AS err "
                            "FROM dbos.operation_outputs WHERE workflow_uuid = $1 "
                            "ORDER BY function_id", workflow_id)
    return [(r["function_name"], r["child_workflow_id"], r["err"]) for r in rows]


async def test_recovery_reenqueues_and_dead_letters(database_url: str) -> None:
    async def run_once() -> str:
        dbos = new_dbos(database_url, shutdown_grace_period=0, max_recovery_attempts=1)
        dbos.queue("fragile", polling_interval=0.2)
        wfs, _ = with_workflows(dbos)
        async with dbos:
            status = await dbos.get_workflow_status("fragile-1")
            if status is None:
                with SetWorkflowID("fragile-1"):
                    await (await dbos.get_queue("fragile")).enqueue(wfs["blocker"], "x")
            if status is not None and status.status == "MAX_RECOVERY_ATTEMPTS_EXCEEDED":
                return status.status

            async def running() -> bool:
                return bool(wfs["held"])

            await wait_until(running, what="the workflow to run")
        return "interrupted"

    assert await run_once() == "interrupted"  # attempt 1
    assert await run_once() == "interrupted"  # recovered once: re-enqueued, attempt 2
    assert await run_once() == "MAX_RECOVERY_ATTEMPTS_EXCEEDED"
    dbos = new_dbos(database_url)
    async with dbos:
        handle = await dbos.retrieve_workflow("fragile-1")
        with pytest.raises(DeadLetteredError):
            await handle.get_result()
    assert await fetchval(database_url, "SELECT recovery_attempts FROM dbos.workflow_status "
                                        "WHERE workflow_uuid = 'fragile-1'") == 2


async def test_recovery_leaves_a_workflow_its_queue_just_started(database_url: str) -> None:
    """A queued workflow that is PENDING when recovery claims (a dispatcher of this process
    has flipped it but not launched it yet) is not claimed a second time: it would run
    twice. Queued workflows are recovered by putting them back on their queue."""
    dbos = new_dbos(database_url)
    dbos.queue("held-back", polling_interval=0.2)
    dbos.listen()  # dispatches none of the test queues: the test plays the dispatcher
    wfs, _ = with_workflows(dbos)
    async with dbos:
        with SetWorkflowID("just-started"):
            await (await dbos.get_queue("held-back")).enqueue(wfs["echo"], "x")
        await execute(database_url, "UPDATE dbos.workflow_status SET status = 'PENDING', "
                                    "executor_id = $1, recovery_attempts = 1 "
                                    "WHERE workflow_uuid = 'just-started'", EXECUTOR_ID)
        claimed = await dbos._system_database.claim_pending(EXECUTOR_ID, APP_VERSION)
        assert claimed == []
    assert await fetchval(database_url, "SELECT recovery_attempts FROM dbos.workflow_status "
                                        "WHERE workflow_uuid = 'just-started'") == 1


async def test_recovery_during_dispatch_runs_nothing_twice(database_url: str) -> None:
    """recover_pending_workflows while a dispatcher drains a backlog: recovery waits for claim
    rounds in flight, so it never re-enqueues a workflow that was claimed but not launched."""
    dbos = new_dbos(database_url, pool_size=8)
    queue = dbos.queue("busy", worker_concurrency=20, polling_interval=0.05)
    runs: Counter[int] = Counter()

    @dbos.step(name="count_run")
    async def count_run(i: int) -> None:
        runs[i] += 1
        await asyncio.sleep(0.005)

    @dbos.workflow(name="counted")
    async def counted(i: int) -> int:
        await count_run(i)
        return i

    async with dbos:
        handles = [await queue.enqueue(counted, i) for i in range(300)]
        drained = asyncio.ensure_future(dbos.wait_all(handles))
        while not drained.done():
            await dbos.recover_pending_workflows()
            await asyncio.sleep(0)
        assert await drained == list(range(300))
    assert runs == Counter(range(300))
    attempts = await fetch(database_url, "SELECT DISTINCT recovery_attempts "
                                         "FROM dbos.workflow_status WHERE name = 'counted'")
    assert [r["recovery_attempts"] for r in attempts] == [1]


async def test_claims_hold_no_more_than_the_free_slots(database_url: str) -> None:
    """Slots freed one at a time, each claimed again while the others run: the executor
    never runs, nor holds PENDING, more workflows than its worker concurrency, and each
    workflow runs once."""
    dbos = new_dbos(database_url)
    slots, total = 4, 14
    queue = dbos.queue("slots", worker_concurrency=slots, polling_interval=0.05)
    running: set[int] = set()
    peak = 0
    runs: Counter[int] = Counter()
    gates: dict[int, asyncio.Event] = {}

    @dbos.workflow(name="gated")
    async def gated(i: int) -> int:
        nonlocal peak
        runs[i] += 1
        running.add(i)
        peak = max(peak, len(running))
        await gates.setdefault(i, asyncio.Event()).wait()
        running.discard(i)
        return i

    async def pending() -> int:
        return int(await fetchval(database_url, "SELECT count(*) FROM dbos.workflow_status "
                                                "WHERE queue_name = 'slots' "
                                                "AND status = 'PENDING'"))

    async with dbos:
        handles = {i: await queue.enqueue(gated, i) for i in range(total)}
        done = 0
        while done < total:
            async def refilled(left: int = total - done) -> bool:
                return len(running) == min(slots, left)

            await wait_until(refilled, what="the free slots filled")
            assert await pending() == len(running)
            released = min(running)
            gates.setdefault(released, asyncio.Event()).set()
            assert await handles[released].get_result() == released
            done += 1
    assert peak == slots
    assert runs == Counter(range(total))


async def test_claims_wait_for_outcomes_that_cannot_be_written(database_url: str) -> None:
    """A slot is free once its body ends, while its outcome is being written. With the
    outcomes' table locked, no outcome can be written: the claims stop once as many
    outcomes again as the worker concurrency are waiting, instead of claiming the whole
    queue, and every workflow finishes once the writes go through."""
    dbos = new_dbos(database_url)
    slots, total = 2, 12
    queue = dbos.queue("held", worker_concurrency=slots, polling_interval=0.05)

    @dbos.workflow(name="quick")
    async def quick(i: int) -> int:
        return i

    async def counted(status: str) -> int:
        return int(await fetchval(database_url, "SELECT count(*) FROM dbos.workflow_status "
                                                "WHERE queue_name = 'held' AND status = $1",
                                  status))

    blocker = await asyncpg.connect(database_url)
    try:
        async with dbos:
            held = blocker.transaction()
            await held.start()
            await blocker.execute("LOCK TABLE dbos.workflow_output IN EXCLUSIVE MODE")
            handles = [await queue.enqueue(quick, i) for i in range(total)]

            async def claimed_twice_the_slots() -> bool:
                return await counted("PENDING") >= 2 * slots

            await wait_until(claimed_twice_the_slots, what="the first claims")
            loop_state = dbos._current_runtime.claim_loops["held"]
            rounds = loop_state.rounds

            async def claim_rounds_went_by() -> bool:  # or the queue was claimed whole
                return loop_state.rounds >= rounds + 5 or not await counted("ENQUEUED")

            await wait_until(claim_rounds_went_by, what="more claim rounds")
            assert await counted("PENDING") == 2 * slots
            assert await counted("ENQUEUED") == total - 2 * slots
            await held.rollback()
            assert [await handle.get_result() for handle in handles] == list(range(total))
    finally:
        await blocker.close()
    assert await counted("SUCCESS") == total


# ---- Queues from the table, listening, missing functions ----


async def test_queue_defined_elsewhere_is_found_and_dispatched(database_url: str) -> None:
    definer = new_dbos(database_url)
    definer.queue("shared", concurrency=3, limiter=(10, 1.0), polling_interval=0.2)
    definer.listen()
    with_workflows(definer)
    async with definer:
        pass
    worker = new_dbos(database_url, listen_queues=["shared"])
    wfs, _ = with_workflows(worker)
    async with worker:
        queue = await worker.get_queue("shared")
        assert queue.concurrency == 3 and queue.limiter == RateLimit(10, 1.0)
        assert "shared" in worker._current_runtime.claim_loops
        handle = await queue.enqueue(wfs["echo"], "via-table")
        assert await handle.get_result() == "via-table"


async def test_unknown_queue_names_fail_clearly(database_url: str) -> None:
    dbos = new_dbos(database_url)
    with_workflows(dbos)
    async with dbos:
        with pytest.raises(QueueNotFoundError, match="'nope'"):
            await dbos.get_queue("nope")
    listener = new_dbos(database_url, listen_queues=["missing-queue"])
    with pytest.raises(QueueNotFoundError, match="missing-queue"):
        async with listener:
            pass
    undeclared = Queue("loose")
    with pytest.raises(DBOSError, match="not registered with a DBOS instance"):
        undeclared.enqueue(lambda: None)  # type: ignore[arg-type, return-value]


async def test_workflow_without_its_function_stays_enqueued(database_url: str) -> None:
    producer = new_dbos(database_url)
    producer.listen()
    queue = producer.queue("mixed", polling_interval=0.1)
    wfs, _ = with_workflows(producer)

    @producer.workflow(name="rare")
    async def rare(x: int) -> int:
        return x + 1

    async with producer:
        orphan = await queue.enqueue(rare, 41)
        common = await queue.enqueue(wfs["echo"], "common")
    lacking = new_dbos(database_url)
    lacking.queue("mixed", polling_interval=0.1)
    with_workflows(lacking)  # has echo, not rare
    async with lacking:
        assert await (await lacking.retrieve_workflow(common.workflow_id)).get_result() \
            == "common"
        dispatcher = lacking._current_runtime.claim_loops["mixed"]
        await more_queue_polls(lacking, 3)
        assert (await statuses(database_url, "mixed"))[orphan.workflow_id] == "ENQUEUED"
        # ... and it says so: one warning naming the queue, the function and the workflow,
        # however many rounds find it, as many enqueues of it as there are.
        await rare_directly(database_url, "mixed", "rare", 3)
        await more_queue_polls(lacking, 1)
        [warning] = lacking.queue_warnings
        assert isinstance(warning, WorkflowNotRegisteredError)
        assert (warning.queue_name, warning.name, warning.workflow_id) == (
            "mixed", "rare", orphan.workflow_id)
        assert "'mixed'" in str(warning) and "'rare'" in str(warning)
        assert dispatcher.unregistered == {"rare"}
    having = new_dbos(database_url)
    having.queue("mixed", polling_interval=0.1)

    @having.workflow(name="rare")
    async def rare2(x: int) -> int:
        return x + 1

    async with having:
        assert await (await having.retrieve_workflow(orphan.workflow_id)).get_result() == 42


async def more_queue_polls(dbos: DBOS, count: int) -> None:
    """Wait until the queue watcher has looked for startable work ``count`` more times
    (it polls for every idle queue, and would wake its claim loop)."""
    watch = dbos._current_runtime.queue_poll
    assert watch is not None
    polls = watch.polls

    async def polled() -> bool:
        return watch.polls >= polls + count

    await wait_until(polled, what=f"{count} more polls of the queues")


async def rare_directly(url: str, queue: str, name: str, count: int) -> None:
    """Enqueue ``count`` more unversioned workflows of ``name`` through the SQL function."""
    for _ in range(count):
        await fetchval(url, "SELECT dbos.enqueue_workflow($1, $2, ARRAY['1'::json])",
                       name, queue)


async def test_unversioned_work_goes_to_the_latest_version_only(database_url: str) -> None:
    """DBOS's rule: a claim takes its own version's workflows, and unversioned ones only
    while its version is the latest registered one."""
    old = new_dbos(database_url, application_version="v-old")
    queue = old.queue("versions", polling_interval=0.1)
    wfs, log = with_workflows(old)
    async with old:
        # v-old is the only (so the latest) version: it takes unversioned work.
        await execute(database_url, "SELECT dbos.enqueue_workflow('echo', 'versions', "
                      "ARRAY['\"unversioned-1\"'::json], workflow_id => 'u1')")
        assert await (await old.retrieve_workflow("u1")).get_result() == "unversioned-1"
        await old.set_latest_application_version("v-new")  # a newer deploy registers
        await execute(database_url, "SELECT dbos.enqueue_workflow('echo', 'versions', "
                      "ARRAY['\"unversioned-2\"'::json], workflow_id => 'u2')")
        # Its own version's work still runs here.
        mine = await queue.enqueue(wfs["echo"], "own-version")
        assert await mine.get_result() == "own-version"
        await more_queue_polls(old, 3)
        assert (await statuses(database_url, "versions"))["u2"] == "ENQUEUED"
        assert "unversioned-2" not in log
    new = new_dbos(database_url, application_version="v-new")
    new.queue("versions", polling_interval=0.1)
    with_workflows(new)
    async with new:
        assert await (await new.retrieve_workflow("u2")).get_result() == "unversioned-2"
    version = await fetchval(database_url, "SELECT application_version "
                                           "FROM dbos.workflow_status WHERE workflow_uuid = 'u2'")
    assert version == "v-new"


async def test_partition_keys_are_required_exactly_on_partitioned_queues(
        database_url: str) -> None:
    dbos = new_dbos(database_url)
    plain = dbos.queue("plain")
    parted = dbos.queue("parted", partition_queue=True, partition_concurrency=1)
    wfs, _ = with_workflows(dbos)
    async with dbos:
        with pytest.raises(DBOSError, match="is partitioned"):
            await parted.enqueue(wfs["echo"], "x")
        with SetEnqueueOptions(partition_key="k"), \
                pytest.raises(DBOSError, match="not partitioned"):
            await plain.enqueue(wfs["echo"], "x")
        with SetEnqueueOptions(partition_key="k"):
            assert await (await parted.enqueue(wfs["echo"], "y")).get_result() == "y"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"concurrency": 0}, "concurrency must be an integer >= 1"),
        ({"concurrency": 1.5}, "concurrency must be an integer >= 1"),
        ({"worker_concurrency": -1}, "worker_concurrency must be"),
        ({"concurrency": 2, "worker_concurrency": 3}, "exceeds concurrency"),
        ({"limiter": (0, 1.0)}, "limit must be an integer >= 1"),
        ({"limiter": (5, 0)}, "limiter period of queue 'bad': must be positive"),
        ({"limiter": (5, math.inf)}, "limiter period of queue 'bad': is infinite"),
        ({"limiter": "fast"}, "limiter must be"),
        ({"partition_concurrency": 1}, "partition limits need partition_queue=True"),
        ({"partition_queue": True, "partition_limiter": (1, -2)},
         "partition_limiter period of queue 'bad': must be positive"),
        ({"partition_queue": True, "partition_concurrency": 1,
          "partition_worker_concurrency": 2}, "partition_worker_concurrency exceeds"),
        ({"polling_interval": 0}, "polling_interval of queue 'bad': must be positive"),
        ({"polling_interval": math.nan}, "polling_interval of queue 'bad': is NaN"),
    ],
)
def test_invalid_limits_are_rejected(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        Queue("bad", **kwargs)


def test_invalid_options_are_rejected() -> None:
    with pytest.raises(DBOSError, match="priority"):
        SetEnqueueOptions(priority=-1)
    with pytest.raises(DBOSError, match="delay"):
        SetEnqueueOptions(delay=-1)
    with pytest.raises(DBOSError, match="deduplication_policy"):
        SetEnqueueOptions(deduplication_policy="maybe")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="Invalid queue name: must be a non-empty string"):
        Queue("")
    assert Queue("ok", limiter={"limit": 3, "period": 2}).limiter == RateLimit(3, 2.0)


# ---- Recovery and claims in one process ----


async def test_claim_gate_orders_recovery_and_claims() -> None:
    """Recovery waits for the claim round in flight and holds back new ones; a recovery
    cancelled while waiting releases the claims it held back."""
    gate = ClaimGate()
    events: list[str] = []
    release_claim = asyncio.Event()

    async def claim(name: str, hold: asyncio.Event | None = None) -> None:
        async with gate.claiming():
            events.append(f"{name} in")
            if hold is not None:
                await hold.wait()
            events.append(f"{name} out")

    async def recover() -> None:
        async with gate.recovering():
            events.append("recovery")

    first = asyncio.ensure_future(claim("first", release_claim))
    await asyncio.sleep(0.01)
    recovery = asyncio.ensure_future(recover())
    await asyncio.sleep(0.01)
    second = asyncio.ensure_future(claim("second"))
    await asyncio.sleep(0.01)
    assert events == ["first in"]  # recovery waits for first; second waits for recovery
    release_claim.set()
    await asyncio.gather(first, recovery, second)
    assert events == ["first in", "first out", "recovery", "second in", "second out"]

    events.clear()
    release_claim.clear()
    held = asyncio.ensure_future(claim("held", release_claim))
    await asyncio.sleep(0.01)
    waiting = asyncio.ensure_future(recover())
    await asyncio.sleep(0.01)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    release_claim.set()
    async with asyncio.timeout(5):
        await asyncio.gather(held, claim("after"))
    assert events == ["held in", "held out", "after in", "after out"]
