"""The system database: an asyncpg pool and every operation on workflow rows.

It stores and returns strings; serialization and types belong to the executor. The
workflows' own statements (start, recovery, steps, outcome, messages, events, streams) are
here; the operations on workflows as a whole are in :mod:`dbos_async.sysdb.operations` and
the queues' in :mod:`dbos_async.sysdb.queues`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Hashable, Mapping, Sequence
from typing import Any, TypeVar

import asyncpg

from dbos_async.errors import (
    DBOSError,
    NondeterminismError,
    NonExistentWorkflowError,
    WorkflowCancelledError,
    WorkflowConflictError,
    workflow_id_taken,
)
from dbos_async.sysdb.admin import AdminOperations
from dbos_async.sysdb.application import (
    Connection,
    IsolationLevel,
    OpenTransaction,
    transaction,
)
from dbos_async.sysdb.chunks import CHUNK_ROWS, spans
from dbos_async.sysdb.exports import ExportOperations
from dbos_async.sysdb.group_commit import GroupCommit
from dbos_async.sysdb.notifications import (
    ENQUEUE_CHANNEL,
    NOTIFICATIONS_CHANNEL,
    WORKFLOW_COMPLETION_CHANNEL,
    keyed,
)
from dbos_async.sysdb.observability import ObservabilityOperations
from dbos_async.sysdb.operations import JobConnection, WorkflowOperations
from dbos_async.sysdb.queues import QueueOperations
from dbos_async.sysdb.records import (
    BatchStart,
    Outcome,
    StartResult,
    StatusRecord,
    StepRecord,
    WorkflowRow,
    status_record,
    workflow_row,
)
from dbos_async.sysdb.routed import Program, Results, RoutedWrites, Row, ran_whole
from dbos_async.sysdb.schedules import ScheduleOperations
from dbos_async.sysdb.shard_keys import (
    WorkflowAddress,
    bind_shard_keys,
    cleared_shard_keys,
    shard_key_scope,
)
from dbos_async.sysdb.statements import (
    CANCELLED,
    ERROR,
    PENDING,
    PORTABLE_JSON,
    SEND_BULK,
    SUCCESS,
    Checkpoint,
    Consume,
    FinalOutcome,
    NewWorkflow,
    OutgoingMessage,
    ParentStep,
    Payload,
    Query,
    WorkflowRef,
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

KeyGroup = tuple[list[int], str | None]
"""Rows of a batch (their indexes) under one shard key, and the key: one statement's rows."""

Keyed = tuple[str | None, T]

Received = tuple[bool, str | None, str | None]
"""What recv's consuming write found: (found, message, serialization)."""


async def _outcome_of(verdict: Awaitable[T]) -> T | BaseException:
    """A row's verdict in a group-commit batch: its value, or the error that is its alone
    (a fence), which the batch hands its caller rather than raising for every row."""
    try:
        return await verdict
    except (NonExistentWorkflowError, WorkflowCancelledError, WorkflowConflictError) as error:
        return error
"""A row to write and the shard key of its workflow (None unsharded)."""


def _by_key(keys: Sequence[str | None]) -> list[KeyGroup]:
    """The indexes of a batch's rows grouped by their keys, in order of first appearance."""
    groups: dict[str | None, list[int]] = {}
    for i, key in enumerate(keys):
        groups.setdefault(key, []).append(i)
    return [(indexes, key) for key, indexes in groups.items()]


def _verdicts(rows: Sequence[Keyed[T]],
              found: Mapping[str | None, Sequence[Row] | Exception],
              of_row: Callable[[str | None, T], Hashable],
              of_record: Callable[[Row], Hashable]) -> list[bool | BaseException]:
    """Per row of a group-commit batch: whether its write landed (its identity is among
    the rows its key's statement read back), or the error that ended that key's
    transaction. Of two rows claiming one write, the first landed."""
    landed = {of_record(r) for outcome in found.values()
              if not isinstance(outcome, Exception) for r in outcome}
    verdicts: list[bool | BaseException] = []
    for key, row in rows:
        outcome = found[key]
        if isinstance(outcome, Exception):
            verdicts.append(outcome)
            continue
        identity = of_row(key, row)
        verdicts.append(identity in landed)
        landed.discard(identity)
    return verdicts


def _keys_given(rows: Sequence[Keyed[T]]) -> list[str] | None:
    """Each row's key, or None if a row has none (then it cannot be placed in a shard)."""
    keys = [key for key, _ in rows if key is not None]
    return keys if len(keys) == len(rows) else None


