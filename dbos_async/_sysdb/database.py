"""The system database: an asyncpg pool and every operation on workflow rows.

It stores and returns strings; serialization and types belong to the executor. The
workflows' own statements (start, steps, outcome) are here; each other feature's are a
family of their own, joined here as mixins: messaging (:mod:`dbos_async._sysdb.messaging`),
recovery (:mod:`dbos_async._sysdb.recovery`), management (:mod:`dbos_async._sysdb.management`),
queues, schedules, transfer, observability, and the write path
(:mod:`dbos_async._sysdb.writes`: fenced writes, group commit, the Citus forms).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Hashable, Mapping, Sequence
from typing import Any, TypeVar

import asyncpg

from dbos_async._sysdb.application import (
    Connection,
    IsolationLevel,
    OpenTransaction,
    transaction,
)
from dbos_async._sysdb.chunks import CHUNK_ROWS, spans
from dbos_async._sysdb.connection import parsed_url
from dbos_async._sysdb.management.admin import AdminOperations
from dbos_async._sysdb.management.operations import JobConnection, WorkflowOperations
from dbos_async._sysdb.messaging import MessagingOperations
from dbos_async._sysdb.notifications import (
    ENQUEUE_CHANNEL,
    NOTIFICATIONS_CHANNEL,
    WORKFLOW_COMPLETION_CHANNEL,
    keyed,
)
from dbos_async._sysdb.observability import ObservabilityOperations
from dbos_async._sysdb.queues import QueueOperations
from dbos_async._sysdb.records import (
    BatchStart,
    Outcome,
    StartResult,
    StatusRecord,
    StepRecord,
    WorkflowRow,
    status_record,
    workflow_row,
)
from dbos_async._sysdb.recovery import RecoveryOperations
from dbos_async._sysdb.schedules import ScheduleOperations
from dbos_async._sysdb.shard_keys import (
    WorkflowAddress,
    bind_shard_keys,
    by_key,
    shard_key_scope,
)
from dbos_async._sysdb.statements import (
    CANCELLED,
    ERROR,
    PENDING,
    PORTABLE_JSON,
    SUCCESS,
    Checkpoint,
    FinalOutcome,
    NewWorkflow,
    ParentStep,
    Payload,
    Query,
)
from dbos_async._sysdb.transfer import TransferOperations
from dbos_async._sysdb.writes.fenced import (
    FencedWrites,
    Keyed,
    KeyGroup,
    batch_verdicts,
    keys_given,
    programs_landed,
)
from dbos_async._sysdb.writes.group_commit import GroupCommit
from dbos_async._sysdb.writes.routed import MAP_DUE, RoutedWrites, Row
from dbos_async.errors import (
    DBOSError,
    NonExistentWorkflowError,
    WorkflowCancelledError,
    WorkflowConflictError,
    workflow_id_taken,
)

__all__ = [
    "BatchStart",
    "Outcome",
    "StartResult",
    "StepRecord",
    "SystemDatabase",
    "WorkflowRow",
]


logger = logging.getLogger("dbos_async")

T = TypeVar("T")

def _with_child_key(key: str, r: Checkpoint) -> Checkpoint:
    """``r`` naming its child's key: the parent's (``key``) unless it names another, as a
    batch of one key's scope reads it."""
    if r.child_workflow_id is None or r.child_shard_key is not None:
        return r
    return r._replace(child_shard_key=key)


def _started_in_batch(rows: Sequence[tuple[NewWorkflow, str]],
                      found: Mapping[str | None, Sequence[Row] | Exception]
                      ) -> list[StartResult | BaseException]:
    """Per start of a batch, its row as the batch's statement returned it (under its key
    and ID), or the error that ended the batch."""
    returned = {(r["shard_key"], r["workflow_uuid"]): r for outcome in found.values()
                if not isinstance(outcome, Exception) for r in outcome}
    started: list[StartResult | BaseException] = []
    for wf, xid in rows:
        outcome = found[wf.shard_key]
        if isinstance(outcome, Exception):
            started.append(outcome)
            continue
        row = returned[(wf.shard_key, wf.workflow_id)]
        started.append(StartResult(workflow_row(row), row["creator_xid"] == xid))
    return started


def _refuse_taken_ids(rows: Sequence[tuple[NewWorkflow, str]], indexes: Sequence[int],
                      found: Sequence[Row]) -> None:
    """Raise if a row's ID belongs to another workflow name (the statement then inserted
    nothing)."""
    for i, r in zip(indexes, found, strict=True):
        wf = rows[i][0]
        if r["existing_name"] is not None and r["existing_name"] != wf.name and not r["ours"]:
            raise workflow_id_taken(wf.workflow_id, r["existing_name"], wf.name)


_CREATED = BatchStart(True)
"""The verdict of every row a batch wrote (frozen: one object serves them all, which a
batch of many thousand rows feels in its memory and its garbage collections)."""

HoldersCreated = dict[tuple[str | None, str], tuple[str, str]]
"""Rows of a batch that took a deduplication ID, by key and ID: their workflow IDs and
names (holders a statement's snapshot does not show to the rows it inserts alongside)."""


