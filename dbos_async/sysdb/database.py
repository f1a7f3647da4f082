"""The system database: an asyncpg pool and every operation on workflow rows.

It stores and returns strings; serialization and types belong to the executor.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import asyncpg

from dbos_async.errors import (
    ApplicationOwnershipError,
    NondeterminismError,
    NonExistentWorkflowError,
    WorkflowCancelledError,
    WorkflowConflictError,
)
from dbos_async.sysdb import connection, migrations
from dbos_async.sysdb.notifications import (
    WORKFLOW_COMPLETION_CHANNEL,
    NotificationDispatcher,
)
from dbos_async.sysdb.retry import RetryPolicy
from dbos_async.sysdb.statements import (
    ACTIVE_STATUSES,
    CANCELLED,
    ERROR,
    PENDING,
    SUCCESS,
    NewWorkflow,
    ParentStep,
    Query,
    QueueRecord,
    Statements,
)

logger = logging.getLogger("dbos_async")

T = TypeVar("T")


def now_ms() -> int:
    return int(time.time() * 1000)


@dataclass(frozen=True)
class StepRecord:
    """A recorded step: its name and either its output or its error, as stored."""

    function_id: int
    function_name: str
    output: str | None
    error: str | None
    child_workflow_id: str | None
    serialization: str | None


@dataclass(frozen=True)
class WorkflowRow:
    """A workflow_status row as returned by the start and recovery statements."""

    workflow_id: str
    status: str
    name: str
    class_name: str | None
    config_name: str | None
    owner_xid: str | None
    serialization: str | None
    deadline_epoch_ms: int | None
    recovery_attempts: int
    inputs: str | None = None
    # Whether the workflow has recorded steps to load (unknown, so assumed, unless the
    # statement says).
    has_checkpoints: bool = True

    @classmethod
    def from_record(cls, row: asyncpg.Record) -> WorkflowRow:
        return cls(
            workflow_id=row["workflow_uuid"],
            status=row["status"],
            name=row["name"],
            class_name=row["class_name"],
            config_name=row["config_name"],
            owner_xid=row["owner_xid"],
            serialization=row["serialization"],
            deadline_epoch_ms=row["workflow_deadline_epoch_ms"],
            recovery_attempts=row["recovery_attempts"] or 0,
            inputs=row.get("inputs"),
            has_checkpoints=row.get("has_checkpoints", True),
        )


@dataclass(frozen=True)
class StartResult:
    """What starting a workflow found: the row, and whether this call created it."""

    row: WorkflowRow
    created: bool


@dataclass(frozen=True)
class Outcome:
    """A workflow's recorded state; output and error are set once it is terminal."""

    name: str
    status: str
    output: str | None
    error: str | None
    serialization: str | None

    @property
    def terminal(self) -> bool:
        return self.status not in ACTIVE_STATUSES


