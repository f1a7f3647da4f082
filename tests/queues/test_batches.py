"""Batch operations: send_bulk, enqueue_many, fork_workflows and wait_first over many
handles, on the unsharded and the sharded schema.

Each batch is one statement per shard key in one transaction: it lands whole or not at all,
and a bad batch (empty, an ID twice, an unknown ID) is refused naming the problem with
nothing written.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg
import pytest
from helpers import fetchval, new_dbos, wait_until

from dbos_async import (
    DBOSClient,
    DBOSError,
    EnqueueRequest,
    ForkRequest,
    InvalidArgumentError,
    NonExistentWorkflowError,
    SendMessage,
    SerializationError,
    SetShardKey,
    SetWorkflowID,
    WorkflowConflictError,
)
from dbos_async._sysdb.chunks import CHUNK_ROWS
from dbos_async._sysdb.database import StepRecord
from dbos_async._sysdb.notifications import WORKFLOW_COMPLETION_CHANNEL, keyed
from dbos_async._sysdb.statements import NewWorkflow, ParentStep

PATIENCE = 30.0


@pytest.fixture(params=["unsharded", "sharded"])
def sharding(request: pytest.FixtureRequest) -> bool:
    return bool(request.param == "sharded")


def keys(sharding: bool) -> tuple[str | None, str | None]:
    """Two shard keys on a sharded schema (None, None unsharded)."""
    return ("acme", "globex") if sharding else (None, None)


class Keyed:
    """Start under a shard key when it is one (a no-op unsharded)."""

    def __init__(self, key: str | None) -> None:
        self.block = SetShardKey(key) if key is not None else None

    def __enter__(self) -> None:
        if self.block is not None:
            self.block.__enter__()

    def __exit__(self, *exc: object) -> None:
        if self.block is not None:
            self.block.__exit__(*exc)


async def count(url: str, table: str) -> int:
    return int(await fetchval(url, f"SELECT count(*) FROM dbos.{table}"))


# ---- send_bulk ----


class Mailboxes:
    """An executor whose ``inbox`` workflows receive ``n`` messages on a topic."""

    def __init__(self, url: str, sharding: bool) -> None:
        self.dbos = dbos = new_dbos(url, sharding=sharding)

        @dbos.workflow(name="inbox")
        async def inbox(n: int) -> list[Any]:
            return [await dbos.recv("mail", timeout=PATIENCE) for _ in range(n)]

        @dbos.workflow(name="mailer")
        async def mailer(messages: list[list[Any]]) -> str:
            await dbos.send_bulk([SendMessage(d, m, "mail", f"k-{d}-{m}", shard_key=k)
                                  for d, m, k in messages])
            return "sent"

        @dbos.step(name="mail_step")
        async def mail_step(messages: list[list[Any]]) -> None:
            await dbos.send_bulk([SendMessage(d, m, "mail", shard_key=k)
                                  for d, m, k in messages])

        @dbos.workflow(name="step_mailer")
        async def step_mailer(messages: list[list[Any]]) -> None:
            await mail_step(messages)

        self.inbox, self.mailer, self.step_mailer = inbox, mailer, step_mailer

    async def start_inbox(self, workflow_id: str, key: str | None, n: int) -> Any:
        with Keyed(key), SetWorkflowID(workflow_id):
            return await self.dbos.start_workflow(self.inbox, n)


async def test_send_bulk_delivers_each_message_once(database_url: str, sharding: bool) -> None:
    a, b = keys(sharding)
    box = Mailboxes(database_url, sharding)
    async with box.dbos as dbos:
        first = await box.start_inbox("box-1", a, 2)
        # Sharded: the same ID under another key is another mailbox.
        second = await box.start_inbox("box-1" if sharding else "box-2", b, 1)
        second_id = second.workflow_id
        batch = [SendMessage("box-1", "one", "mail", "k1", shard_key=a),
                 SendMessage(second_id, {"two": 2}, "mail", "k2", shard_key=b),
                 SendMessage("box-1", "three", "mail", "k3", shard_key=a)]
        await dbos.send_bulk(batch)
        await dbos.send_bulk(batch)  # the same idempotency keys: delivered once
        assert sorted(await first.get_result()) == ["one", "three"]
        assert await second.get_result() == [{"two": 2}]
    assert await count(database_url, "notifications") == 3
    ids = await fetchval(database_url, "SELECT array_agg(message_uuid ORDER BY message_uuid) "
                                       "FROM dbos.notifications")
    assert ids == sorted(["k1::box-1", f"k2::{second_id}", "k3::box-1"])


async def test_send_bulk_from_a_workflow_is_one_checkpoint(database_url: str,
                                                           sharding: bool) -> None:
    a, b = keys(sharding)
    box = Mailboxes(database_url, sharding)
    async with box.dbos as dbos:
        near = await box.start_inbox("near", a, 1)
        far = await box.start_inbox("far", b, 2)
        with Keyed(a), SetWorkflowID("mailer"):
            mailer = await dbos.start_workflow(
                box.mailer, [["near", "x", a], ["far", "y", b], ["far", "z", b]])
        assert await mailer.get_result() == "sent"
        assert await near.get_result() == ["x"]
        assert sorted(await far.get_result()) == ["y", "z"]
        steps = await dbos.list_workflow_steps("mailer", shard_key=a)
        assert [s.name for s in steps] == ["DBOS.send_bulk"]
        # A fork past the checkpoint replays it: nothing is sent again.
        fork = await dbos.fork_workflow("mailer", 1, new_workflow_id="mailer-again",
                                        shard_key=a)
        assert await fork.get_result() == "sent"
        # From a step the batch is not recorded; it is still fenced and delivered.
        with Keyed(a), SetWorkflowID("step-mailer"):
            stepped = await dbos.start_workflow(box.step_mailer, [["far", "w", b]])
        await stepped.get_result()
        steps = await dbos.list_workflow_steps("step-mailer", shard_key=a)
        assert [s.name for s in steps] == ["mail_step"]
        # A batch with no message under the sender's own key (sharded: all to another).
        with Keyed(a), SetWorkflowID("far-mailer"):
            far_only = await dbos.start_workflow(box.mailer, [["far", "v", b]])
        assert await far_only.get_result() == "sent"
    assert await count(database_url, "notifications") == 5


async def test_send_bulk_refuses_bad_batches_and_writes_nothing(database_url: str,
                                                                sharding: bool) -> None:
    a, _ = keys(sharding)
    box = Mailboxes(database_url, sharding)
    async with box.dbos as dbos:
        await box.start_inbox("box", a, 1)
        with pytest.raises(DBOSError, match="non-empty list"):
            await dbos.send_bulk([])
        with pytest.raises(DBOSError, match="duplicate idempotency keys: k"):
            await dbos.send_bulk([SendMessage("box", 1, idempotency_key="k", shard_key=a),
                                  SendMessage("box", 2, idempotency_key="k", shard_key=a)])
        with pytest.raises(SerializationError, match="portable JSON"):
            await dbos.send_bulk([SendMessage("box", object(), shard_key=a)])
        # One missing destination fails the whole batch, naming each missing one.
        with pytest.raises(NonExistentWorkflowError, match="ghost-1, ghost-2"):
            await dbos.send_bulk([SendMessage("box", "ok", shard_key=a),
                                  SendMessage("ghost-2", "no", shard_key=a),
                                  SendMessage("ghost-1", "no", shard_key=a)])
        if sharding:
            with pytest.raises(DBOSError, match="needs a shard key"):
                await dbos.send_bulk([SendMessage("box", "ok", shard_key=a),
                                      SendMessage("box", "no key")])
        # From a workflow the missing destination is its recorded outcome.
        with Keyed(a), SetWorkflowID("bad-mailer"):
            bad = await dbos.start_workflow(box.mailer, [["box", "ok", a], ["ghost", "x", a]])
        with pytest.raises(NonExistentWorkflowError):
            await bad.get_result()
        steps = await dbos.list_workflow_steps("bad-mailer", shard_key=a)
        assert [s.name for s in steps] == ["DBOS.send_bulk"]
        assert isinstance(steps[0].error, NonExistentWorkflowError)
        await dbos.cancel_workflow("box", shard_key=a)
    assert await count(database_url, "notifications") == 0


async def test_client_send_bulk(database_url: str, sharding: bool) -> None:
    a, b = keys(sharding)
    box = Mailboxes(database_url, sharding)
    async with box.dbos:
        one = await box.start_inbox("c-1", a, 1)
        two = await box.start_inbox("c-2", b, 1)
        async with DBOSClient(database_url, sharding=sharding) as client:
            batch = [SendMessage("c-1", "hi", "mail", "once", shard_key=a),
                     SendMessage("c-2", "ho", "mail", "twice", shard_key=b)]
            await client.send_bulk(batch)
            await client.send_bulk(batch)
        assert await one.get_result() == ["hi"]
        assert await two.get_result() == ["ho"]
    assert await count(database_url, "notifications") == 2


async def test_client_send_bulk_in_the_callers_transaction(database_url: str,
                                                           sharding: bool) -> None:
    a, b = keys(sharding)
    box = Mailboxes(database_url, sharding)
    async with box.dbos:
        one = await box.start_inbox("t-1", a, 1)
        two = await box.start_inbox("t-2", b, 1)
        async with DBOSClient(database_url, sharding=sharding) as client:
            conn = await asyncpg.connect(database_url)
            try:
                with pytest.raises(RuntimeError):
                    async with conn.transaction():
                        await client.send_bulk([SendMessage("t-1", "lost", "mail",
                                                            shard_key=a)], connection=conn)
                        raise RuntimeError("the caller rolls back")
                assert await count(database_url, "notifications") == 0
                async with conn.transaction():
                    await client.send_bulk([SendMessage("t-1", "kept", "mail", shard_key=a),
                                            SendMessage("t-2", "kept", "mail", shard_key=b)],
                                           connection=conn)
                    # A missing destination fails the savepoint, not the caller's
                    # transaction.
                    with pytest.raises(NonExistentWorkflowError, match="ghost"):
                        await client.send_bulk([SendMessage("ghost", 1, shard_key=a)],
                                               connection=conn)
            finally:
                await conn.close()
        assert await one.get_result() == ["kept"]
        assert await two.get_result() == ["kept"]
    assert await count(database_url, "notifications") == 2




# ---- enqueue_many ----


class Jobs:
    """An executor with a queue of ``job`` workflows (and a partitioned one)."""

    def __init__(self, url: str, sharding: bool, **settings: Any) -> None:
        self.dbos = dbos = new_dbos(url, sharding=sharding, **settings)
        self.queue = dbos.queue("jobs")
        self.parts = dbos.queue("parts", partition_queue=True)
        self.runs: Counter[int] = Counter()

        @dbos.workflow(name="job")
        async def job(n: int, tag: str = "") -> str:
            self.runs[n] += 1
            return f"{tag}{n}"

        @dbos.workflow(name="other")
        async def other() -> None:
            return None

        @dbos.workflow(name="enqueuer")
        async def enqueuer(key: str | None) -> list[list[str]]:
            results = await dbos.enqueue_many(self.queue, [
                EnqueueRequest(job, (10,), shard_key=key),
                EnqueueRequest(job, (11,), workflow_id="named-child", shard_key=key),
                EnqueueRequest(job, (12,), deduplication_id="dd", shard_key=key),
                EnqueueRequest(job, (13,), deduplication_id="dd", shard_key=key)])
            return [[r.workflow_id, r.outcome, await r.handle.get_result()] for r in results]

        self.job, self.other, self.enqueuer = job, other, enqueuer


async def test_enqueue_many_returns_a_result_per_row_in_order(database_url: str,
                                                              sharding: bool) -> None:
    a, b = keys(sharding)
    jobs = Jobs(database_url, sharding)
    async with jobs.dbos as dbos:
        with Keyed(a):
            held = await dbos.start_workflow(jobs.other)  # no dedup ID: leaves "d" free
        rows = [EnqueueRequest(jobs.job, (1,), {"tag": "t"}, workflow_id="j-1", shard_key=a),
                EnqueueRequest("job", (2,), workflow_id="j-2", shard_key=b, priority=5),
                EnqueueRequest(jobs.job, (3,), workflow_id="j-3", deduplication_id="d",
                               shard_key=a),
                # The same deduplication ID as the row before: that row holds it.
                EnqueueRequest(jobs.job, (4,), workflow_id="j-4", deduplication_id="d",
                               shard_key=a),
                EnqueueRequest(jobs.job, (5,), shard_key=b, delay=0.01)]
        results = await dbos.enqueue_many(jobs.queue, rows)
        assert [r.outcome for r in results] == ["enqueued", "enqueued", "enqueued",
                                                 "deduplicated", "enqueued"]
        assert [r.workflow_id for r in results][:4] == ["j-1", "j-2", "j-3", "j-3"]
        assert [await r.handle.get_result() for r in results] == ["t1", "2", "3", "3", "5"]
        await held.get_result()
        status = await dbos.get_workflow_status("j-2", shard_key=b)
        assert status is not None and status.priority == 5 and status.queue_name == "jobs"
        # The same rows again: each written row is found under its ID; j-4, deduplicated
        # before, is written now that j-3 has finished and freed the deduplication ID.
        again = await dbos.enqueue_many("jobs", rows[:4])
        assert [r.outcome for r in again] == ["existing", "existing", "existing", "enqueued"]
        assert [r.workflow_id for r in again] == ["j-1", "j-2", "j-3", "j-4"]
        assert await again[3].handle.get_result() == "4"
    # j-4 ran on the second batch (its deduplication ID was free once j-3 finished).
    assert jobs.runs == Counter({1: 1, 2: 1, 3: 1, 4: 1, 5: 1})


async def test_enqueue_many_deduplicates_against_active_workflows(database_url: str,
                                                                  sharding: bool) -> None:
    a, b = keys(sharding)
    jobs = Jobs(database_url, sharding, listen_queues=[])
    async with jobs.dbos as dbos:  # claims nothing: enqueued workflows stay ENQUEUED
        first = await dbos.enqueue_many(jobs.queue, [
            EnqueueRequest(jobs.job, (1,), workflow_id="holder", deduplication_id="d",
                           shard_key=a)])
        assert [r.outcome for r in first] == ["enqueued"]
        second = await dbos.enqueue_many(jobs.queue, [
            EnqueueRequest(jobs.job, (2,), workflow_id="late", deduplication_id="d",
                           shard_key=a),
            # Deduplication is per key on a sharded database.
            EnqueueRequest(jobs.job, (3,), workflow_id="elsewhere", deduplication_id="d",
                           shard_key=b)])
        assert [(r.outcome, r.workflow_id) for r in second] == [
            ("deduplicated", "holder"),
            ("enqueued" if sharding else "deduplicated",
             "elsewhere" if sharding else "holder")]
        assert await dbos.get_workflow_status("late", shard_key=a) is None


async def test_enqueue_many_refuses_bad_batches_and_writes_nothing(database_url: str,
                                                                   sharding: bool) -> None:
    a, b = keys(sharding)
    jobs = Jobs(database_url, sharding, listen_queues=[])
    async with jobs.dbos as dbos:
        with Keyed(a), SetWorkflowID("taken"):
            await dbos.start_workflow(jobs.other)
        before = await count(database_url, "workflow_status")
        good = EnqueueRequest(jobs.job, (1,), workflow_id="good", shard_key=a)
        with pytest.raises(DBOSError, match="non-empty list"):
            await dbos.enqueue_many(jobs.queue, [])
        with pytest.raises(DBOSError, match="workflow ID 'twice' twice"):
            await dbos.enqueue_many(jobs.queue, [
                good, EnqueueRequest(jobs.job, (1,), workflow_id="twice", shard_key=a),
                EnqueueRequest(jobs.job, (2,), workflow_id="twice", shard_key=a)])
        # An ID another workflow name uses refuses the batch whole, on every key.
        with pytest.raises(DBOSError, match="'taken' is already used by workflow 'other'"):
            await dbos.enqueue_many(jobs.queue, [
                good, EnqueueRequest(jobs.job, (2,), workflow_id="b-row", shard_key=b),
                EnqueueRequest(jobs.job, (3,), workflow_id="taken", shard_key=a)])
        with pytest.raises(DBOSError, match="priority must be"):
            await dbos.enqueue_many(jobs.queue, [good, EnqueueRequest(jobs.job, priority=-1)])
        with pytest.raises(DBOSError, match="is not a workflow"):
            await dbos.enqueue_many(jobs.queue, [good, EnqueueRequest(print)])
        with pytest.raises(DBOSError, match="No workflow named 'nope'"):
            await dbos.enqueue_many(jobs.queue, [good, EnqueueRequest("nope")])
        with pytest.raises(DBOSError, match="is partitioned"):
            await dbos.enqueue_many(jobs.parts, [EnqueueRequest(jobs.job, (1,), shard_key=a)])
        with pytest.raises(InvalidArgumentError, match=r"argument 'n' .*: expected int"):
            await dbos.enqueue_many(jobs.queue, [good, EnqueueRequest(jobs.job, (object(),))])
        with pytest.raises(SerializationError, match="lone surrogate"):
            await dbos.enqueue_many(jobs.queue, [good, EnqueueRequest(jobs.job, (1, "\ud800"))])
        if sharding:
            with pytest.raises(DBOSError, match="needs a shard key"):
                await dbos.enqueue_many(jobs.queue, [good, EnqueueRequest(jobs.job, (1,))])
        assert await count(database_url, "workflow_status") == before


async def test_enqueue_many_from_a_workflow_is_one_checkpoint(database_url: str,
                                                               sharding: bool) -> None:
    a, _ = keys(sharding)
    jobs = Jobs(database_url, sharding)
    expected = [["parent-0-0", "enqueued", "10"], ["named-child", "enqueued", "11"],
                ["parent-0-2", "enqueued", "12"], ["parent-0-2", "deduplicated", "12"]]
    async with jobs.dbos as dbos:
        with Keyed(a), SetWorkflowID("parent"):
            parent = await dbos.start_workflow(jobs.enqueuer, a)
        assert await parent.get_result() == expected
        steps = await dbos.list_workflow_steps("parent", shard_key=a)
        assert [s.name for s in steps][:1] == ["DBOS.enqueue_many"]
        children = await dbos.list_workflows(parent_workflow_id="parent")
        assert sorted(c.workflow_id for c in children) == [
            "named-child", "parent-0-0", "parent-0-2"]
        # A replay (a fork past the checkpoint) returns the recorded results and enqueues
        # nothing again.
        fork = await dbos.fork_workflow("parent", 1, new_workflow_id="parent-again",
                                        shard_key=a)
        assert await fork.get_result() == expected
    assert jobs.runs == Counter({10: 1, 11: 1, 12: 1})
    assert await count(database_url, "workflow_status") == 5


async def test_a_retried_batch_recognises_the_rows_it_wrote(database_url: str,
                                                             sharding: bool) -> None:
    """A batch whose reply was lost is run again with the same creator tokens: the rows it
    wrote the first time are reported as its own, not as existing workflows."""
    a, b = keys(sharding)
    jobs = Jobs(database_url, sharding, listen_queues=[])
    async with jobs.dbos as dbos:
        rows = [(NewWorkflow(workflow_id=f"r-{i}", name="job", status="ENQUEUED",
                             inputs='{"positionalArgs": [1], "namedArgs": {}}',
                             executor_id="x", application_version=None, created_at_ms=1,
                             queue_name="jobs", shard_key=key), f"token-{i}")
                for i, key in enumerate((a, b))]
        sysdb = dbos._system_database
        assert [s.created for s in await sysdb.start_workflows(rows)] == [True, True]
        assert [s.created for s in await sysdb.start_workflows(rows)] == [True, True]
        others = [(wf, "another-token") for wf, _ in rows]
        assert [(s.created, s.existing_name) for s in await sysdb.start_workflows(others)] \
            == [(False, "job"), (False, "job")]
        assert await count(database_url, "workflow_input") == 2


async def test_a_batch_from_a_workflow_is_fenced_by_its_owner(database_url: str,
                                                               sharding: bool) -> None:
    """The batch lands only with the parent's checkpoint, while the parent is owned by the
    execution writing it; written once, a second attempt finds the checkpoint."""
    a, _ = keys(sharding)
    jobs = Jobs(database_url, sharding, listen_queues=[])
    async with jobs.dbos as dbos:
        sysdb = dbos._system_database

        def row(workflow_id: str, status: str, queue: str | None) -> NewWorkflow:
            return NewWorkflow(workflow_id=workflow_id, name="job", status=status,
                               inputs='{"positionalArgs": [1], "namedArgs": {}}',
                               executor_id="x", application_version=None, created_at_ms=1,
                               queue_name=queue, shard_key=a, parent_workflow_id=(
                                   "owner" if queue else None))

        await sysdb.start_workflow(row("owner", "PENDING", None), "the-owner")
        children = [(row(f"kid-{i}", "ENQUEUED", "jobs"), f"kid-token-{i}") for i in range(2)]

        def step(owner_xid: str) -> ParentStep:
            return ParentStep("owner", 0, owner_xid, 1, a)

        def output(text: str) -> Callable[[object], Awaitable[str]]:
            async def output_of(_: object) -> str:
                return text
            return output_of

        with pytest.raises(WorkflowConflictError):
            await sysdb.start_workflows_recorded(children, step("a-stale-owner"),
                                                 "DBOS.enqueue_many", output("[]"))
        assert await count(database_url, "workflow_status") == 1
        first = await sysdb.start_workflows_recorded(children, step("the-owner"),
                                                     "DBOS.enqueue_many", output('["x"]'))
        assert isinstance(first, list) and [s.created for s in first] == [True, True]
        again = await sysdb.start_workflows_recorded(children, step("the-owner"),
                                                     "DBOS.enqueue_many", output('["y"]'))
        assert isinstance(again, StepRecord) and again.output == '["x"]'
        assert await count(database_url, "workflow_status") == 3


async def test_client_enqueue_many(database_url: str, sharding: bool) -> None:
    a, b = keys(sharding)
    jobs = Jobs(database_url, sharding)
    async with jobs.dbos, DBOSClient(database_url, sharding=sharding) as client:
        rows = [EnqueueRequest("job", (7,), {"tag": "c"}, workflow_id="c-1", shard_key=a),
                EnqueueRequest("job", (8,), workflow_id="c-2", shard_key=b)]
        results = await client.enqueue_many("jobs", rows)
        assert [r.outcome for r in results] == ["enqueued", "enqueued"]
        assert [await r.handle.get_result() for r in results] == ["c7", "8"]
        assert [r.outcome for r in await client.enqueue_many("jobs", rows)] == [
            "existing", "existing"]
        with pytest.raises(DBOSError, match="names its workflow"):
            await client.enqueue_many("jobs", [EnqueueRequest(jobs.job)])
    assert jobs.runs == Counter({7: 1, 8: 1})


# ---- fork_workflows ----


class Forkable:
    """An executor with a two-step workflow to fork, and a partitioned queue."""

    def __init__(self, url: str, sharding: bool) -> None:
        self.dbos = dbos = new_dbos(url, sharding=sharding)
        self.parts = dbos.queue("parts", partition_queue=True)
        self.runs: Counter[tuple[str, int]] = Counter()

        @dbos.step(name="tick")
        async def tick(tag: str, n: int) -> int:
            self.runs[(tag, n)] += 1
            return n

        @dbos.workflow(name="two")
        async def two(tag: str) -> list[int]:
            return [await tick(tag, 1), await tick(tag, 2)]

        self.two = two

    async def finished(self, workflow_id: str, key: str | None) -> None:
        with Keyed(key), SetWorkflowID(workflow_id):
            handle = await self.dbos.start_workflow(self.two, workflow_id)
        assert await handle.get_result() == [1, 2]


async def test_fork_workflows_forks_all_in_one_transaction(database_url: str,
                                                           sharding: bool) -> None:
    a, b = keys(sharding)
    app = Forkable(database_url, sharding)
    async with app.dbos as dbos:
        await app.finished("w-a", a)
        await app.finished("w-b", b)
        handles = await dbos.fork_workflows(
            [ForkRequest("w-a", 1, "f-a", shard_key=a), ForkRequest("w-b", 0, "f-b", shard_key=b),
             ForkRequest("w-a", 2, shard_key=a)],
            queue=app.parts, queue_partition_key="p-1")
        assert [h.workflow_id for h in handles][:2] == ["f-a", "f-b"]
        assert [h.shard_key for h in handles] == [a, b, a]
        assert [await h.get_result() for h in handles] == [[1, 2], [1, 2], [1, 2]]
        for h in handles:
            status = await h.get_status()
            assert (status.queue_name, status.queue_partition_key) == ("parts", "p-1")
            assert status.forked_from in ("w-a", "w-b")
    # Each fork re-ran only the steps from its start step.
    assert app.runs == Counter({("w-a", 1): 1, ("w-a", 2): 2, ("w-b", 1): 2, ("w-b", 2): 2})


async def test_fork_workflows_refuses_bad_batches_and_writes_nothing(database_url: str,
                                                                     sharding: bool) -> None:
    a, b = keys(sharding)
    app = Forkable(database_url, sharding)
    async with app.dbos as dbos:
        await app.finished("w-a", a)
        await app.finished("w-b", b)
        before = await count(database_url, "workflow_status")
        good = ForkRequest("w-a", 1, "f-good", shard_key=a)
        with pytest.raises(DBOSError, match="non-empty list"):
            await dbos.fork_workflows([])
        with pytest.raises(DBOSError, match="new workflow ID 'twice' twice"):
            await dbos.fork_workflows([ForkRequest("w-a", 0, "twice", shard_key=a),
                                       ForkRequest("w-a", 1, "twice", shard_key=a)])
        with pytest.raises(NonExistentWorkflowError, match="ghost"):
            await dbos.fork_workflows([good, ForkRequest("ghost", 0, shard_key=b)])
        with pytest.raises(DBOSError, match="start_step 5 is out of range"):
            await dbos.fork_workflows([good, ForkRequest("w-b", 5, shard_key=b)])
        with pytest.raises(DBOSError, match="a workflow with that ID exists"):
            await dbos.fork_workflows([good, ForkRequest("w-b", 0, "w-b", shard_key=b)])
        with pytest.raises(DBOSError, match="is partitioned"):
            await dbos.fork_workflows([good], queue="parts")
        with pytest.raises(DBOSError, match="is not partitioned"):
            await dbos.fork_workflows([good], queue_partition_key="p")
        if sharding:
            with pytest.raises(DBOSError, match="needs a shard key"):
                await dbos.fork_workflows([good, ForkRequest("w-b", 0)])
        assert await count(database_url, "workflow_status") == before
        assert await count(database_url, "operation_outputs") == 4
        # The single fork takes the partition key too.
        fork = await dbos.fork_workflow("w-b", 2, queue="parts", queue_partition_key="p-9",
                                        shard_key=b)
        assert (await fork.get_status()).queue_partition_key == "p-9"
        assert await fork.get_result() == [1, 2]


async def test_client_fork_workflows(database_url: str, sharding: bool) -> None:
    a, b = keys(sharding)
    app = Forkable(database_url, sharding)
    async with app.dbos:
        await app.finished("w-a", a)
        await app.finished("w-b", b)
        async with DBOSClient(database_url, sharding=sharding) as client:
            handles = await client.fork_workflows([ForkRequest("w-a", 2, "c-a", shard_key=a),
                                                   ForkRequest("w-b", 2, "c-b", shard_key=b)])
            assert [await h.get_result() for h in handles] == [[1, 2], [1, 2]]
    assert app.runs == Counter({("w-a", 1): 1, ("w-a", 2): 1, ("w-b", 1): 1, ("w-b", 2): 1})


# ---- wait_first over many handles ----


async def test_wait_first_waits_on_many_handles_with_one_waiter(database_url: str,
                                                                sharding: bool) -> None:
    a, b = keys(sharding)
    box = Mailboxes(database_url, sharding)
    async with box.dbos as dbos:
        handles = [await box.start_inbox(f"w-{i}", a if i % 2 else b, 1) for i in range(20)]
        if sharding:  # the same ID under the other key, still waiting
            handles.append(await box.start_inbox("w-7", b, 1))
        dispatcher = dbos._system_database.notifications
        assert dispatcher is not None
        targets = [(WORKFLOW_COMPLETION_CHANNEL, keyed(h.workflow_id, h.shard_key))
                   for h in handles]

        async def completion_waiters() -> set[object]:
            return {w for t in targets for w in dispatcher._waiters.get(t, ())}

        assert await completion_waiters() == set()
        first = asyncio.ensure_future(dbos.wait_first(handles))

        async def one_waiter_for_all() -> bool:
            return all(dispatcher._waiters.get(t) for t in targets) \
                and len(await completion_waiters()) == 1

        # One waiter for all the handles, not a task (and a waiter) per handle.
        await wait_until(one_waiter_for_all, what="wait_first registered")
        assert not first.done()
        await dbos.send("w-7", "go", "mail", shard_key=a if sharding else None)
        assert (await asyncio.wait_for(first, PATIENCE)) is handles[7]
        # A finished one is found at once.
        assert await dbos.wait_first([handles[3], handles[7]]) is handles[7]
        for h in handles:
            if h is not handles[7]:
                await dbos.cancel_workflow(h.workflow_id, shard_key=h.shard_key)


async def test_a_client_wait_first_wakes_on_completion_notifications(
        database_url: str, sharding: bool) -> None:
    a, b = keys(sharding)
    box = Mailboxes(database_url, sharding)
    async with box.dbos as dbos:
        await box.start_inbox("x-1", a, 1)
        await box.start_inbox("x-2", b, 1)
        # Polling once an hour: only the executor's completion notification can wake it.
        async with DBOSClient(database_url, sharding=sharding,
                              result_poll_interval=3600) as client:
            one = await client.retrieve_workflow("x-1", shard_key=a)
            two = await client.retrieve_workflow("x-2", shard_key=b)
            first = asyncio.ensure_future(client.wait_first([one, two]))
            await asyncio.sleep(0)
            await dbos.send("x-2", "go", "mail", shard_key=b)
            assert (await asyncio.wait_for(first, PATIENCE)) is two
        await dbos.cancel_workflow("x-1", shard_key=a)


async def test_wait_first_refuses_bad_handles(database_url: str, sharding: bool) -> None:
    a, _ = keys(sharding)
    box = Mailboxes(database_url, sharding)
    async with box.dbos as dbos:
        handle = await box.start_inbox("y", a, 1)
        with pytest.raises(DBOSError, match="at least one handle"):
            await dbos.wait_first([])
        with pytest.raises(DBOSError, match="workflow 'y' twice"):
            await dbos.wait_first([handle, handle])
        ghost = await dbos.retrieve_workflow("y", shard_key=a)
        await dbos.delete_workflow("y", shard_key=a)
        with pytest.raises(NonExistentWorkflowError, match="'y'"):
            await dbos.wait_first([ghost])


# ---- Large batches ----


async def test_large_batches(database_url: str, sharding: bool) -> None:
    """The columns go as arrays: a batch far past PostgreSQL's 65535-parameter limit for
    one row per parameter set is written whole."""
    a, _ = keys(sharding)
    jobs = Jobs(database_url, sharding, listen_queues=[])
    async with jobs.dbos as dbos:
        results = await dbos.enqueue_many(jobs.queue, [
            EnqueueRequest(jobs.job, (i,), workflow_id=f"big-{i}", shard_key=a)
            for i in range(3000)])
        assert [r.outcome for r in results] == ["enqueued"] * 3000
        await dbos.send_bulk([SendMessage(f"big-{i % 3000}", i, shard_key=a)
                              for i in range(9000)])
    assert await count(database_url, "workflow_status") == 3000
    assert await count(database_url, "notifications") == 9000


class TickStamps:
    """A JSON serializer noting, at each value it writes, how often a ticker task has run
    so far: the rows of a batch serialized between two turns of the event loop share a
    stamp."""

    def __init__(self) -> None:
        self.ticks = 0
        self.stamps: list[int] = []

    async def tick(self, done: asyncio.Event) -> None:
        while not done.is_set():
            self.ticks += 1
            await asyncio.sleep(0)

    def name(self) -> str:
        return "tick_stamped_json"

    def serialize(self, data: Any) -> str:
        self.stamps.append(self.ticks)
        return json.dumps(data)

    def deserialize(self, serialized_data: str) -> Any:
        return json.loads(serialized_data)


BIG = 20_000
"""Rows of a batch several chunks long."""


async def test_a_large_batch_lets_the_event_loop_run(database_url: str) -> None:
    """A batch of many chunks is serialized a chunk at a time, the event loop running
    between chunks (so a task beside it keeps ticking), and still answers as one: a row
    whose deduplication ID a row of an earlier chunk took is reported deduplicated."""
    stamped = TickStamps()
    jobs = Jobs(database_url, False, listen_queues=[], serializer=stamped)
    rows = [EnqueueRequest(jobs.job, (i,), workflow_id=f"big-{i}") for i in range(BIG)]
    rows[0] = EnqueueRequest(jobs.job, (0,), workflow_id="big-0", deduplication_id="d")
    rows[-1] = EnqueueRequest(jobs.job, (BIG,), workflow_id="late", deduplication_id="d")
    async with jobs.dbos as dbos:
        done = asyncio.Event()
        ticker = asyncio.create_task(stamped.tick(done))
        try:
            results = await dbos.enqueue_many(jobs.queue, rows)
        finally:
            done.set()
            await ticker
    assert len(stamped.stamps) == BIG
    # Serialized in one go, every row would carry one stamp.
    assert len(set(stamped.stamps)) > BIG // CHUNK_ROWS // 2
    assert [r.outcome for r in results[:-1]] == ["enqueued"] * (BIG - 1)
    assert (results[-1].outcome, results[-1].workflow_id) == ("deduplicated", "big-0")
    assert await count(database_url, "workflow_status") == BIG - 1
    assert await count(database_url, "workflow_input") == BIG - 1


async def test_a_large_batch_refused_at_its_end_writes_nothing(database_url: str,
                                                               sharding: bool) -> None:
    """The chunks of a batch are written in one transaction: an ID another workflow name
    uses, met by the last statement, rolls back the rows the earlier ones inserted."""
    a, _ = keys(sharding)
    jobs = Jobs(database_url, sharding, listen_queues=[])
    async with jobs.dbos as dbos:
        with Keyed(a), SetWorkflowID("taken"):
            await dbos.start_workflow(jobs.other)
        rows = [EnqueueRequest(jobs.job, (i,), workflow_id=f"big-{i}", shard_key=a)
                for i in range(BIG - 1)]
        rows.append(EnqueueRequest(jobs.job, (BIG,), workflow_id="taken", shard_key=a))
        with pytest.raises(DBOSError, match="'taken' is already used by workflow 'other'"):
            await dbos.enqueue_many(jobs.queue, rows)
        assert await count(database_url, "workflow_status") == 1
        assert await count(database_url, "workflow_input") == 1
        # Without the bad row the same rows land whole.
        results = await dbos.enqueue_many(jobs.queue, rows[:-1])
        assert {r.outcome for r in results} == {"enqueued"}
    assert await count(database_url, "workflow_status") == BIG


async def test_a_large_batch_from_a_workflow_is_one_checkpoint(database_url: str) -> None:
    """The checkpoint of a batch of several chunks records every row's result, and a
    replay returns them all as the first run did."""
    jobs = Jobs(database_url, False, listen_queues=[])
    rows = CHUNK_ROWS * 2 + 500

    @jobs.dbos.workflow(name="bulk")
    async def bulk() -> list[list[str]]:
        results = await jobs.dbos.enqueue_many(jobs.queue, [
            EnqueueRequest(jobs.job, (i,), deduplication_id="d" if i in (0, rows - 1) else None)
            for i in range(rows)])
        return [[r.workflow_id, r.outcome] for r in results]

    async with jobs.dbos as dbos:
        with SetWorkflowID("bulk"):
            first = await (await dbos.start_workflow(bulk)).get_result()
        fork = await dbos.fork_workflow("bulk", 1, new_workflow_id="bulk-again")
        assert await fork.get_result() == first
    assert first[:2] == [["bulk-0-0", "enqueued"], ["bulk-0-1", "enqueued"]]
    assert first[-1] == ["bulk-0-0", "deduplicated"]
    assert [outcome for _, outcome in first].count("enqueued") == rows - 1
    # The rows once, and the two runs of the parent.
    assert await count(database_url, "workflow_status") == rows - 1 + 2