def _batch_start(wf: NewWorkflow, r: Row, created: HoldersCreated) -> BatchStart | None:
    """What became of a batch's row, by its statement's reply ``r``; None if the holder
    of its deduplication ID finished before it could be read. A row that took a
    deduplication ID joins ``created``."""
    dedup = (wf.shard_key, wf.deduplication_id or "")
    if r["inserted"] or r["ours"]:
        if wf.deduplication_id is not None:
            created[dedup] = (wf.workflow_id, wf.name)
        return _CREATED
    if r["existing_name"] is not None:
        return BatchStart(False, existing_name=r["existing_name"])
    if r["holder_id"] is not None:
        return BatchStart(False, holder=(r["holder_id"], r["holder_name"]))
    return BatchStart(False, holder=created[dedup]) if dedup in created else None


class _NotRecorded(Exception):
    """The parent's checkpoint of a batch did not land: roll the batch back."""


class SystemDatabase(MessagingOperations, FencedWrites, RecoveryOperations, RoutedWrites,
                     WorkflowOperations, QueueOperations, ScheduleOperations, AdminOperations,
                     TransferOperations, ObservabilityOperations):
    """Every statement of the system database, run on one asyncpg pool with retries."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Group commit of the writes every workflow makes (see group_commit): one lane per
        # kind (and per shard key on Citus, see _lane).
        self._checkpoints = GroupCommit[Keyed[Checkpoint], bool](self._write_checkpoints)
        self._outcomes = GroupCommit[Keyed[FinalOutcome], bool](self._write_outcomes)
        self._starts = GroupCommit[tuple[NewWorkflow, str], StartResult](self._write_starts)


    async def dequeue_scopes(self, queue_name: str) -> list[str]:
        """The shard keys with ENQUEUED work on the queue (sharded databases). On Citus,
        read from each node's own shards, so a node out of reach hides only its own keys
        (see :meth:`~dbos_async._sysdb.writes.routed.RoutedWrites._read_each_node`)."""
        if not self.routes_single_tables:
            return await super().dequeue_scopes(queue_name)
        rows = await self._read_each_node(
            lambda shard_ids: self.sql.dequeue_scopes_on_shards(queue_name, shard_ids),
            "reading dequeue scopes")
        return [row["shard_key"] for row in rows]
    async def close(self) -> None:
        await self._starts.aclose()
        await self._checkpoints.aclose()
        await self._outcomes.aclose()
        await super().close()

    # ---- Workflows ----

    async def start_workflow(
        self, wf: NewWorkflow, creator_xid: str, parent: ParentStep | None = None, *,
        reject: bool = False,
    ) -> StartResult:
        """Insert a workflow (or find the existing one with its ID), in one round trip.

        Safe to retry: a row carrying our creator token is ours even if the first attempt's
        reply was lost. With ``reject`` (the reuse policy "reject") finding another start's
        row raises :class:`WorkflowIDInUseError`; a child's is then refused in the
        transaction of the parent's checkpoint, which it rolls back.
        """
        if parent is not None and reject:
            return await self._start_child_across(wf, creator_xid, parent, reject=True)
        started = await self._start_any(wf, creator_xid, parent)
        if reject:
            started.refuse_reuse()
        return started

    async def _start_any(self, wf: NewWorkflow, creator_xid: str,
                         parent: ParentStep | None) -> StartResult:
        if parent is None and wf.deduplication_id is None:
            return await self._starts.submit((await self._lane(wf.shard_key),
                                              self.sql.status_shape(wf)), (wf, creator_xid))
        if parent is not None and (self.routes_single_tables
                                   or (self.sharded and parent.shard_key != wf.shard_key)):
            return await self._start_child_across(wf, creator_xid, parent)
        if self.routes_single_tables:
            return await self._start_routed(wf, creator_xid)
        return await self._start_one(wf, creator_xid, parent)

    async def _start_one(self, wf: NewWorkflow, creator_xid: str,
                         parent: ParentStep | None = None) -> StartResult:
        query = self.sql.insert_workflow(wf, creator_xid, parent)
        row = await self._fetchrow(query, f"starting workflow {wf.workflow_id}")
        if row is None:
            raise RuntimeError(f"Inserting workflow {wf.workflow_id} returned no row")
        if parent is not None and row["workflow_uuid"] is None:
            # The fence refused the insert: the parent was cancelled or handed to another owner.
            if row["parent_status"] == CANCELLED:
                raise WorkflowCancelledError(parent.workflow_id)
            raise WorkflowConflictError(parent.workflow_id)
        return StartResult(workflow_row(row), row["creator_xid"] == creator_xid)

    async def _write_starts(self, lane: Hashable, rows: Sequence[tuple[NewWorkflow, str]]
                           ) -> list[StartResult | BaseException]:
        """One group-commit batch of parentless starts of one shape (see
        :meth:`start_workflow`): one statement per key. One row, and every row whose
        workflow an earlier row of the batch names, goes alone with :meth:`_start_one`; so
        does every row of a key's statement the database refuses, so one bad row is the
        only one to fail."""
        if self.routes_single_tables:
            return await self._write_starts_routed(rows)
        firsts: dict[WorkflowAddress, int] = {}
        for i, (wf, _) in enumerate(rows):
            firsts.setdefault(WorkflowAddress(wf.workflow_id, wf.shard_key), i)
        if len(firsts) < 2:
            return [await self._start_alone(wf, xid) for wf, xid in rows]
        batch = [rows[i] for i in firsts.values()]
        groups, statements = self._per_key(
            [(wf.shard_key, (wf, xid)) for wf, xid in batch],
            lambda key, row: self.templates.query("insert_workflow", self.sql.insert_workflow,
                                                  *row, exact=("status",)),
            lambda key, group: self.sql.start_batch(group, key))
        found = await self._fetch_per_key(statements, f"starting {len(batch)} workflows")
        started: dict[int, StartResult | BaseException] = {}
        for indexes, key in groups:
            outcome = found[key]
            if isinstance(outcome, asyncpg.PostgresError):
                for i in indexes:  # refused: each alone, so a bad row fails alone
                    started[i] = await self._start_alone(*batch[i])
            elif isinstance(outcome, Exception):
                started.update((i, outcome) for i in indexes)
            else:
                for i, r in zip(indexes, outcome, strict=True):
                    started[i] = StartResult(workflow_row(r), r["creator_xid"] == batch[i][1])
        results = [started[i] for i in range(len(batch))]
        for i, (wf, xid) in enumerate(rows):
            if firsts[WorkflowAddress(wf.workflow_id, wf.shard_key)] != i:
                results.insert(i, await self._start_alone(wf, xid))
        return results

    async def _write_starts_routed(self, rows: Sequence[tuple[NewWorkflow, str]]
                                   ) -> list[StartResult | BaseException]:
        """:meth:`_write_starts` on Citus: one statement for the node's batch (see
        ``_batch_on_shards``); where it cannot serve (a row without a key, an ID twice, a
        statement refused), one program per start, all in one round trip."""
        keys = [wf.shard_key for wf, _ in rows]
        distinct = len({WorkflowAddress(wf.workflow_id, wf.shard_key) for wf, _ in rows})
        given = keys_given([(key, None) for key in keys])
        if given is not None and distinct == len(rows):
            columns = self.sql.start_columns(rows)
            batch = await self._batch_on_shards(
                given, lambda indexes, p, prefix: self.sql.start_batch_parts(
                    [rows[i] for i in indexes], [given[i] for i in indexes], p, prefix,
                    columns),
                f"starting {len(rows)} workflows")
            if batch is not None:
                return _started_in_batch(rows, batch)
        programs = [(WorkflowAddress(wf.workflow_id, wf.shard_key), self._start_program(wf, xid))
                    for wf, xid in rows]
        found = await self._routed_many(programs, f"starting {len(rows)} workflows")
        started: list[StartResult | BaseException] = []
        for (wf, xid), results in zip(rows, found, strict=True):
            if isinstance(results, asyncpg.PostgresError):
                refused = DBOSError(f"The system database refused to start workflow "
                                    f"{wf.workflow_id!r}: {results}")
                refused.__cause__ = results
                started.append(refused)
            elif isinstance(results, Exception):
                started.append(results)
            else:
                started.append(self._started(results, xid))
        return started

    async def _start_alone(self, wf: NewWorkflow, creator_xid: str
                           ) -> StartResult | BaseException:
        """:meth:`_start_one` for one row of a batch: its error is its own verdict."""
        try:
            return await self._start_one(wf, creator_xid)
        except asyncpg.PostgresError as error:
            refused = DBOSError(f"The system database refused to start workflow "
                                f"{wf.workflow_id!r}: {error}")
            refused.__cause__ = error
            return refused
        except Exception as error:
            return error

    async def start_workflows(self, rows: Sequence[tuple[NewWorkflow, str]]
                              ) -> list[BatchStart]:
        """Insert a batch of workflows (each with its creator token): one statement per
        shard key, in one transaction, so the batch lands whole or, if one ID belongs to
        another workflow name (raised naming it), not at all. Returns one
        :class:`BatchStart` per row, in order. A row whose deduplication ID another row of
        the batch took reports that row as its holder; one whose holder finished before it
        could be read is inserted again."""

        async def run(groups: Sequence[KeyGroup]) -> list[Sequence[Row]]:
            return await self._retried("enqueueing workflows",
                                       functools.partial(self._insert_batches, rows, groups))

        return await self._classified(rows, run)

    async def start_workflows_recorded(
        self, rows: Sequence[tuple[NewWorkflow, str]], parent: ParentStep,
        function_name: str, output_of: Callable[[list[BatchStart]], Awaitable[str]],
    ) -> list[BatchStart] | StepRecord:
        """:meth:`start_workflows` from a workflow body: the batch and the parent's
        checkpoint (its output what ``output_of`` makes of the results, awaited so a large
        batch's can be encoded a chunk at a time) in one transaction, fenced by
        the parent's ownership, so a replay finds the checkpoint instead of enqueueing
        again. Returns the checkpoint already recorded if one was (nothing is written
        then)."""
        parent_ref = WorkflowAddress(parent.workflow_id, parent.shard_key)

        async def attempt() -> list[BatchStart]:
            async with self.locking_transaction() as conn:

                async def run(groups: Sequence[KeyGroup]) -> list[Sequence[Row]]:
                    return await self._insert_on(conn, rows, groups)

                # The rows name their parent, whose key is the parent's own.
                with bind_shard_keys({parent.workflow_id: parent.shard_key}):
                    results = await self._classified(rows, run)
                output = await output_of(results)
                with parent_ref.routed():
                    q = self.sql.record_step(parent.workflow_id, parent.function_id,
                                             function_name, parent.owner_xid, output, None,
                                             parent.started_at_ms, self.clock.now_ms())
                if await conn.fetchrow(q.sql, *q.params) is None:
                    raise _NotRecorded  # rolls the batch back
                return results

        try:
            return await self._retried("enqueueing workflows", attempt)
        except _NotRecorded:
            pass
        with parent_ref.routed():
            verdict = await self._fetchrow(
                self.sql.fence_verdict(parent.workflow_id, parent.owner_xid),
                "enqueueing workflows")
            record = await self._recorded_or_existing(verdict, parent.workflow_id,
                                                      parent.function_id, function_name)
        assert record is not None, "a fenced write that landed nothing finds the record"
        return record

    async def _classified(
        self, rows: Sequence[tuple[NewWorkflow, str]],
        run: Callable[[Sequence[KeyGroup]], Awaitable[list[Sequence[Row]]]],
    ) -> list[BatchStart]:
        """Insert the rows (``run`` inserts each key's group) and tell what became
        of each; rows whose deduplication holder finished before it could be read are
        inserted again."""
        results: list[BatchStart | None] = [None] * len(rows)
        created: HoldersCreated = {}
        pending = list(range(len(rows)))
        for _ in range(10):
            per_key = [(indexes, key) for key, indexes
                       in by_key((rows[i][0].shard_key, i) for i in pending).items()]
            fetched = await run(per_key)
            pending = []
            for (indexes, _), found in zip(per_key, fetched, strict=True):
                async for span in spans(len(indexes)):
                    for n in span:
                        start = _batch_start(rows[indexes[n]][0], found[n], created)
                        if start is None:
                            pending.append(indexes[n])  # its holder finished: insert again
                        else:
                            results[indexes[n]] = start
            if not pending:
                return [r for r in results if r is not None]
        raise DBOSError("Enqueueing the batch kept meeting deduplication IDs whose holders "
                        "finished; retry it")

    async def _insert_batches(self, rows: Sequence[tuple[NewWorkflow, str]],
                              groups: Sequence[KeyGroup]) -> list[Sequence[Row]]:
        """Insert the batch's groups: a batch of one key and at most :data:`CHUNK_ROWS`
        rows in one statement, any other in one transaction (see :meth:`_insert_on`)."""
        if len(groups) == 1 and len(groups[0][0]) <= CHUNK_ROWS \
                and not self.routes_single_tables:
            indexes, key = groups[0]
            q = self._insert_statement(rows, indexes, key)
            found = await self.pool.fetch(q.sql, *q.params)
            _refuse_taken_ids(rows, indexes, found)
            return [found]
        async with self.locking_transaction() as conn:
            return await self._insert_on(conn, rows, groups)

    async def _insert_on(self, conn: JobConnection, rows: Sequence[tuple[NewWorkflow, str]],
                         groups: Sequence[KeyGroup]) -> list[Sequence[Row]]:
        """Insert a batch's groups in the caller's transaction, a statement per key and
        per :data:`CHUNK_ROWS` rows (so none takes long to build or encode, and the event
        loop runs while each is executed); a taken ID rolls it back. A chunk's statement
        sees the rows the chunks before it inserted: a row whose deduplication ID one of
        them took finds it as its holder."""
        batches: list[Sequence[Row]] = []
        for indexes, key in groups:
            found: list[Row] = []
            for start in range(0, len(indexes), CHUNK_ROWS):
                found.extend(await self._insert_chunk(conn, rows,
                                                      indexes[start:start + CHUNK_ROWS], key))
            batches.append(found)
        return batches

    async def _insert_chunk(self, conn: JobConnection, rows: Sequence[tuple[NewWorkflow, str]],
                            indexes: list[int], key: str | None) -> Sequence[Row]:
        """Insert rows of one key (on a database that routes single-table statements, a
        statement per table); raise if an ID belongs to another workflow name."""
        found: Sequence[Row]
        if self.routes_single_tables:
            found = await self._insert_workflows_routed(conn, [rows[i] for i in indexes], key)
        else:
            q = self._insert_statement(rows, indexes, key)
            found = await conn.fetch(q.sql, *q.params)
        _refuse_taken_ids(rows, indexes, found)
        return found

    def _insert_statement(self, rows: Sequence[tuple[NewWorkflow, str]], indexes: list[int],
                          key: str | None) -> Query:
        """The one statement inserting a key's rows."""
        with shard_key_scope(key):
            return self.sql.insert_workflows([rows[i] for i in indexes], key)

    async def start_workflow_on(self, conn: asyncpg.Connection | JobConnection, wf: NewWorkflow,
                                creator_xid: str, *, announce: tuple[str, str]) -> StartResult:
        """Insert a workflow on the caller's connection, in a savepoint of the caller's
        transaction (so a duplicate does not abort it), with its ``announce`` notification
        (channel, payload) queued in that transaction, unless the enqueue trigger queues it
        there already; not retried, since the transaction is the caller's."""
        async with conn.transaction():
            started = await self._start_on(conn, wf, creator_xid)
            if started.created and not (self.enqueue_trigger
                                        and announce[0] == ENQUEUE_CHANNEL):
                q = self.sql.notify_with_transaction(*announce)
                await conn.execute(q.sql, *q.params)
        return started

    async def _start_on(self, conn: asyncpg.Connection | JobConnection, wf: NewWorkflow,
                         creator_xid: str, parent_shard_key: str | None = None) -> StartResult:
        """Insert a workflow in the caller's transaction, one table per statement (each one
        task on the key's shard): its row, then its inputs if this call created it."""
        q = self.sql.insert_status(wf, creator_xid, parent_shard_key)
        row = await conn.fetchrow(q.sql, *q.params)
        if row is None:
            raise RuntimeError(f"Inserting workflow {wf.workflow_id} returned no row")
        started = StartResult(workflow_row(row), row["creator_xid"] == creator_xid)
        if started.created:
            q = self.sql.insert_inputs(wf)
            await conn.execute(q.sql, *q.params)
        return started

    async def _start_routed(self, wf: NewWorkflow, creator_xid: str) -> StartResult:
        """:meth:`start_workflow` of one workflow on Citus (one with a deduplication ID, see
        :meth:`_start_program`): one round trip."""
        program = self._start_program(wf, creator_xid)
        results = await self._routed(wf.shard_key, program, f"starting workflow {wf.workflow_id}")
        return self._started(results, creator_xid)

    async def _start_child_across(self, wf: NewWorkflow, creator_xid: str,
                                  parent: ParentStep, *, reject: bool = False) -> StartResult:
        """A child under another shard key than its parent's (or any child, when it refuses
        an ID in use): the parent's checkpoint of the start, fenced by the parent's owner,
        and the child's row, one statement per key in one transaction, so neither lands
        without the other. Each statement is built under its own key alone: the child may
        have the parent's ID."""
        with WorkflowAddress(parent.workflow_id, parent.shard_key).routed():
            checkpoint = self.sql.record_step(
                parent.workflow_id, parent.function_id, wf.name, parent.owner_xid, None, None,
                parent.started_at_ms, parent.started_at_ms, wf.workflow_id, wf.shard_key)
            verdict = self.sql.fence_verdict(parent.workflow_id, parent.owner_xid)

        async def attempt() -> StartResult:
            async with self.locking_transaction() as conn:
                if await conn.fetchrow(checkpoint.sql, *checkpoint.params) is None:
                    row = await conn.fetchrow(verdict.sql, *verdict.params)
                    if row is None or not row["owned"] or row["status"] != PENDING:
                        # The fence refused: the parent was cancelled or handed to another owner.
                        if row is not None and row["status"] == CANCELLED:
                            raise WorkflowCancelledError(parent.workflow_id)
                        raise WorkflowConflictError(parent.workflow_id)
                    # Recorded by an attempt whose reply was lost: the child's row follows.
                started = await self._start_on(conn, wf, creator_xid, parent.shard_key)
                if reject:
                    started.refuse_reuse()  # rolls the checkpoint back
                return started

        return await self._retried(f"starting workflow {wf.workflow_id}", attempt)

    async def fire_schedule(self, schedule_name: str | None, fired_at: str, fired_epoch_ms: int,
                            wf: NewWorkflow, creator_xid: str, *,
                            announce: tuple[str, str]) -> StartResult:
        """Start a schedule's workflow for one fired time and record the time as fired, in
        one transaction: a time is fired exactly when its workflow exists (a second firer
        finds the row under the same ID and starts nothing). No ``schedule_name``: record
        nothing (a run triggered by hand)."""

        async def run() -> StartResult:
            async with self.locking_transaction() as conn:
                started = await self.start_workflow_on(conn, wf, creator_xid,
                                                       announce=announce)
                if schedule_name is not None:
                    q = self.sql.advance_last_fired(schedule_name, fired_at, fired_epoch_ms)
                    await conn.execute(q.sql, *q.params)
                return started

        return await self._retried("firing a schedule", run)

    async def send_on(self, conn: asyncpg.Connection, destination_id: str, message_uuid: str,
                      topic: str, message: Payload) -> None:
        """Insert a message on the caller's connection (see :meth:`send`). On a sharded
        schema, which has no trigger to notify the receiver, the notification is queued in
        the caller's transaction too."""
        q = self.sql.send_message(destination_id, message_uuid, topic, message)
        try:
            await conn.execute(q.sql, *q.params)
        except asyncpg.ForeignKeyViolationError:
            raise NonExistentWorkflowError(destination_id) from None
        if self.sharded:
            q = self.sql.notify_with_transaction(NOTIFICATIONS_CHANNEL,
                                                 self.waiter_key(destination_id, topic))
            await conn.execute(q.sql, *q.params)

    async def load_checkpoints(self, workflow_id: str) -> dict[int, StepRecord]:
        rows = await self._fetch(self.sql.load_checkpoints(workflow_id), "loading checkpoints")
        return {row["function_id"]: StepRecord(**dict(row)) for row in rows}

    async def record_step(
        self,
        workflow_id: str,
        function_id: int,
        function_name: str,
        owner_xid: str,
        *,
        output: str | None,
        error: str | None,
        started_at_ms: int,
        completed_at_ms: int,
        child_workflow_id: str | None = None,
        serialization: str = PORTABLE_JSON,
    ) -> StepRecord | None:
        """Checkpoint a step (``serialization``: the format of its output or error);
        returns the existing record if one was already there.

        Raises :class:`WorkflowCancelledError` if the workflow was cancelled and
        :class:`WorkflowConflictError` if this execution no longer owns it.
        """
        child_key = self.sql.key_hint(child_workflow_id) if child_workflow_id else None
        row = Checkpoint(workflow_id, function_id, function_name, owner_xid, output, error,
                         started_at_ms, completed_at_ms, child_workflow_id, child_key,
                         serialization)
        key = self.sql.key_hint(workflow_id)
        if await self._checkpoints.submit(await self._lane(key), (key, row)):
            return None
        what = f"checkpointing step {function_id} of {workflow_id}"
        verdict = await self._fetchrow(self.sql.fence_verdict(workflow_id, owner_xid), what)
        return await self._recorded_or_existing(verdict, workflow_id, function_id, function_name)

    # ---- Transactions (see dbos_async/_executor/transactions.py) ----

    def transaction(self, isolation: IsolationLevel, read_only: bool
                    ) -> contextlib.AbstractAsyncContextManager[OpenTransaction]:
        """A user's transaction on the system database's pool (its checkpoint is then
        recorded in it with :meth:`record_step_on`), bounded by ``idle_transaction_timeout``
        from its start: a frozen process holding row locks of the user's tables (the pool's
        sessions are not bounded) loses them with its session."""
        if self.routes_single_tables:
            raise DBOSError("Transactions on the system database are not supported on Citus "
                            "(its checkpoint would span shards): use an application database")
        bound = self.idle_transaction_timeout_ms
        return transaction(self.pool, isolation, read_only, self._described,
                           self.sql.idle_transaction_timeout(bound) if bound > 0 else None)

    @property
    def _described(self) -> str:
        """The system database, in words, for a transaction's errors."""
        return f"the system database {parsed_url(self.url).describe()}"

    async def record_step_on(self, conn: Connection, row: Checkpoint) -> bool:
        """Record a step's checkpoint in the caller's transaction, fenced as
        :meth:`record_step` is, the workflow's status row locked until that transaction
        ends (and bounded by ``idle_transaction_timeout``, so a frozen caller cannot keep
        it); whether it landed (if not, roll back and ask :meth:`why_not_recorded`)."""
        q = self.sql.record_step(row.workflow_id, row.function_id, row.function_name,
                                 row.owner_xid, row.output, row.error, row.started_at_ms,
                                 row.completed_at_ms, serialization=row.serialization,
                                 hold_ms=self.idle_transaction_timeout_ms or None)
        return await conn.fetchrow(q.sql, *q.params) is not None

    @contextlib.asynccontextmanager
    async def holding_fence(self, row: Checkpoint) -> AsyncIterator[bool]:
        """Record a step's checkpoint in a transaction of its own that keeps the workflow's
        status row locked for the block (no hand-off commits meanwhile); whether it landed.
        Committed when the block ends if it did, else rolled back."""
        async with transaction(self.pool, "READ COMMITTED", False, self._described) as tx:
            landed = await self.record_step_on(tx.conn, row)
            yield landed
            if landed:
                await tx.commit()

    async def why_not_recorded(self, row: Checkpoint) -> StepRecord:
        """After a checkpoint of :meth:`record_step_on` did not land: raise if the workflow
        is gone, cancelled or owned elsewhere, else return the record already there."""
        what = f"checkpointing step {row.function_id} of {row.workflow_id}"
        verdict = await self._fetchrow(self.sql.fence_verdict(row.workflow_id, row.owner_xid),
                                       what)
        record = await self._recorded_or_existing(verdict, row.workflow_id, row.function_id,
                                                  row.function_name)
        if record is None:
            raise RuntimeError(f"Step {row.function_id} of {row.workflow_id}: the fence "
                               "refused nothing, yet nothing was recorded")
        return record

    async def _write_checkpoints(self, lane: Hashable, rows: Sequence[Keyed[Checkpoint]]
                                 ) -> list[bool | BaseException]:
        """One group-commit batch of checkpoints, one statement per key: whether each
        landed."""

        def one(key: str | None, r: Checkpoint) -> Query:
            with WorkflowAddress(r.workflow_id, key).routed():
                return self.sql.record_step(r.workflow_id, r.function_id, r.function_name,
                                            r.owner_xid, r.output, r.error, r.started_at_ms,
                                            r.completed_at_ms, r.child_workflow_id,
                                            r.child_shard_key, r.serialization)

        what = (f"checkpointing step {rows[0][1].function_id} of {rows[0][1].workflow_id}"
                if len(rows) == 1 else f"checkpointing {len(rows)} steps")
        def of_row(key: str | None, r: Checkpoint) -> Hashable:
            return key, r.workflow_id, r.function_id

        def of_record(r: Row) -> Hashable:
            return r.get("shard_key"), r["workflow_uuid"], r["function_id"]

        if self.routes_single_tables:
            keys = keys_given(rows)
            found = None if keys is None else await self._batch_on_shards(
                keys, lambda indexes, p, prefix: self.sql.record_steps_parts(
                    [_with_child_key(keys[i], rows[i][1]) for i in indexes],
                    [keys[i] for i in indexes], p, prefix), what)
            if found is not None:
                return batch_verdicts(rows, found, of_row, of_record)
            programs = []
            for key, r in rows:
                address = WorkflowAddress(r.workflow_id, key)
                with address.routed():
                    programs.append((address, self._checkpoint_program(r)))
            return programs_landed(programs, await self._routed_many(programs, what))
        _, statements = self._per_key(
            rows, lambda key, r: self.templates.query("record_step", one, key, r),
            lambda key, group: self.sql.record_steps(group))
        found = await self._fetch_per_key(statements, what)
        return batch_verdicts(rows, found, of_row, of_record)

    async def record_outcome(
        self,
        workflow_id: str,
        owner_xid: str,
        *,
        output: str | None = None,
        error: str | None = None,
    ) -> bool:
        """Record SUCCESS (no error) or ERROR; False if this execution no longer owned it.

        A recorded outcome is announced on the completion channel as soon as its batch has
        committed, before any caller of the batch continues."""
        key, row = self._outcome_row(workflow_id, owner_xid, output, error)
        return await self._outcomes.submit(await self._lane(key), (key, row))

    def outcome_handed_over(self, workflow_id: str, owner_xid: str, *,
                            output: str | None = None, error: str | None = None
                            ) -> asyncio.Future[bool] | None:
        """:meth:`record_outcome` without waiting, for a caller with nothing else to do
        until it lands: the future of its verdict. None where the write's lane, a Citus
        node, takes a read of the shard map to find (it is due to be read again): await
        :meth:`record_outcome` there."""
        key, row = self._outcome_row(workflow_id, owner_xid, output, error)
        lane = self.known_node_of(key)  # the lane (see _lane), if known without a read
        if lane is MAP_DUE:
            return None
        return self._outcomes.enqueue(lane, (key, row))

    async def outcomes_written(self, grace: float) -> None:
        """Wait for the outcomes handed over (:meth:`outcome_handed_over`) to be written,
        for at most ``grace`` seconds; then stop the writes left (as a workflow's own
        wait for its write is stopped by the executor's shutdown)."""
        await self._outcomes.aclose(grace)

    def _outcome_row(self, workflow_id: str, owner_xid: str, output: str | None,
                     error: str | None) -> Keyed[FinalOutcome]:
        status = ERROR if error is not None else SUCCESS
        return self.sql.key_hint(workflow_id), FinalOutcome(workflow_id, status, owner_xid,
                                                            output, error)

    async def _write_outcomes(self, lane: Hashable, rows: Sequence[Keyed[FinalOutcome]]
                              ) -> list[bool | BaseException]:
        """One group-commit batch of outcomes, one statement per key (on Citus, per
        shard: see routed): whether each was recorded. A batch naming a workflow twice goes
        row by row; on Citus, where no shard can be named, one program per outcome."""
        verdicts: list[bool | BaseException]
        at = self.clock.now_ms()
        keys = keys_given(rows) if self.routes_single_tables else None
        distinct = len({(key, r.workflow_id) for key, r in rows}) == len(rows)
        found = None
        if keys is not None and distinct:
            found = await self._batch_on_shards(
                keys, lambda indexes, p, prefix: self.sql.record_outcomes_parts(
                    [rows[i][1] for i in indexes], at, [keys[i] for i in indexes], p, prefix),
                f"recording {len(rows)} outcomes")
        if found is None and self.routes_single_tables:
            programs = []
            for key, r in rows:
                address = WorkflowAddress(r.workflow_id, key)
                with address.routed():
                    programs.append((address, self._outcome_program(r, at)))
            what = f"recording {len(rows)} outcomes"
            verdicts = programs_landed(programs, await self._routed_many(programs, what))
        elif found is None and not distinct:
            verdicts = [await self._write_outcome(key, r) for key, r in rows]
        else:
            if found is None:
                def one(key: str | None, r: FinalOutcome, at: int) -> Query:
                    with WorkflowAddress(r.workflow_id, key).routed():
                        return self.sql.record_outcome(r.workflow_id, r.status, r.owner_xid,
                                                       r.output, r.error, at)

                _, statements = self._per_key(
                    rows, lambda key, r: self.templates.query("record_outcome", one, key, r, at),
                    lambda key, group: self.sql.record_outcomes(group, at))
                what = (f"recording the outcome of {rows[0][1].workflow_id}" if len(rows) == 1
                        else f"recording {len(rows)} outcomes")
                found = await self._fetch_per_key(statements, what)
            verdicts = batch_verdicts(rows, found, lambda key, r: (key, r.workflow_id),
                                 lambda r: (r.get("shard_key"), r["workflow_uuid"]))
        self.notify_each(WORKFLOW_COMPLETION_CHANNEL, [
            keyed(row.workflow_id, key)
            for (key, row), landed in zip(rows, verdicts, strict=True) if landed is True])
        return verdicts

    async def _write_outcome(self, key: str | None, r: FinalOutcome) -> bool:
        with WorkflowAddress(r.workflow_id, key).routed():
            query = self.sql.record_outcome(r.workflow_id, r.status, r.owner_xid, r.output,
                                            r.error, self.clock.now_ms())
        row = await self._fetchrow(query, f"recording the outcome of {r.workflow_id}")
        return row is not None

    async def get_workflow(
        self, workflow_id: str, *, load_input: bool = False, load_output: bool = False
    ) -> StatusRecord | None:
        query = self.sql.get_workflow(workflow_id, load_input=load_input, load_output=load_output)
        row = await self._fetchrow(query, f"reading workflow {workflow_id}")
        return status_record(row) if row is not None else None

    async def get_outcome(self, workflow_id: str) -> Outcome | None:
        row = await self.get_workflow(workflow_id, load_output=True)
        if row is None:
            return None
        return Outcome(row.name, row.status, row.output, row.error, row.serialization)

    async def finished_first(self, refs: Sequence[WorkflowAddress]
                             ) -> tuple[WorkflowAddress | None, list[WorkflowAddress]]:
        """The first of these workflows to have finished (None if none has), and those
        that do not exist, in one query."""
        rows = await self._fetch(self.sql.finished_first(refs), "reading statuses")
        found = {(r["workflow_uuid"], r.get("shard_key")) for r in rows}
        first = rows[0] if rows and rows[0]["finished"] else None
        return (WorkflowAddress(first["workflow_uuid"], first.get("shard_key"))
                if first is not None else None,
                [ref for ref in refs if ref not in found])

    async def fork_descendants(self, refs: Sequence[WorkflowAddress]
                               ) -> dict[WorkflowAddress, list[WorkflowAddress]]:
        """Every workflow forked from each of these, recursively (forks of forks), read
        one level of the fork forest per query for all of them at once."""
        children: dict[WorkflowAddress, list[WorkflowAddress]] = {}
        seen = set(refs)
        frontier = list(dict.fromkeys(refs))
        while frontier:
            rows = await self._fetch(self.sql.forks_of(frontier), "reading forks")
            frontier = []
            for r in rows:
                key = r.get("shard_key")
                child = WorkflowAddress(r["workflow_uuid"], key)
                children.setdefault(WorkflowAddress(r["forked_from"], key), []).append(child)
                if child not in seen:
                    seen.add(child)
                    frontier.append(child)
        found: dict[WorkflowAddress, list[WorkflowAddress]] = {}
        for root in refs:
            descendants: list[WorkflowAddress] = []
            stack = list(children.get(root, ()))
            while stack:
                ref = stack.pop()
                if ref != root and ref not in descendants:
                    descendants.append(ref)
                    stack.extend(children.get(ref, ()))
            found[root] = sorted(descendants, key=lambda ref: ref[0])
        return found

    async def wait_outcome(self, workflow_id: str, poll_interval: float) -> Outcome:
        """Wait until the workflow is terminal: woken by completion notifications, polling
        with backoff up to every ``poll_interval`` seconds (other clients may not notify)."""
        dispatcher = self.notifications
        assert dispatcher is not None, "the notification dispatcher starts with its owner"
        delay = min(0.05, poll_interval)
        with dispatcher.register(WORKFLOW_COMPLETION_CHANNEL,
                                 self.waiter_key(workflow_id)) as waiter:
            while True:
                async with dispatcher.polling():
                    outcome = await self.get_outcome(workflow_id)
                if outcome is None:
                    raise NonExistentWorkflowError(workflow_id)
                if outcome.terminal:
                    return outcome
                await waiter.wait(delay)
                delay = min(delay * 2, poll_interval)
