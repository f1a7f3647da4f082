"""The system database: an asyncpg pool and every operation on workflow rows.

It stores and returns strings; serialization and types belong to the executor. The
workflows' own statements (start, recovery, steps, outcome, messages, events, streams) are
here; the operations on workflows as a whole are in :mod:`dbos_async.sysdb.operations` and
the queues' in :mod:`dbos_async.sysdb.queues`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import asyncpg

from dbos_async.errors import (
    NondeterminismError,
    NonExistentWorkflowError,
    WorkflowCancelledError,
    WorkflowConflictError,
)
from dbos_async.sysdb.admin import AdminOperations
from dbos_async.sysdb.core import now_ms
from dbos_async.sysdb.notifications import NOTIFICATIONS_CHANNEL, WORKFLOW_COMPLETION_CHANNEL
from dbos_async.sysdb.operations import JobConnection, WorkflowOperations
from dbos_async.sysdb.queues import QueueOperations
from dbos_async.sysdb.records import (
    Outcome,
    StartResult,
    StatusRecord,
    StepRecord,
    WorkflowRow,
    status_record,
    workflow_row,
)
from dbos_async.sysdb.retry import is_connection_loss
from dbos_async.sysdb.schedules import ScheduleOperations
from dbos_async.sysdb.shard_keys import WorkflowAddress
from dbos_async.sysdb.statements import (
    CANCELLED,
    ERROR,
    PENDING,
    SUCCESS,
    NewWorkflow,
    ParentStep,
    Query,
    WorkflowRef,
)

__all__ = [
    "Outcome",
    "StartResult",
    "StepRecord",
    "SystemDatabase",
    "WorkflowRow",
    "now_ms",
]


class SystemDatabase(WorkflowOperations, QueueOperations, ScheduleOperations,
                     AdminOperations):
    """Every statement of the system database, run on one asyncpg pool with retries."""

    # ---- Workflows ----

    async def start_workflow(
        self, wf: NewWorkflow, creator_xid: str, parent: ParentStep | None = None
    ) -> StartResult:
        """Insert a workflow (or find the existing one with its ID), in one round trip.

        Safe to retry: a row carrying our creator token is ours even if the first attempt's
        reply was lost.
        """
        if parent is not None and self.sharded and parent.shard_key != wf.shard_key:
            return await self._start_child_across(wf, creator_xid, parent)
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

    async def start_workflow_on(self, conn: asyncpg.Connection | JobConnection, wf: NewWorkflow,
                                creator_xid: str, *, announce: tuple[str, str]) -> StartResult:
        """Insert a workflow on the caller's connection, in a savepoint of the caller's
        transaction (so a duplicate does not abort it), with its ``announce`` notification
        (channel, payload) queued in that transaction; not retried, since the transaction
        is the caller's."""
        async with conn.transaction():
            started = await self._insert_on(conn, wf, creator_xid)
            if started.created:
                q = self.sql.notify_with_transaction(*announce)
                await conn.execute(q.sql, *q.params)
        return started

    async def _insert_on(self, conn: asyncpg.Connection | JobConnection, wf: NewWorkflow,
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

    async def _start_child_across(self, wf: NewWorkflow, creator_xid: str,
                                  parent: ParentStep) -> StartResult:
        """A child under another shard key than its parent's: the parent's checkpoint of the
        start, fenced by the parent's owner, and the child's row, one statement per key in
        one transaction, so neither lands without the other. Each statement is built under
        its own key alone: the child may have the parent's ID."""
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
                return await self._insert_on(conn, wf, creator_xid, parent.shard_key)

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
                      topic: str, message: str) -> None:
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
    ) -> StepRecord | None:
        """Checkpoint a step; returns the existing record if one was already there.

        Raises :class:`WorkflowCancelledError` if the workflow was cancelled and
        :class:`WorkflowConflictError` if this execution no longer owns it.
        """
        query = self.sql.record_step(
            workflow_id, function_id, function_name, owner_xid, output, error,
            started_at_ms, completed_at_ms, child_workflow_id,
        )
        what = f"checkpointing step {function_id} of {workflow_id}"
        if await self._fetchrow(query, what) is not None:
            return None
        verdict = await self._fetchrow(self.sql.fence_verdict(workflow_id, owner_xid), what)
        return await self._recorded_or_existing(verdict, workflow_id, function_id, function_name)

    async def record_outcome(
        self,
        workflow_id: str,
        owner_xid: str,
        *,
        output: str | None = None,
        error: str | None = None,
    ) -> bool:
        """Record SUCCESS (no error) or ERROR; False if this execution no longer owned it."""
        status = ERROR if error is not None else SUCCESS
        query = self.sql.record_outcome(workflow_id, status, owner_xid, output, error, now_ms())
        row = await self._fetchrow(query, f"recording the outcome of {workflow_id}")
        return row is not None and int(row["count"]) > 0

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

    async def claim_pending(
        self, executor_id: str, application_version: str | None, exclude: Sequence[WorkflowRef] = ()
    ) -> list[WorkflowRow]:
        query = self.sql.claim_pending(executor_id, application_version, now_ms(), exclude)
        # Not retried here: a lost reply would leave rows claimed under tokens we never
        # learned; a recovery run again (start-up retries it) claims them afresh.
        try:
            rows = await self.pool.fetch(query.sql, *query.params)
        except Exception as error:
            if not is_connection_loss(error):
                raise
            raise self.unavailable("claiming pending workflows", error) from error
        return [workflow_row(row) for row in rows]

    async def requeue_pending(self, executor_id: str, application_version: str | None,
                              exclude: Sequence[WorkflowRef] = ()) -> list[tuple[str, str]]:
        """Re-enqueue this executor's PENDING queued workflows: [(workflow, queue)]."""
        query = self.sql.requeue_pending(executor_id, application_version, now_ms(), exclude)
        rows = await self._fetch(query, "re-enqueuing pending workflows")
        return [(row["workflow_uuid"], row["queue_name"]) for row in rows]

    async def dead_letter_pending(self, executor_id: str, application_version: str | None,
                                  max_attempts: int, exclude: Sequence[WorkflowRef] = ()
                                  ) -> list[tuple[str, str | None]]:
        """Dead-letter this executor's workflows past ``max_attempts``: [(workflow, key)]."""
        query = self.sql.dead_letter_pending(executor_id, application_version, max_attempts,
                                             now_ms(), exclude)
        rows = await self._fetch(query, "dead-lettering workflows")
        return [(row["workflow_uuid"], row.get("shard_key")) for row in rows]

    # ---- Fenced writes (steps too), messages, events and streams ----

    def _check_fence(self, row: asyncpg.Record | None, workflow_id: str) -> bool:
        """Raise if the fenced write found the workflow gone, cancelled or owned elsewhere."""
        if row is None:
            raise NonExistentWorkflowError(workflow_id)
        if row["status"] == CANCELLED:
            raise WorkflowCancelledError(workflow_id)
        if row["status"] != PENDING or not row["owned"]:
            raise WorkflowConflictError(workflow_id)
        return bool(row["inserted"])

    async def _recorded_or_existing(
        self, row: asyncpg.Record | None, workflow_id: str, function_id: int, function_name: str
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

    async def send(self, destination_id: str, message_uuid: str, topic: str, message: str
                   ) -> None:
        """Send from outside a workflow; idempotent by ``message_uuid``."""
        query = self.sql.send_message(destination_id, message_uuid, topic, message)
        try:
            await self._execute(query, f"sending to {destination_id}")
        except asyncpg.ForeignKeyViolationError:
            raise NonExistentWorkflowError(destination_id) from None

    async def send_fenced(self, workflow_id: str, owner_xid: str, destination_id: str,
                          message_uuid: str, topic: str, message: str) -> None:
        query = self.sql.send_message_fenced(workflow_id, owner_xid, destination_id,
                                             message_uuid, topic, message)
        row = await self._fetchrow_fk(query, f"sending to {destination_id}", destination_id)
        self._check_fence(row, workflow_id)

    async def send_recorded(self, workflow_id: str, function_id: int, owner_xid: str,
                            destination_id: str, message_uuid: str, topic: str, message: str
                            ) -> StepRecord | None:
        query = self.sql.send_message_recorded(workflow_id, function_id, owner_xid,
                                               destination_id, message_uuid, topic, message,
                                               now_ms())
        row = await self._fetchrow_fk(query, f"sending to {destination_id}", destination_id)
        return await self._recorded_or_existing(row, workflow_id, function_id, "DBOS.send")

    async def send_recorded_across(self, sender: WorkflowAddress, function_id: int,
                                   owner_xid: str, destination: WorkflowAddress,
                                   message_uuid: str, topic: str, message: str
                                   ) -> StepRecord | None:
        """A workflow's send to a workflow under another shard key: the sender's checkpoint
        and the message, one statement per key, in one transaction, so the message lands
        only with the checkpoint. Each statement is built under its own key alone: the
        destination may have the sender's ID."""
        now = now_ms()
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

    async def consume_message(self, workflow_id: str, function_id: int, owner_xid: str,
                              topic: str) -> tuple[bool, str | None, str | None]:
        """recv's consuming write: (found, message, serialization); found is False if none."""
        query = self.sql.consume_message(workflow_id, function_id, owner_xid, topic, now_ms())
        row = await self._fetchrow(query, f"receiving for {workflow_id}")
        self._check_fence(row, workflow_id)
        assert row is not None
        if row["inserted"]:
            return True, row["message"], row["serialization"]
        if row["recorded"]:
            record = await self._existing_step(workflow_id, function_id, "DBOS.recv")
            if record is not None:
                return True, record.output, record.serialization
        return False, None, None

    async def set_event_recorded(self, workflow_id: str, function_id: int, owner_xid: str,
                                 key: str, value: str) -> StepRecord | None:
        query = self.sql.set_event_recorded(workflow_id, function_id, owner_xid, key, value,
                                            now_ms())
        row = await self._fetchrow(query, f"setting event {key!r} of {workflow_id}")
        return await self._recorded_or_existing(row, workflow_id, function_id, "DBOS.setEvent")

    async def set_event_fenced(self, workflow_id: str, owner_xid: str, key: str, value: str
                               ) -> None:
        query = self.sql.set_event_fenced(workflow_id, owner_xid, key, value)
        self._check_fence(await self._fetchrow(query, f"setting event {key!r}"), workflow_id)

    async def get_event(self, workflow_id: str, key: str) -> tuple[str, str | None] | None:
        row = await self._fetchrow(self.sql.get_event(workflow_id, key), "reading an event")
        return (row["value"], row["serialization"]) if row is not None else None

    async def get_all_events(self, workflow_id: str) -> list[tuple[str, str, str | None]]:
        rows = await self._fetch(self.sql.get_all_events(workflow_id), "reading events")
        return [(row["key"], row["value"], row["serialization"]) for row in rows]

    async def _write_stream(self, query: Query, workflow_id: str, key: str
                            ) -> asyncpg.Record | None:
        # Two writers can derive the same next offset; the loser fails the primary key (the
        # whole statement rolls back) and simply runs again.
        for _ in range(100):
            try:
                return await self._fetchrow(query, f"writing stream {key!r} of {workflow_id}")
            except asyncpg.UniqueViolationError:
                await asyncio.sleep(0)
        raise RuntimeError(f"Could not append to stream {key!r} of {workflow_id}")

    async def write_stream_recorded(self, workflow_id: str, function_id: int,
                                    function_name: str, owner_xid: str, key: str, value: str
                                    ) -> StepRecord | None:
        query = self.sql.write_stream_recorded(workflow_id, function_id, function_name,
                                               owner_xid, key, value, now_ms())
        row = await self._write_stream(query, workflow_id, key)
        return await self._recorded_or_existing(row, workflow_id, function_id, function_name)

    async def write_stream_fenced(self, workflow_id: str, owner_xid: str, key: str, value: str,
                                  function_id: int = 0) -> None:
        query = self.sql.write_stream_fenced(workflow_id, owner_xid, key, value, function_id)
        self._check_fence(await self._write_stream(query, workflow_id, key), workflow_id)

    async def read_stream_value(self, workflow_id: str, key: str, offset: int
                                ) -> tuple[str | None, str | None, str | None, bool]:
        """(writer status or None if no workflow, value, serialization, whether found)."""
        row = await self._fetchrow(self.sql.read_stream_value(workflow_id, key, offset),
                                   "reading a stream")
        if row is None:
            return None, None, None, False
        found = row["stream_offset"] is not None
        return row["status"], row["value"], row["serialization"], found

    async def completed_among(self, workflow_ids: Sequence[str]) -> set[str]:
        rows = await self._fetch(self.sql.completed_among(workflow_ids), "reading statuses")
        return {row["workflow_uuid"] for row in rows}

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