class SystemDatabase:
    """The statements of workflows, messaging and queues, run on one asyncpg pool with
    retries (the operator's statements are in :mod:`dbos_async.sysdb.control`)."""

    def __init__(
        self,
        url: str,
        *,
        schema: str = "dbos",
        pool_size: int = 10,
        connect_timeout: float = 10.0,
        retry_timeout: float = 60.0,
        connection_name: str = "dbos_async",
        application_name: str | None = None,
    ) -> None:
        self.url = url
        self.schema = schema
        self.sql = self.make_statements(migrations.quote_schema(schema))
        # Ownership of rows when several applications share this database (see
        # StatementBase.app_scope); None leaves everything unscoped.
        self.application_name = application_name
        self.sql.app_name = application_name
        self._pool_size = pool_size
        self._connect_timeout = connect_timeout
        self._connection_name = connection_name
        self._pool: asyncpg.Pool | None = None
        self._closing = False
        self._retry = RetryPolicy(max_elapsed=retry_timeout, stopping=lambda: self._closing)
        # Set by the executor once started; None means every wait polls.
        self.notifications: NotificationDispatcher | None = None

    def make_statements(self, quoted_schema: str) -> Statements:
        """The statement builder; a sharded database returns its own."""
        return Statements(quoted_schema)

    def notify(self, channel: str, key: str) -> None:
        """Announce a committed write: wake the waiters on (channel, key) here now and
        NOTIFY other processes (see :meth:`NotificationDispatcher.notify`); nothing before
        the dispatcher is started."""
        if self.notifications is not None:
            self.notifications.notify(channel, key)

    # ---- Lifecycle ----

    async def open(self, *, run_migrations: bool = True) -> None:
        """Create the database if allowed, migrate or verify the schema, and open the pool."""
        if run_migrations:
            await connection.ensure_database(self.url, self._connect_timeout)
        conn = await connection.connect(self.url, self._connect_timeout, self._connection_name)
        try:
            if run_migrations:
                await migrations.migrate(conn, self.schema)
            else:
                await migrations.verify(conn, self.schema)
        finally:
            await conn.close()
        self._pool = await connection.create_pool(
            self.url, self._pool_size, self._connect_timeout, self._connection_name
        )

    async def close(self) -> None:
        self._closing = True
        if self._pool is not None:
            pool, self._pool = self._pool, None
            await pool.close()

    @property
    def pool(self) -> asyncpg.Pool:
        if self._pool is None:
            raise RuntimeError("The system database is not open")
        return self._pool

    async def _retried(self, what: str, operation: Callable[[], Awaitable[T]]) -> T:
        return await self._retry.run(operation, what)

    async def _fetch(self, query: Query, what: str) -> list[asyncpg.Record]:
        return await self._retried(what, lambda: self.pool.fetch(query.sql, *query.params))

    async def _fetchrow(self, query: Query, what: str) -> asyncpg.Record | None:
        return await self._retried(what, lambda: self.pool.fetchrow(query.sql, *query.params))

    # ---- Workflows ----

    async def start_workflow(
        self, wf: NewWorkflow, creator_xid: str, parent: ParentStep | None = None
    ) -> StartResult:
        """Insert a workflow (or find the existing one with its ID), in one round trip.

        Safe to retry: a row carrying our creator token is ours even if the first attempt's
        reply was lost.
        """
        query = self.sql.insert_workflow(wf, creator_xid, parent)
        row = await self._fetchrow(query, f"starting workflow {wf.workflow_id}")
        if row is None:
            raise RuntimeError(f"Inserting workflow {wf.workflow_id} returned no row")
        if parent is not None and row["workflow_uuid"] is None:
            # The fence refused the insert: the parent was cancelled or handed to another owner.
            if row["parent_status"] == CANCELLED:
                raise WorkflowCancelledError(parent.workflow_id)
            raise WorkflowConflictError(parent.workflow_id)
        return StartResult(WorkflowRow.from_record(row), row["creator_xid"] == creator_xid)

    async def start_workflow_on(self, conn: asyncpg.Connection, wf: NewWorkflow,
                                creator_xid: str) -> StartResult:
        """Insert a workflow on the caller's connection (in the caller's transaction, if
        any); not retried, since the transaction is the caller's."""
        q = self.sql.insert_workflow(wf, creator_xid)
        row = await conn.fetchrow(q.sql, *q.params)
        if row is None:
            raise RuntimeError(f"Inserting workflow {wf.workflow_id} returned no row")
        return StartResult(WorkflowRow.from_record(row), row["creator_xid"] == creator_xid)

    async def send_on(self, conn: asyncpg.Connection, destination_id: str, message_uuid: str,
                      topic: str, message: str) -> None:
        """Insert a message on the caller's connection (see :meth:`send`)."""
        q = self.sql.send_message(destination_id, message_uuid, topic, message)
        try:
            await conn.execute(q.sql, *q.params)
        except asyncpg.ForeignKeyViolationError:
            raise NonExistentWorkflowError(destination_id) from None

    async def claim_pending(
        self, executor_id: str, application_version: str | None, exclude: Sequence[str] = ()
    ) -> list[WorkflowRow]:
        query = self.sql.claim_pending(executor_id, application_version, now_ms(), exclude)
        # Not retried: a lost reply would leave rows claimed under tokens we never learned;
        # recovery runs again on the next start and claims them afresh.
        rows = await self.pool.fetch(query.sql, *query.params)
        return [WorkflowRow.from_record(row) for row in rows]

    async def load_checkpoints(self, workflow_id: str) -> dict[int, StepRecord]:
        rows = await self._fetch(self.sql.load_checkpoints(workflow_id), "loading checkpoints")
        return {row["function_id"]: _step_record(row) for row in rows}

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
        row = await self._fetchrow(query, f"checkpointing step {function_id} of {workflow_id}")
        return await self._recorded_or_existing(row, workflow_id, function_id, function_name)

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

    async def cancel_workflows(self, workflow_ids: Sequence[str]) -> None:
        query = self.sql.cancel_workflows(workflow_ids, now_ms())
        await self._retried(
            "cancelling workflows", lambda: self.pool.execute(query.sql, *query.params)
        )

    async def get_workflow(
        self, workflow_id: str, *, load_input: bool = False, load_output: bool = False
    ) -> asyncpg.Record | None:
        query = self.sql.get_workflow(workflow_id, load_input=load_input, load_output=load_output)
        return await self._fetchrow(query, f"reading workflow {workflow_id}")

    async def get_outcome(self, workflow_id: str) -> Outcome | None:
        row = await self.get_workflow(workflow_id, load_output=True)
        if row is None:
            return None
        return Outcome(
            row["name"], row["status"], row["output"], row["error"], row["serialization"]
        )

    async def register_version(self, version_name: str) -> None:
        query = self.sql.register_version(version_name, now_ms())
        await self._retried(
            "registering the application version",
            lambda: self.pool.execute(query.sql, *query.params),
        )
        await self.check_version_owner(version_name)

    async def check_version_owner(self, version_name: str) -> None:
        """Raise if another application owns ``version_name`` (version names are unique
        across the applications sharing a system database)."""
        row = await self._fetchrow(self.sql.version_owner(version_name),
                                   "reading an application version's owner")
        self._check_owner("Application version", version_name,
                          row["application_name"] if row is not None else None)

    def _check_owner(self, kind: str, name: str, current: str | None) -> None:
        owner = self.application_name
        if current is None or owner is None or current == owner:
            return
        advice = (f"set a distinct application_version for {owner!r}"
                  if kind == "Application version"
                  else f"give {owner!r} a different {kind.lower()} name")
        raise ApplicationOwnershipError(
            f"{kind} {name!r} is already registered by application {current!r} in this "
            f"system database; {kind.lower()} names must be unique across the applications "
            f"sharing it: {advice}")

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
        record = _step_record(row)
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
            await self._retried(
                f"sending to {destination_id}", lambda: self.pool.execute(query.sql, *query.params)
            )
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
        with dispatcher.register(WORKFLOW_COMPLETION_CHANNEL, workflow_id) as waiter:
            while True:
                async with dispatcher.polling():
                    outcome = await self.get_outcome(workflow_id)
                if outcome is None:
                    raise NonExistentWorkflowError(workflow_id)
                if outcome.terminal:
                    return outcome
                await waiter.wait(delay)
                delay = min(delay * 2, poll_interval)

    # ---- Queues (see dbos_async/executor/dispatcher.py) ----

    async def upsert_queue(self, queue: QueueRecord) -> None:
        query = self.sql.upsert_queue(queue, now_ms())
        row = await self._fetchrow(query, f"registering queue {queue.name!r}")
        if row is None:  # the name belongs to another application
            owner = await self._fetchrow(self.sql.queue_owner(queue.name),
                                         f"reading the owner of queue {queue.name!r}")
            self._check_owner("Queue", queue.name,
                              owner["application_name"] if owner is not None else None)

    async def list_queues(self, names: Sequence[str] | None = None) -> list[QueueRecord]:
        rows = await self._fetch(self.sql.list_queues(names), "reading queues")
        return [QueueRecord(**dict(row)) for row in rows]

    async def claim_queued(
        self, queue: QueueRecord, partition_key: str | None, *, executor_id: str,
        application_version: str | None, names: Sequence[str], room: int | None,
    ) -> Claim:
        """Claim and start the queue's next workflows under every limit, in one transaction.

        ``room`` is what this executor's own limits (worker concurrency) allow; the shared
        limits are read here. A budget shared by every executor (concurrency, rate limit) is
        spent under SERIALIZABLE: the counts and the claimed rows are one snapshot, and a
        concurrent claim of the same budget, even of disjoint rows (executors running
        different functions, different partitions), fails one of the two with 40001 instead
        of overspending; with NOWAIT a claimer of locked rows fails at once with 55P03. The
        caller backs off and retries. Without a shared budget there is nothing to count: one
        autocommit statement locks (SKIP LOCKED: claimers take disjoint rows and never wait)
        and starts the rows. Not retried here: a lost reply leaves the rows PENDING on this
        executor, and recovery re-enqueues them.
        """
        now = now_ms()
        if not queue.shared_budget:
            q = self.sql.claim_startable(queue.name, partition_key, names, application_version,
                                         room, executor_id, now)
            return Claim([_claimed(row) for row in await self.pool.fetch(q.sql, *q.params)])
        async with self.pool.acquire() as conn, conn.transaction(isolation="serializable"):
            limit = room
            retry_at: int | None = None
            limiters: list[tuple[int | None, float | None, str | None]] = [
                (queue.rate_limit_max, queue.rate_limit_period_sec, None)]
            if partition_key is not None:
                limiters.append((queue.partition_rate_limit_max,
                                 queue.partition_rate_limit_period_sec, partition_key))
            for maximum, period, key in limiters:
                if maximum is None or period is None:
                    continue
                window = int(period * 1000)
                q = self.sql.queue_started_since(queue.name, key, now - window)
                row = await conn.fetchrow(q.sql, *q.params)
                assert row is not None
                left = maximum - int(row["started"])
                if left <= 0 and row["oldest"] is not None:
                    retry_at = max(retry_at or 0, int(row["oldest"]) + window)
                limit = left if limit is None else min(limit, left)
            if limit is not None and limit <= 0:
                return Claim([], retry_at)
            budgets: list[tuple[int | None, str | None]] = [(queue.concurrency, None)]
            if partition_key is not None:
                budgets.append((queue.partition_concurrency, partition_key))
            for budget, key in budgets:
                if budget is None:
                    continue
                q = self.sql.queue_pending_count(queue.name, key)
                running = int(await conn.fetchval(q.sql, *q.params))
                left = budget - running
                limit = left if limit is None else min(limit, left)
            if limit is not None and limit <= 0:
                return Claim([])
            q = self.sql.select_startable(queue.name, partition_key, names,
                                          application_version, limit)
            ids = [r["workflow_uuid"] for r in await conn.fetch(q.sql, *q.params)]
            if not ids:
                return Claim([])
            rate_limited = (queue.rate_limit_max is not None
                            or queue.partition_rate_limit_max is not None)
            q = self.sql.flip_claimed(ids, queue.name, executor_id, application_version,
                                      rate_limited, now)
            flipped = {r["workflow_uuid"]: r for r in await conn.fetch(q.sql, *q.params)}
        return Claim([_claimed(flipped[i]) for i in ids if i in flipped])

    async def unregistered_enqueued(
        self, queue_name: str, *, names: Sequence[str], known: Sequence[str],
        application_version: str | None, limit: int = 10,
    ) -> list[tuple[str, str]]:
        """[(function name, one workflow ID)] of the queue's ENQUEUED workflows whose function
        is not among ``names`` (nor ``known``): work this executor leaves for another."""
        query = self.sql.unregistered_enqueued(queue_name, names, known, application_version,
                                               limit)
        rows = await self._fetch(query, f"checking queue {queue_name!r} for unknown functions")
        return [(row["name"], row["workflow_uuid"]) for row in rows]

    async def claim_partition_heads(
        self, queue: QueueRecord, *, executor_id: str, application_version: str | None,
        names: Sequence[str], cap: int,
    ) -> Claim:
        """Partition concurrency 1 without queue-wide limits: start each idle partition's
        head-of-line workflow, in one READ COMMITTED transaction (see the statements)."""
        async with self.pool.acquire() as conn, conn.transaction():
            q = self.sql.partition_heads(queue.name, application_version, cap)
            heads = [r["workflow_uuid"] for r in await conn.fetch(q.sql, *q.params)]
            if not heads:
                return Claim([])
            q = self.sql.lock_partition_heads(heads, queue.name, names)
            locked = [r["workflow_uuid"] for r in await conn.fetch(q.sql, *q.params)]
            if not locked:
                return Claim([])
            q = self.sql.flip_claimed(locked, queue.name, executor_id, application_version,
                                      False, now_ms(), partition_heads=True)
            flipped = {r["workflow_uuid"]: r for r in await conn.fetch(q.sql, *q.params)}
        return Claim([_claimed(flipped[i]) for i in heads if i in flipped])

    async def queue_partitions(self, queue_name: str, cap: int) -> list[str]:
        rows = await self._fetch(self.sql.queue_partitions(queue_name, cap), "reading partitions")
        return [row["pk"] for row in rows]

    async def promote_delayed(self) -> tuple[list[str], int | None]:
        """Make due DELAYED workflows ENQUEUED: (their queues, the next due time in ms)."""
        row = await self._fetchrow(self.sql.promote_delayed(now_ms()), "promoting delayed")
        if row is None:
            return [], None
        return list(row["queues"] or []), row["next_due"]

    async def requeue_pending(self, executor_id: str, application_version: str | None,
                              exclude: Sequence[str] = ()) -> list[tuple[str, str]]:
        """Re-enqueue this executor's PENDING queued workflows: [(workflow, queue)]."""
        query = self.sql.requeue_pending(executor_id, application_version, now_ms(), exclude)
        rows = await self._fetch(query, "re-enqueuing pending workflows")
        return [(row["workflow_uuid"], row["queue_name"]) for row in rows]

    async def dead_letter_pending(self, executor_id: str, application_version: str | None,
                                  max_attempts: int, exclude: Sequence[str] = ()) -> list[str]:
        query = self.sql.dead_letter_pending(executor_id, application_version, max_attempts,
                                             now_ms(), exclude)
        rows = await self._fetch(query, "dead-lettering workflows")
        return [row["workflow_uuid"] for row in rows]

    async def find_deduplicated(self, queue_name: str, deduplication_id: str
                                ) -> tuple[str, str] | None:
        row = await self._fetchrow(self.sql.find_deduplicated(queue_name, deduplication_id),
                                   "reading a deduplicated workflow")
        return (row["workflow_uuid"], row["name"]) if row is not None else None

    async def debounce_existing(self, queue_name: str, key: str, name: str, inputs: str,
                                delay_until_ms: int) -> str | None:
        query = self.sql.debounce_existing(queue_name, key, name, inputs, delay_until_ms,
                                           now_ms())
        # Idempotent: a retry sets the same delay and inputs again.
        row = await self._fetchrow(query, f"debouncing {key!r} on {queue_name!r}")
        return row["workflow_uuid"] if row is not None else None


@dataclass(frozen=True)
class Claim:
    """What a queue claim started: the rows (with partition keys), and when a rate limit
    that stopped it frees a slot (epoch ms), if known."""

    rows: list[tuple[WorkflowRow, str | None]]
    retry_at_ms: int | None = None


def _claimed(row: asyncpg.Record) -> tuple[WorkflowRow, str | None]:
    return WorkflowRow.from_record(row), row["queue_partition_key"]


def _step_record(row: asyncpg.Record) -> StepRecord:
    return StepRecord(
        function_id=row["function_id"],
        function_name=row["function_name"],
        output=row["output"],
        error=row["error"],
        child_workflow_id=row["child_workflow_id"],
        serialization=row["serialization"],
    )