def _with_child_key(key: str, r: Checkpoint) -> Checkpoint:
    """``r`` naming its child's key: the parent's (``key``) unless it names another, as a
    batch of one key's scope reads it."""
    if r.child_workflow_id is None or r.child_shard_key is not None:
        return r
    return dataclasses.replace(r, child_shard_key=key)


def _landed(programs: Sequence[tuple[WorkflowRef, Program]],
            found: Sequence[Results | Exception]) -> list[bool | BaseException]:
    """Per routed write of a group-commit batch: whether it landed whole, or the error
    that ended it."""
    return [results if isinstance(results, Exception) else ran_whole(program, results)
            for (_, program), results in zip(programs, found, strict=True)]


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


class SystemDatabase(RoutedWrites, WorkflowOperations, QueueOperations, ScheduleOperations,
                     AdminOperations, ExportOperations, ObservabilityOperations):
    """Every statement of the system database, run on one asyncpg pool with retries."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Group commit of the writes every workflow makes (see group_commit): one lane per
        # kind (and per shard key on Citus, see _lane).
        self._checkpoints = GroupCommit[Keyed[Checkpoint], bool](self._write_checkpoints)
        self._outcomes = GroupCommit[Keyed[FinalOutcome], bool](self._write_outcomes)
        self._starts = GroupCommit[tuple[NewWorkflow, str], StartResult](self._write_starts)
        self._sends = GroupCommit[Keyed[OutgoingMessage], bool](self._write_sends)
        self._consumes = GroupCommit[Consume, Received](self._write_consumes)


    async def dequeue_scopes(self, queue_name: str) -> list[str]:
        """The shard keys with ENQUEUED work on the queue (sharded databases). On Citus,
        read from each node's own shards, so a node out of reach hides only its own keys
        (see :meth:`~dbos_async.sysdb.routed.RoutedWrites._read_each_node`)."""
        if not self.routes_single_tables:
            return await super().dequeue_scopes(queue_name)
        rows = await self._read_each_node(
            lambda shard_ids: self.sql.dequeue_scopes_on_shards(queue_name, shard_ids),
            "reading dequeue scopes")
        return [row["shard_key"] for row in rows]
    async def _lane(self, shard_key: str | None) -> Hashable:
        """The group-commit lane of a write under ``shard_key``: on Citus one per node
        (the batch goes to the node holding its keys, one program per write, see routed);
        on PostgreSQL one for every key (one statement per key, see _fetch_per_key). Each
        batch goes in one round trip."""
        return await self.node_of(shard_key)

    async def close(self) -> None:
        await self._starts.aclose()
        await self._checkpoints.aclose()
        await self._outcomes.aclose()
        await self._sends.aclose()
        await self._consumes.aclose()
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
        firsts: dict[WorkflowRef, int] = {}
        for i, (wf, _) in enumerate(rows):
            firsts.setdefault((wf.workflow_id, wf.shard_key), i)
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
            if firsts[wf.workflow_id, wf.shard_key] != i:
                results.insert(i, await self._start_alone(wf, xid))
        return results

    async def _write_starts_routed(self, rows: Sequence[tuple[NewWorkflow, str]]
                                   ) -> list[StartResult | BaseException]:
        """:meth:`_write_starts` on Citus: one program per start, all in one round trip."""
        programs = [((wf.workflow_id, wf.shard_key), self._start_program(wf, xid))
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
            groups: dict[str | None, list[int]] = {}
            for i in pending:
                groups.setdefault(rows[i][0].shard_key, []).append(i)
            per_key = [(indexes, key) for key, indexes in groups.items()]
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

    # ---- Transactions (see dbos_async/executor/transactions.py) ----

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
        return transaction(self.pool, isolation, read_only,
                           self.sql.idle_transaction_timeout(bound) if bound > 0 else None)

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
        async with transaction(self.pool, "READ COMMITTED", False) as tx:
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
            keys = _keys_given(rows)
            found = None if keys is None else await self._batch_on_shards(
                keys, lambda indexes: self.sql.record_steps(
                    [_with_child_key(keys[i], rows[i][1]) for i in indexes],
                    [keys[i] for i in indexes]), what)
            if found is not None:
                return _verdicts(rows, found, of_row, of_record)
            programs = []
            for key, r in rows:
                with WorkflowAddress(r.workflow_id, key).routed():
                    programs.append(((r.workflow_id, key), self._checkpoint_program(r)))
            return _landed(programs, await self._routed_many(programs, what))
        _, statements = self._per_key(
            rows, lambda key, r: self.templates.query("record_step", one, key, r),
            lambda key, group: self.sql.record_steps(group))
        found = await self._fetch_per_key(statements, what)
        return _verdicts(rows, found, of_row, of_record)

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
        status = ERROR if error is not None else SUCCESS
        row = FinalOutcome(workflow_id, status, owner_xid, output, error)
        key = self.sql.key_hint(workflow_id)
        return await self._outcomes.submit(await self._lane(key), (key, row))

    async def _write_outcomes(self, lane: Hashable, rows: Sequence[Keyed[FinalOutcome]]
                              ) -> list[bool | BaseException]:
        """One group-commit batch of outcomes, one statement per key (on Citus, per
        shard: see routed): whether each was recorded. A batch naming a workflow twice goes
        row by row; on Citus, where no shard can be named, one program per outcome."""
        verdicts: list[bool | BaseException]
        at = self.clock.now_ms()
        keys = _keys_given(rows) if self.routes_single_tables else None
        distinct = len({(key, r.workflow_id) for key, r in rows}) == len(rows)
        found = None
        if keys is not None and distinct:
            found = await self._batch_on_shards(
                keys, lambda indexes: self.sql.record_outcomes(
                    [rows[i][1] for i in indexes], at, [keys[i] for i in indexes]),
                f"recording {len(rows)} outcomes")
        if found is None and self.routes_single_tables:
            programs = []
            for key, r in rows:
                with WorkflowAddress(r.workflow_id, key).routed():
                    programs.append(((r.workflow_id, key), self._outcome_program(r, at)))
            what = f"recording {len(rows)} outcomes"
            verdicts = _landed(programs, await self._routed_many(programs, what))
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
            verdicts = _verdicts(rows, found, lambda key, r: (key, r.workflow_id),
                                 lambda r: (r.get("shard_key"), r["workflow_uuid"]))
        for (key, row), landed in zip(rows, verdicts, strict=True):
            if landed is True:
                self.notify(WORKFLOW_COMPLETION_CHANNEL, keyed(row.workflow_id, key))
        return verdicts

    async def _write_outcome(self, key: str | None, r: FinalOutcome) -> bool:
        with WorkflowAddress(r.workflow_id, key).routed():
            query = self.sql.record_outcome(r.workflow_id, r.status, r.owner_xid, r.output,
                                            r.error, self.clock.now_ms())
        row = await self._fetchrow(query, f"recording the outcome of {r.workflow_id}")
        return row is not None

    def _per_key(self, rows: Sequence[Keyed[T]], one: Callable[[str | None, T], Query],
                 batch: Callable[[str | None, list[T]], Query]
                 ) -> tuple[list[KeyGroup], list[tuple[str | None, Query]]]:
        """The statements of a group-commit batch, one per key, and the rows (indexes) each
        writes: where every key holds one row (a lone write, or workflows spread over many
        keys), each row's single-row statement ``one``, which costs the server less to run
        than the array form ``batch`` takes for several rows of a key. Every statement
        reads back each written row's ID and key, whatever its form."""
        groups = _by_key([key for key, _ in rows])
        statements = []
        for indexes, key in groups:
            if len(groups) == len(rows):
                statements.append((key, one(*rows[indexes[0]])))
                continue
            with cleared_shard_keys(), shard_key_scope(key):
                statements.append((key, batch(key, [rows[i][1] for i in indexes])))
        return groups, statements

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

    # ---- Recovery (see dbos_async/executor/recovery.py) ----

    async def _each_pending_key(self, executor_id: str, application_version: str | None,
                                exclude: Sequence[WorkflowRef], failover: bool, what: str,
                                statement: Callable[[Sequence[WorkflowRef]], Query],
                                retried: bool = True) -> list[Row]:
        """The rows of ``statement`` (a recovery statement, built under the current
        shard-key scope), run once over every key; or on Citus once per key of
        ``executor_id``'s PENDING workflows (read from each node's own shards), each on the
        key's shard's own tables (see ``_rows_on_shard``), so a node out of reach stops only
        its keys' recovery. There,
        in ``failover`` (another, dead executor's workflows), a key whose statement fails
        is left with a warning: its rows stay the dead executor's, and the next scan finds
        them again. Recovering its own, an executor raises the first such error once every
        key was tried: what it claimed stays its own and a retry claims it again. Without
        ``retried``, a statement is sent once (see :meth:`claim_pending`)."""
        if not self.routes_single_tables:
            query = statement(exclude)
            send = functools.partial(self.pool.fetch, query.sql, *query.params)
            return list(await (self._retried(what, send) if retried
                               else self._once(what, send)))
        keys = await self._read_each_node(
            lambda shard_ids: self.sql.pending_keys_on_shards(executor_id,
                                                              application_version, shard_ids),
            f"listing the keys of executor {executor_id}'s pending workflows")
        found: list[Row] = []
        failed: Exception | None = None
        for key in sorted({row["shard_key"] for row in keys}):
            with shard_key_scope(key):
                query = statement([ref for ref in exclude if ref[1] == key])
            try:
                found += await self._rows_on_shard(key, query, what, retried)
            except Exception as error:
                if not failover:
                    failed = failed or error
                    continue
                logger.warning("%s under shard key %r failed; left for the next failover "
                               "scan: %s", what, key, error)
        if failed is not None:
            raise failed
        return found

    async def claim_pending(
        self, executor_id: str, application_version: str | None,
        exclude: Sequence[WorkflowRef] = (), to_executor_id: str | None = None,
    ) -> list[WorkflowRow]:
        now_ms = self.clock.now_ms()
        # Not retried: a lost reply would leave rows claimed under tokens we never learned;
        # a recovery run again (start-up retries it) claims them afresh.
        rows = await self._each_pending_key(
            executor_id, application_version, exclude,
            to_executor_id not in (None, executor_id), "claiming pending workflows",
            lambda excluded: self.sql.claim_pending(executor_id, application_version, now_ms,
                                                    excluded, to_executor_id),
            retried=False)
        return [workflow_row(row) for row in rows]

    async def executors_with_pending(self, application_version: str | None,
                                     own_executor_id: str) -> list[str]:
        """The other executors with PENDING workflows of this version (failover's
        candidates). On Citus, read from each node's own shards: a node out of reach hides
        only its keys' executors."""
        what = "listing executors with pending workflows"
        if self.routes_single_tables:
            rows = await self._read_each_node(
                lambda shard_ids: self.sql.executors_with_pending_on_shards(
                    application_version, own_executor_id, shard_ids), what)
            return sorted({row["executor_id"] for row in rows})
        query = self.sql.executors_with_pending(application_version, own_executor_id)
        return [row["executor_id"] for row in await self._fetch(query, what)]

    async def requeue_pending(self, executor_id: str, application_version: str | None,
                              exclude: Sequence[WorkflowRef] = (), *, failover: bool = False
                              ) -> list[tuple[str, str]]:
        """Re-enqueue this executor's PENDING queued workflows: [(workflow, queue)]."""
        now_ms = self.clock.now_ms()
        rows = await self._each_pending_key(
            executor_id, application_version, exclude, failover,
            "re-enqueuing pending workflows",
            lambda excluded: self.sql.requeue_pending(executor_id, application_version,
                                                      now_ms, excluded))
        return [(row["workflow_uuid"], row["queue_name"]) for row in rows]

    async def dead_letter_pending(self, executor_id: str, application_version: str | None,
                                  max_attempts: int, exclude: Sequence[WorkflowRef] = (),
                                  limits: Mapping[str, int] | None = None, *,
                                  failover: bool = False) -> list[tuple[str, str | None]]:
        """Dead-letter this executor's workflows past ``max_attempts`` (or their name's
        limit in ``limits``): [(workflow, key)]."""
        now_ms = self.clock.now_ms()
        rows = await self._each_pending_key(
            executor_id, application_version, exclude, failover, "dead-lettering workflows",
            lambda excluded: self.sql.dead_letter_pending(executor_id, application_version,
                                                          max_attempts, now_ms, excluded,
                                                          limits))
        return [(row["workflow_uuid"], row.get("shard_key")) for row in rows]

    # ---- Fenced writes (steps too), messages, events and streams ----

    def _check_fence(self, row: Row | None, workflow_id: str) -> bool:
        """Raise if the fenced write found the workflow gone, cancelled or owned elsewhere."""
        if row is None:
            raise NonExistentWorkflowError(workflow_id)
        if row["status"] == CANCELLED:
            raise WorkflowCancelledError(workflow_id)
        if row["status"] != PENDING or not row["owned"]:
            raise WorkflowConflictError(workflow_id)
        return bool(row["inserted"])

    async def _recorded_or_existing(
        self, row: Row | None, workflow_id: str, function_id: int, function_name: str
    ) -> StepRecord | None:
        """None if this statement recorded the step; else the record already there."""
        if self._check_fence(row, workflow_id):
            return None
        record = await self._existing_step(workflow_id, function_id, function_name)
        if record is None:
            raise RuntimeError(f"Step {function_id} of {workflow_id} vanished while recorded")
        return record

    async def _existing_step(self, workflow_id: str, function_id: int, function_name: str
                             ) -> StepRecord | None:
        """The step recorded at ``function_id`` (None if none), which must be ``function_name``."""
        row = await self._fetchrow(
            self.sql.get_checkpoint(workflow_id, function_id), "reading a checkpoint"
        )
        if row is None:
            return None
        record = StepRecord(**dict(row))
        if record.function_name != function_name:
            raise NondeterminismError(workflow_id, function_id, record.function_name, function_name)
        return record

    async def _fetchrow_fk(self, query: Query, what: str, destination_id: str
                           ) -> asyncpg.Record | None:
        try:
            return await self._fetchrow(query, what)
        except asyncpg.ForeignKeyViolationError:
            raise NonExistentWorkflowError(destination_id) from None

    async def send(self, destination_id: str, message_uuid: str, topic: str, message: Payload
                   ) -> None:
        """Send from outside a workflow; idempotent by ``message_uuid``. The sends made
        together go as one statement per key (group commit; on Citus, each alone): each
        caller continues once its message has committed, exactly as alone."""
        if self.routes_single_tables:
            query = self.sql.send_message(destination_id, message_uuid, topic, message)
            try:
                await self._execute(query, f"sending to {destination_id}")
            except asyncpg.ForeignKeyViolationError:
                raise NonExistentWorkflowError(destination_id) from None
            return
        key = self.sql.key_hint(destination_id)
        outgoing = OutgoingMessage(destination_id, message_uuid, topic, message.text, key,
                                   message.serialization)
        await self._sends.submit(await self._lane(key), (key, outgoing))

    async def _write_sends(self, lane: Hashable, rows: Sequence[Keyed[OutgoingMessage]]
                           ) -> list[bool | BaseException]:
        """One group-commit batch of sends from outside workflows, one statement per key. A
        key's statement that fails the foreign key (a destination is missing) wrote none of
        its rows: they go again one by one, so only a send to a missing workflow fails."""
        groups, statements = self._per_key(
            rows, lambda key, m: self.sql.send_messages([m], key),
            lambda key, group: self.sql.send_messages(group, key))
        found = await self._fetch_per_key(statements, f"sending {len(rows)} messages")
        verdicts: list[bool | BaseException] = [True] * len(rows)
        for indexes, key in groups:
            refused = found[key]
            if not isinstance(refused, Exception):
                continue
            for i in indexes:
                verdicts[i] = (await self._send_alone(rows[i][1])
                               if isinstance(refused, asyncpg.ForeignKeyViolationError)
                               else refused)
        return verdicts

    async def _send_alone(self, m: OutgoingMessage) -> bool | BaseException:
        """A send of a refused batch, on its own: True once written, or why not."""
        try:
            await self._execute(self.sql.send_messages([m], m.shard_key),
                                f"sending to {m.destination_id}")
        except asyncpg.ForeignKeyViolationError:
            return NonExistentWorkflowError(m.destination_id)
        except Exception as error:
            return error
        return True

    async def send_fenced(self, workflow_id: str, owner_xid: str, destination_id: str,
                          message_uuid: str, topic: str, message: Payload) -> None:
        if self.routes_single_tables:
            sent = self.sql.send_message(destination_id, message_uuid, topic, message)
            try:
                row = await self._send_fenced_routed(workflow_id, owner_xid, sent)
            except asyncpg.ForeignKeyViolationError:
                raise NonExistentWorkflowError(destination_id) from None
            self._check_fence(row, workflow_id)
            return
        query = self.sql.send_message_fenced(workflow_id, owner_xid, destination_id,
                                             message_uuid, topic, message)
        row = await self._fetchrow_fk(query, f"sending to {destination_id}", destination_id)
        self._check_fence(row, workflow_id)

    async def send_recorded(self, workflow_id: str, function_id: int, owner_xid: str,
                            destination_id: str, message_uuid: str, topic: str, message: Payload
                            ) -> StepRecord | None:
        if self.routes_single_tables:
            return await self.send_recorded_across(
                WorkflowAddress(workflow_id, self.sql.key_hint(workflow_id)), function_id,
                owner_xid, WorkflowAddress(destination_id, self.sql.key_hint(destination_id)),
                message_uuid, topic, message)
        query = self.sql.send_message_recorded(workflow_id, function_id, owner_xid,
                                               destination_id, message_uuid, topic, message,
                                               self.clock.now_ms())
        row = await self._fetchrow_fk(query, f"sending to {destination_id}", destination_id)
        return await self._recorded_or_existing(row, workflow_id, function_id, "DBOS.send")

    async def send_recorded_across(self, sender: WorkflowAddress, function_id: int,
                                   owner_xid: str, destination: WorkflowAddress,
                                   message_uuid: str, topic: str, message: Payload
                                   ) -> StepRecord | None:
        """A workflow's send to a workflow under another shard key: the sender's checkpoint
        and the message, one statement per key, in one transaction, so the message lands
        only with the checkpoint. Each statement is built under its own key alone: the
        destination may have the sender's ID."""
        now = self.clock.now_ms()
        with sender.routed():
            checkpoint = self.sql.record_step(sender.workflow_id, function_id, "DBOS.send",
                                              owner_xid, None, None, now, now)
        with destination.routed():
            sent = self.sql.send_message(destination.workflow_id, message_uuid, topic, message)

        async def attempt() -> bool:
            async with self.locking_transaction() as conn:
                if await conn.fetchrow(checkpoint.sql, *checkpoint.params) is None:
                    return False  # nothing to send: not ours, or sent already
                await conn.execute(sent.sql, *sent.params)
                return True

        what = f"sending to {destination.workflow_id}"
        try:
            if await self._retried(what, attempt):
                return None
        except asyncpg.ForeignKeyViolationError:
            raise NonExistentWorkflowError(destination.workflow_id) from None
        with sender.routed():
            verdict = await self._fetchrow(
                self.sql.fence_verdict(sender.workflow_id, owner_xid), what)
            return await self._recorded_or_existing(verdict, sender.workflow_id, function_id,
                                                    "DBOS.send")

    async def send_many(self, messages: Sequence[OutgoingMessage], *,
                        sender: WorkflowAddress | None = None, owner_xid: str | None = None,
                        function_id: int | None = None,
                        function_name: str = SEND_BULK) -> StepRecord | None:
        """Insert a batch of messages: one statement per shard key (one in all, unsharded),
        in one transaction, so the batch lands whole or not at all. From a workflow
        (``sender`` with ``function_id``) the statement of the sender's key also records
        its checkpoint and the other keys' messages are written only if it landed; from a
        step (``sender`` without ``function_id``) they land only while its execution owns
        the workflow. Returns the checkpoint a replay found already recorded. A missing
        destination raises :class:`NonExistentWorkflowError` naming every missing one."""
        groups: dict[str | None, list[OutgoingMessage]] = {}
        for m in messages:
            groups.setdefault(m.shard_key, []).append(m)
        attempt: Callable[[], Awaitable[Row | None]] = (
            self._send_many_routed(groups, sender, owner_xid, function_id, self.clock.now_ms(),
                                   function_name)
            if self.routes_single_tables
            else self._send_many_attempt(groups, sender, owner_xid, function_id,
                                         function_name))

        destinations = sorted({m.destination_id for m in messages})
        what = f"sending to {', '.join(destinations)}"
        try:
            verdict = await self._retried(what, attempt)
        except asyncpg.ForeignKeyViolationError:
            raise NonExistentWorkflowError(await self._missing(messages)) from None
        if sender is None:
            return None
        with sender.routed():
            if function_id is None:
                self._check_fence(verdict, sender.workflow_id)
                return None
            return await self._recorded_or_existing(verdict, sender.workflow_id,
                                                    function_id, function_name)

    def _send_many_attempt(self, groups: dict[str | None, list[OutgoingMessage]],
                           sender: WorkflowAddress | None, owner_xid: str | None,
                           function_id: int | None, function_name: str
                           ) -> Callable[[], Awaitable[asyncpg.Record | None]]:
        """:meth:`send_many`'s attempt: one statement per key, the sender's key's fenced
        (and, from a workflow, recording the checkpoint)."""
        head: Query | None = None
        if sender is not None:
            own = groups.pop(sender.shard_key, [])
            assert owner_xid is not None
            with sender.routed():
                head = (self.sql.send_messages_recorded(sender.workflow_id, function_id,
                                                        owner_xid, own, self.clock.now_ms(),
                                                        function_name)
                        if function_id is not None
                        else self.sql.send_messages_fenced(sender.workflow_id, owner_xid, own))
        rest = [self.sql.send_messages(batch, key) for key, batch in groups.items()]

        async def attempt() -> asyncpg.Record | None:
            alone = [head] if head is not None else []
            if len(alone) + len(rest) == 1:  # one key: one autocommit statement
                q = (alone or rest)[0]
                return await self.pool.fetchrow(q.sql, *q.params)
            async with self.locking_transaction() as conn:
                verdict = await conn.fetchrow(head.sql, *head.params) if head else None
                if verdict is not None and not (
                        verdict["status"] == PENDING and verdict["owned"]
                        and (function_id is None or verdict["inserted"])):
                    return verdict  # not ours, or sent already: nothing more to write
                for q in rest:
                    await conn.execute(q.sql, *q.params)
                return verdict

        return attempt

    async def send_many_on(self, conn: asyncpg.Connection,
                           messages: Sequence[OutgoingMessage]) -> None:
        """Insert a batch of messages on the caller's connection, inside the transaction it
        holds (see :meth:`send_on`): one statement per shard key; on a sharded schema the
        receivers' notifications are queued in that transaction too."""
        groups: dict[str | None, list[OutgoingMessage]] = {}
        for m in messages:
            groups.setdefault(m.shard_key, []).append(m)
        try:
            batches = (self._message_batches(groups) if self.routes_single_tables
                       else [self.sql.send_messages(batch, key) for key, batch in groups.items()])
            for q in batches:
                await conn.execute(q.sql, *q.params)
        except asyncpg.ForeignKeyViolationError:
            raise NonExistentWorkflowError(await self._missing(messages)) from None
        if self.sharded:
            for m in messages:
                with WorkflowAddress(m.destination_id, m.shard_key).routed():
                    q = self.sql.notify_with_transaction(
                        NOTIFICATIONS_CHANNEL, self.waiter_key(m.destination_id, m.topic))
                await conn.execute(q.sql, *q.params)

    async def _missing(self, messages: Sequence[OutgoingMessage]) -> str:
        """The destinations of these messages that do not exist, for the error."""
        missing: list[str] = []
        keys: dict[str | None, set[str]] = {}
        for m in messages:
            keys.setdefault(m.shard_key, set()).add(m.destination_id)
        for key, ids in keys.items():
            with cleared_shard_keys(), bind_shard_keys(dict.fromkeys(ids, key)):
                found = {r["workflow_uuid"] for r in await self._fetch(
                    self.sql.existing(sorted(ids)), "reading destinations")}
            missing += sorted(ids - found)
        return ", ".join(missing)

    @property
    def consumes_in_batches(self) -> bool:
        """Whether recv's consuming writes are group-committed (on an unsharded schema):
        then the reads of many woken waiters are a few statements, not one each."""
        return not self.sharded

    async def consume_message(self, workflow_id: str, function_id: int, owner_xid: str,
                              topic: str) -> Received:
        """recv's consuming write: (found, message, serialization); found is False if none.
        On an unsharded schema it joins the others of its turn of the event loop (or of
        the round trip before) in one statement."""
        if self.consumes_in_batches:
            return await self._consumes.submit(
                None, Consume(workflow_id, function_id, owner_xid, topic))
        return await self._consume_one(Consume(workflow_id, function_id, owner_xid, topic))

    async def _write_consumes(self, _lane: Hashable, rows: Sequence[Consume]
                              ) -> list[Received | BaseException]:
        """One group-commit batch of recv's consuming writes, each judged on its own. A
        batch naming a workflow twice (two readers of one workflow, as a retry can make)
        goes row by row: one statement would hand both the same message."""
        if len(rows) == 1 or len({r.workflow_id for r in rows}) < len(rows):
            return [await _outcome_of(self._consume_one(r)) for r in rows]
        found = await self._fetch(self.sql.consume_messages(rows, self.clock.now_ms()),
                                  f"receiving for {len(rows)} workflows")
        return [await _outcome_of(self._received(r, row if row["status"] is not None
                                                 else None))
                for r, row in zip(rows, found, strict=True)]

    async def _consume_one(self, c: Consume) -> Received:
        row: Row | None
        workflow_id, function_id, owner_xid, topic = (c.workflow_id, c.function_id,
                                                      c.owner_xid, c.topic)
        if self.routes_single_tables:
            row = await self._consume_message_routed(workflow_id, function_id, owner_xid,
                                                     topic, self.clock.now_ms())
        else:
            query = self.sql.consume_message(workflow_id, function_id, owner_xid, topic,
                                             self.clock.now_ms())
            row = await self._fetchrow(query, f"receiving for {workflow_id}")
        return await self._received(c, row)

    async def _received(self, c: Consume, row: Row | None) -> Received:
        """What a consuming write's row (None: no such workflow) says recv received."""
        self._check_fence(row, c.workflow_id)
        assert row is not None
        if row["inserted"]:
            return True, row["message"], row["serialization"]
        if row["recorded"]:
            record = await self._existing_step(c.workflow_id, c.function_id, "DBOS.recv")
            if record is not None:
                return True, record.output, record.serialization
        return False, None, None

    async def set_event_recorded(self, workflow_id: str, function_id: int, owner_xid: str,
                                 key: str, value: Payload) -> StepRecord | None:
        row: Row | None
        if self.routes_single_tables:
            row = await self._set_event_routed(workflow_id, owner_xid, key, value,
                                               function_id, self.clock.now_ms())
        else:
            query = self.sql.set_event_recorded(workflow_id, function_id, owner_xid, key,
                                                value, self.clock.now_ms())
            row = await self._fetchrow(query, f"setting event {key!r} of {workflow_id}")
        return await self._recorded_or_existing(row, workflow_id, function_id, "DBOS.setEvent")

    async def set_event_fenced(self, workflow_id: str, owner_xid: str, key: str, value: Payload
                               ) -> None:
        if self.routes_single_tables:
            self._check_fence(await self._set_event_routed(workflow_id, owner_xid, key, value,
                                                           None, self.clock.now_ms()), workflow_id)
            return
        query = self.sql.set_event_fenced(workflow_id, owner_xid, key, value)
        self._check_fence(await self._fetchrow(query, f"setting event {key!r}"), workflow_id)

    async def get_event(self, workflow_id: str, key: str) -> tuple[str, str | None] | None:
        row = await self._fetchrow(self.sql.get_event(workflow_id, key), "reading an event")
        return (row["value"], row["serialization"]) if row is not None else None

    async def get_all_events(self, workflow_id: str) -> list[tuple[str, str, str | None]]:
        rows = await self._fetch(self.sql.get_all_events(workflow_id), "reading events")
        return [(row["key"], row["value"], row["serialization"]) for row in rows]

    async def _write_stream(self, workflow_id: str, owner_xid: str, key: str, value: Payload,
                            function_id: int, function_name: str | None) -> Row | None:
        """A stream write; with ``function_name``, the workflow's own, recorded."""
        if self.routes_single_tables:
            at = self.clock.now_ms()

            def write() -> Awaitable[Row | None]:
                return self._write_stream_routed(workflow_id, owner_xid, key, value,
                                                 function_id, function_name, at)
        else:
            query = (self.sql.write_stream_recorded(workflow_id, function_id, function_name,
                                                    owner_xid, key, value, self.clock.now_ms())
                     if function_name is not None else
                     self.sql.write_stream_fenced(workflow_id, owner_xid, key, value,
                                                  function_id))

            def write() -> Awaitable[Row | None]:
                return self._fetchrow(query, f"writing stream {key!r} of {workflow_id}")
        # Two writers can derive the same next offset; the loser fails the primary key (the
        # whole statement rolls back) and simply runs again.
        for _ in range(100):
            try:
                return await write()
            except asyncpg.UniqueViolationError:
                await asyncio.sleep(0)
        raise RuntimeError(f"Could not append to stream {key!r} of {workflow_id}")

    async def write_stream_recorded(self, workflow_id: str, function_id: int,
                                    function_name: str, owner_xid: str, key: str, value: Payload
                                    ) -> StepRecord | None:
        row = await self._write_stream(workflow_id, owner_xid, key, value, function_id,
                                       function_name)
        return await self._recorded_or_existing(row, workflow_id, function_id, function_name)

    async def write_stream_fenced(self, workflow_id: str, owner_xid: str, key: str, value: Payload,
                                  function_id: int = 0) -> None:
        self._check_fence(await self._write_stream(workflow_id, owner_xid, key, value,
                                                   function_id, None), workflow_id)

    async def read_stream_value(self, workflow_id: str, key: str, offset: int
                                ) -> tuple[str | None, str | None, str | None, bool]:
        """(writer status or None if no workflow, value, serialization, whether found)."""
        row = await self._fetchrow(self.sql.read_stream_value(workflow_id, key, offset),
                                   "reading a stream")
        if row is None:
            return None, None, None, False
        found = row["stream_offset"] is not None
        return row["status"], row["value"], row["serialization"], found

    async def finished_first(self, refs: Sequence[WorkflowRef]
                             ) -> tuple[WorkflowRef | None, list[WorkflowRef]]:
        """The first of these workflows to have finished (None if none has), and those
        that do not exist, in one query."""
        rows = await self._fetch(self.sql.finished_first(refs), "reading statuses")
        found = {(r["workflow_uuid"], r.get("shard_key")) for r in rows}
        first = rows[0] if rows and rows[0]["finished"] else None
        return ((first["workflow_uuid"], first.get("shard_key")) if first is not None else None,
                [ref for ref in refs if ref not in found])

    async def fork_descendants(self, refs: Sequence[WorkflowRef]
                               ) -> dict[WorkflowRef, list[WorkflowRef]]:
        """Every workflow forked from each of these, recursively (forks of forks), read
        one level of the fork forest per query for all of them at once."""
        children: dict[WorkflowRef, list[WorkflowRef]] = {}
        seen = set(refs)
        frontier = list(dict.fromkeys(refs))
        while frontier:
            rows = await self._fetch(self.sql.forks_of(frontier), "reading forks")
            frontier = []
            for r in rows:
                key = r.get("shard_key")
                child: WorkflowRef = (r["workflow_uuid"], key)
                children.setdefault((r["forked_from"], key), []).append(child)
                if child not in seen:
                    seen.add(child)
                    frontier.append(child)
        found: dict[WorkflowRef, list[WorkflowRef]] = {}
        for root in refs:
            descendants: list[WorkflowRef] = []
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
