"""Queue operations of the system database: registration, the claim policy, partitions,
delays and deduplication (see dbos_async/_executor/dispatcher.py)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import asyncpg

from dbos_async._sysdb.core import DatabaseCore
from dbos_async._sysdb.management.operations import JobConnection
from dbos_async._sysdb.records import WorkflowRow, workflow_row
from dbos_async._sysdb.statements import QUEUE_COLUMNS, Payload, QueueRecord
from dbos_async.errors import QueueNotFoundError

T = TypeVar("T")


@dataclass(frozen=True)
class Claim:
    """What a queue claim started: the rows (with partition keys), and when a rate limit
    that stopped it frees a slot (epoch ms), if known."""

    rows: list[tuple[WorkflowRow, str | None]]
    retry_at_ms: int | None = None
    spent: bool = False
    """Whether a shared limit stopped it (concurrency or rate limit spent): the queue has
    work in flight, so its claim loop keeps polling at its own interval."""


@dataclass(frozen=True)
class QueuePoll:
    """What the queue watcher's poll found: the queues of workflows it made ENQUEUED
    (DELAYED ones now due), the polled queues holding startable work, and when the next
    DELAYED workflow is due (epoch ms), if any."""

    promoted: list[str]
    enqueued: list[str]
    next_due_ms: int | None


def _claimed(row: asyncpg.Record) -> tuple[WorkflowRow, str | None]:
    return workflow_row(row), row["queue_partition_key"]


class QueueOperations(DatabaseCore):
    async def upsert_queue(self, queue: QueueRecord) -> None:
        query = self.sql.upsert_queue(queue, self.clock.now_ms())
        row = await self._fetchrow(query, f"registering queue {queue.name!r}")
        if row is None:  # the name belongs to another application
            owner = await self._fetchrow(self.sql.queue_owner(queue.name),
                                         f"reading the owner of queue {queue.name!r}")
            self._check_owner("Queue", queue.name,
                              owner["application_name"] if owner is not None else None)

    async def update_queue(self, name: str,
                           change: Callable[[QueueRecord], QueueRecord]) -> QueueRecord:
        """Store ``change(current settings)`` as the queue's settings, in one transaction
        with the read (``change`` may raise to refuse: nothing is written). An unknown name
        raises :class:`QueueNotFoundError`, a queue another application owns
        :class:`ApplicationOwnershipError`. Returns the stored settings."""

        async def run(conn: JobConnection, current: QueueRecord) -> QueueRecord:
            updated = change(current)
            q = self.sql.update_queue(updated, self.clock.now_ms())
            await conn.execute(q.sql, *q.params)
            return updated

        return await self._on_locked_queue(name, f"updating queue {name!r}", run)

    async def delete_queue(self, name: str) -> None:
        """Delete a stored queue; an unknown name raises :class:`QueueNotFoundError`, a
        queue another application owns :class:`ApplicationOwnershipError`."""

        async def run(conn: JobConnection, current: QueueRecord) -> None:
            q = self.sql.delete_queue(name)
            await conn.execute(q.sql, *q.params)

        await self._on_locked_queue(name, f"deleting queue {name!r}", run)

    async def _on_locked_queue(
        self, name: str, what: str,
        operation: Callable[[JobConnection, QueueRecord], Awaitable[T]],
    ) -> T:
        """Run ``operation`` on a queue's settings in a transaction holding its row."""
        lock = self.sql.lock_queue(name)

        async def run() -> T:
            async with self.locking_transaction() as conn:
                row = await conn.fetchrow(lock.sql, *lock.params)
                if row is None:
                    raise QueueNotFoundError(name)
                self._check_owner("Queue", name, row["application_name"])
                current = QueueRecord(**{c: row[c] for c in QUEUE_COLUMNS})
                return await operation(conn, current)

        return await self._retried(what, run)

    async def list_queues(self, names: Sequence[str] | None = None) -> list[QueueRecord]:
        rows = await self._fetch(self.sql.list_queues(names), "reading queues")
        return [QueueRecord(**dict(row)) for row in rows]

    async def queue_depths(self) -> dict[str, dict[str, int]]:
        """``{queue name: {status: workflows}}`` of the workflows waiting or running on a
        queue (statuses without any are left out)."""
        depths: dict[str, dict[str, int]] = {}
        for row in await self._observed_fetch(self.sql.queue_depths(),
                                              "counting queued workflows"):
            depths.setdefault(row["queue_name"], {})[row["status"]] = row["workflows"]
        return depths

    async def sample_depths(self, queue_names: Sequence[str], minute_ms: int,
                            keep_since_ms: int) -> None:
        """Store the queues' waiting counts as the minute's depth samples, unless sampled
        already, and drop this application's samples before ``keep_since_ms`` (see the
        statement). Only where the schema has their table."""
        if self.depth_samples_table:
            await self._execute(self.sql.sample_depths(queue_names, minute_ms,
                                                       self.clock.now_ms(), keep_since_ms),
                                "sampling queue depths")

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
        now = self.clock.now_ms()
        if not queue.shared_budget:
            q = self.sql.claim_startable(queue.name, partition_key, names, application_version,
                                         room, executor_id, now)
            return Claim([_claimed(row) for row in await self.pool.fetch(q.sql, *q.params)])
        async with self.locking_transaction(isolation="serializable") as conn:
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
                return Claim([], retry_at, spent=True)
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
                return Claim([], spent=True)
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
        names: Sequence[str], cap: int, after: str | None = None,
    ) -> Claim:
        """Partition concurrency 1 without queue-wide limits: start each idle partition's
        head-of-line workflow, the partitions walked from just after ``after``, in one
        READ COMMITTED transaction (see the statements). The rows come in the walk's order."""
        async with self.locking_transaction() as conn:
            q = self.sql.partition_heads(queue.name, application_version, cap, after)
            heads = [r["workflow_uuid"] for r in await conn.fetch(q.sql, *q.params)]
            if not heads:
                return Claim([])
            q = self.sql.lock_partition_heads(heads, queue.name, names)
            locked = [r["workflow_uuid"] for r in await conn.fetch(q.sql, *q.params)]
            if not locked:
                return Claim([])
            q = self.sql.flip_claimed(locked, queue.name, executor_id, application_version,
                                      False, self.clock.now_ms(), partition_heads=True)
            flipped = {r["workflow_uuid"]: r for r in await conn.fetch(q.sql, *q.params)}
        return Claim([_claimed(flipped[i]) for i in heads if i in flipped])

    async def dequeue_scopes(self, queue_name: str) -> list[str]:
        """The shard keys with ENQUEUED work on the queue (sharded databases)."""
        query = self.sql.dequeue_scopes(queue_name, distributed=self.routes_single_tables)
        rows = await self._fetch(query, "reading dequeue scopes")
        return [row["shard_key"] for row in rows]

    async def queue_partitions(self, queue_name: str, cap: int,
                               after: str | None = None) -> list[str]:
        """The queue's partitions with ENQUEUED work (at most ``cap``), in key order from
        just after ``after`` round to it."""
        rows = await self._fetch(self.sql.queue_partitions(queue_name, cap, after),
                                 "reading partitions")
        return [row["pk"] for row in rows]

    async def poll_queues(self, queue_names: Sequence[str], *, names: Sequence[str],
                          application_version: str | None) -> QueuePoll:
        """Promote due DELAYED workflows and look for startable work on ``queue_names``,
        in one statement (see the statement's builder)."""
        query = self.sql.poll_queues(self.clock.now_ms(), queue_names, names, application_version)
        row = await self._fetchrow(query, "polling the queues")
        if row is None:
            return QueuePoll([], [], None)
        return QueuePoll(list(row["promoted"] or []), list(row["enqueued"] or []),
                         row["next_due"])

    async def find_deduplicated(self, queue_name: str, deduplication_id: str
                                ) -> tuple[str, str] | None:
        row = await self._fetchrow(self.sql.find_deduplicated(queue_name, deduplication_id),
                                   "reading a deduplicated workflow")
        return (row["workflow_uuid"], row["name"]) if row is not None else None

    async def debounce_existing(self, queue_name: str, key: str, name: str, inputs: Payload,
                                delay_until_ms: int) -> str | None:
        query = self.sql.debounce_existing(queue_name, key, name, inputs, delay_until_ms,
                                           self.clock.now_ms())
        # Idempotent: a retry sets the same delay and inputs again.
        row = await self._fetchrow(query, f"debouncing {key!r} on {queue_name!r}")
        return row["workflow_uuid"] if row is not None else None
