"""Operating workflows in the system database: cancel, delete, list, steps, application
versions, and the maintenance jobs (retention, global timeout) under an advisory lock.

The statements are built on the seam of :class:`~dbos_async.sysdb.statements.Statements`
(``wf_in``, ``wf_join``, ``scoped``, ``global_``), so a sharded database routes them too.
Like the rest of the system database layer this stores and returns strings; the executor
turns them into typed values.
"""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeAlias, TypeVar

import asyncpg
from asyncpg.pool import PoolConnectionProxy

from dbos_async.errors import NonExistentWorkflowError
from dbos_async.sysdb.statements import (
    CANCELLED,
    DELAYED,
    ENQUEUED,
    ERROR,
    MAX_RECOVERY_ATTEMPTS_EXCEEDED,
    PENDING,
    SUCCESS,
    Params,
    Query,
    Statements,
)

if TYPE_CHECKING:
    from dbos_async.sysdb.database import SystemDatabase

T = TypeVar("T")

JobConnection: TypeAlias = "PoolConnectionProxy[asyncpg.Record]"
"""The connection a locked job runs its statements on (inside the lock's transaction)."""

TERMINAL_STATUSES = (SUCCESS, ERROR, CANCELLED, MAX_RECOVERY_ATTEMPTS_EXCEEDED)
"""Statuses a workflow never leaves by itself; the retention job deletes only these."""
IN_FLIGHT_STATUSES = (PENDING, ENQUEUED, DELAYED)
"""Statuses the global timeout cancels."""
QUEUED_STATUSES = (DELAYED, ENQUEUED, PENDING)
"""What ``list_queued_workflows`` lists by default (with a queue name)."""

PAYLOAD_TABLES = ("workflow_input", "workflow_output", "operation_outputs")
"""Tables of a workflow without a foreign key to workflow_status: deleted explicitly.
notifications, workflow_events, workflow_events_history and streams cascade."""

BACKGROUND_JOB_LOCK_IDLE_TIMEOUT_MS = 5000
"""A job lock holder idle in its transaction this long (a frozen process) loses its session,
and with it the lock."""


def advisory_lock_key(name: str) -> int:
    """The leading 8 bytes of SHA-256 of ``name``, big-endian, signed: a bigint lock key."""
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big", signed=True)


def job_lock_key(schema: str, job_name: str) -> int:
    """The advisory lock key of a background job (as the seed names it, no application)."""
    return advisory_lock_key(f"dbos.background_job.{schema}..{job_name}")


@dataclass(frozen=True)
class WorkflowFilter:
    """Filters of a workflow listing; list-valued filters match any of their values.

    Times are epoch milliseconds on ``created_at`` (``start_ms`` inclusive, ``end_ms``
    inclusive).
    """

    workflow_ids: Sequence[str] | None = None
    statuses: Sequence[str] | None = None
    names: Sequence[str] | None = None
    start_ms: int | None = None
    end_ms: int | None = None
    queue_names: Sequence[str] | None = None
    queues_only: bool = False
    parent_workflow_ids: Sequence[str] | None = None
    forked_from: Sequence[str] | None = None
    executor_ids: Sequence[str] | None = None
    application_versions: Sequence[str] | None = None
    authenticated_users: Sequence[str] | None = None
    workflow_id_prefixes: Sequence[str] | None = None
    limit: int | None = None
    offset: int | None = None
    sort_desc: bool = False
    load_input: bool = False
    load_output: bool = False


@dataclass(frozen=True)
class VersionRecord:
    version_id: str
    version_name: str
    version_timestamp: int
    created_at: int
    application_name: str | None = None


@dataclass
class CancelResult:
    """Which workflows a cancel changed (those already finished or cancelled are left)."""

    cancelled: list[str] = field(default_factory=list)


class ControlStatements:
    """Statement builders of the operations, on a :class:`Statements` seam."""

    def __init__(self, sql: Statements) -> None:
        self.sql = sql

    def table(self, name: str) -> str:
        return self.sql.table(name)

    def existing(self, workflow_ids: Sequence[str]) -> Query:
        p = Params()
        return Query(
            f"""SELECT workflow_uuid FROM {self.table('workflow_status')}
                WHERE {self.sql.wf_in(None, workflow_ids, p)}""",
            p.values,
        )

    def cancel(self, workflow_ids: Sequence[str], now_ms: int) -> Query:
        """CANCELLED, unless finished or already cancelled (so a second cancel is a no-op);
        clearing the owner fences the running execution, clearing the queue and dedup ID
        frees its queue slot."""
        p = Params()
        return self._cancel_where(
            f"""{self.sql.wf_in(None, workflow_ids, p)}
                AND status <> ALL({p([SUCCESS, ERROR, CANCELLED], 'text[]')})""", now_ms, p)

    def _cancel_where(self, predicate: str, now_ms: int, p: Params) -> Query:
        """Cancel the rows matching ``predicate``; returns each one's ID and the queue it
        was on (so that queue's dispatchers can be told a slot is free)."""
        table = self.table("workflow_status")
        now = p(now_ms, "bigint")
        return Query(
            f"""WITH target AS (
                  SELECT workflow_uuid, queue_name FROM {table}
                  WHERE {predicate}
                  FOR UPDATE
                )
                UPDATE {table} ws
                SET status = {p(CANCELLED)}, owner_xid = NULL, queue_name = NULL,
                    deduplication_id = NULL, started_at_epoch_ms = NULL,
                    updated_at = {now}, completed_at = {now}
                FROM target WHERE {self.sql.wf_join('ws', 'target')}
                RETURNING ws.workflow_uuid, target.queue_name""",
            p.values,
        )

    def direct_children(self, workflow_ids: Sequence[str]) -> Query:
        p = Params()
        return Query(
            f"""SELECT workflow_uuid FROM {self.table('workflow_status')}
                WHERE {self.sql.scoped(None, p)}
                  AND parent_workflow_id = ANY({p(list(workflow_ids), 'text[]')})""",
            p.values,
        )

    def delete(self, workflow_ids: Sequence[str]) -> list[Query]:
        """Every row of the workflows: the payload tables, then the status row (which
        cascades to notifications, events, event history and streams)."""
        queries = []
        for table in (*PAYLOAD_TABLES, "workflow_status"):
            p = Params()
            queries.append(Query(
                f"DELETE FROM {self.table(table)} WHERE {self.sql.wf_in(None, workflow_ids, p)}",
                p.values,
            ))
        return queries

    def cancelled_among(self, workflow_ids: Sequence[str]) -> Query:
        p = Params()
        return Query(
            f"""SELECT workflow_uuid FROM {self.table('workflow_status')}
                WHERE {self.sql.wf_in(None, workflow_ids, p)} AND status = {p(CANCELLED)}""",
            p.values,
        )

    def list_workflows(self, f: WorkflowFilter) -> Query:
        """The one listing statement: every filter a parameter, payloads joined on demand."""
        p = Params()
        columns = [f"ws.{c}" for c in self.sql.STATUS_COLUMNS]
        joins: list[str] = []
        if f.load_input:
            columns.append("COALESCE(wi.inputs, ws.inputs) AS inputs")
            joins.append(
                f"LEFT JOIN {self.table('workflow_input')} wi ON {self.sql.wf_join('wi', 'ws')}"
            )
        if f.load_output:
            columns += ["COALESCE(wo.output, ws.output) AS output",
                        "COALESCE(wo.error, ws.error) AS error"]
            joins.append(
                f"LEFT JOIN {self.table('workflow_output')} wo ON {self.sql.wf_join('wo', 'ws')}"
            )
        where = [self.sql.scoped("ws", p)]

        def any_of(column: str, values: Sequence[str] | None) -> None:
            if values is not None:
                where.append(f"ws.{column} = ANY({p(list(values), 'text[]')})")

        if f.workflow_ids is not None:
            where.append(f"ws.workflow_uuid = ANY({p(list(f.workflow_ids), 'text[]')})")
        statuses = f.statuses
        if statuses is None and f.queues_only:
            statuses = QUEUED_STATUSES
        any_of("status", statuses)
        any_of("name", f.names)
        any_of("queue_name", f.queue_names)
        if f.queues_only:
            where.append("ws.queue_name IS NOT NULL")
        any_of("parent_workflow_id", f.parent_workflow_ids)
        any_of("forked_from", f.forked_from)
        any_of("executor_id", f.executor_ids)
        any_of("application_version", f.application_versions)
        any_of("authenticated_user", f.authenticated_users)
        if f.start_ms is not None:
            where.append(f"ws.created_at >= {p(f.start_ms, 'bigint')}")
        if f.end_ms is not None:
            where.append(f"ws.created_at <= {p(f.end_ms, 'bigint')}")
        if f.workflow_id_prefixes is not None:
            # starts_with, not LIKE: a prefix's own % and _ match literally.
            where.append(
                "EXISTS (SELECT 1 FROM unnest("
                f"{p(list(f.workflow_id_prefixes), 'text[]')}) AS prefix "
                "WHERE starts_with(ws.workflow_uuid, prefix))"
            )
        order = "DESC" if f.sort_desc else "ASC"
        tail = f"ORDER BY ws.created_at {order}, ws.workflow_uuid {order}"
        if f.limit is not None:
            tail += f" LIMIT {p(f.limit, 'bigint')}"
        if f.offset is not None:
            tail += f" OFFSET {p(f.offset, 'bigint')}"
        return Query(
            f"""SELECT {', '.join(columns)}
                FROM {self.table('workflow_status')} ws {' '.join(joins)}
                WHERE {' AND '.join(where)}
                {tail}""",
            p.values,
        )

    def list_steps(self, workflow_id: str) -> Query:
        p = Params()
        return Query(
            f"""SELECT function_id, function_name, output, error, child_workflow_id,
                       started_at_epoch_ms, completed_at_epoch_ms, serialization
                FROM {self.table('operation_outputs')}
                WHERE {self.sql.wf(None, workflow_id, p)}
                ORDER BY function_id""",
            p.values,
        )

    # ---- Application versions ----

    VERSION_COLUMNS = "version_id, version_name, version_timestamp, created_at, application_name"

    def list_versions(self) -> Query:
        p = Params()
        return Query(
            f"""SELECT {self.VERSION_COLUMNS} FROM {self.table('application_versions')}
                WHERE {self.sql.global_(None, p)}
                ORDER BY version_timestamp DESC, version_name""",
            p.values,
        )

    def latest_version(self) -> Query:
        p = Params()
        return Query(
            f"""SELECT {self.VERSION_COLUMNS} FROM {self.table('application_versions')}
                WHERE {self.sql.global_(None, p)}
                ORDER BY version_timestamp DESC LIMIT 1""",
            p.values,
        )

    def set_latest_version(self, version_name: str, now_ms: int) -> Query:
        """Bump ``version_name`` above every other version (registering it if unknown)."""
        p = Params()
        table = self.table("application_versions")
        # Strictly later than the newest, even if the clock is behind a peer's.
        stamp = (f"GREATEST({p(now_ms, 'bigint')}, (SELECT COALESCE(max(version_timestamp), 0) + 1"
                 f" FROM {table} WHERE {self.sql.global_(None, p)}))")
        name = p(version_name)
        return Query(
            f"""WITH bumped AS (
                  UPDATE {table} SET version_timestamp = {stamp}
                  WHERE {self.sql.global_(None, p)} AND version_name = {name}
                  RETURNING 1
                )
                INSERT INTO {table} (version_id, version_name, version_timestamp, created_at)
                SELECT gen_random_uuid()::text, {name}, {stamp}, {p(now_ms, 'bigint')}
                WHERE NOT EXISTS (SELECT 1 FROM bumped)
                ON CONFLICT DO NOTHING""",
            p.values,
        )

    # ---- Maintenance ----

    def try_job_lock(self, key: int) -> Query:
        p = Params()
        return Query(
            f"""SELECT pg_try_advisory_xact_lock({p(key, 'bigint')}) AS acquired
                FROM set_config('idle_in_transaction_session_timeout',
                                {p(str(BACKGROUND_JOB_LOCK_IDLE_TIMEOUT_MS))}, true)""",
            p.values,
        )

    def delete_terminal_batch(self, cutoff_ms: int, batch_size: int) -> Query:
        """Delete up to ``batch_size`` terminal workflows that finished (or, never started,
        were created) before ``cutoff_ms``, with every row they own; returns their IDs."""
        p = Params()
        victims = f"""victims AS (
                  SELECT workflow_uuid FROM {self.table('workflow_status')}
                  WHERE {self.sql.scoped(None, p)}
                    AND status = ANY({p(list(TERMINAL_STATUSES), 'text[]')})
                    AND COALESCE(completed_at, created_at) < {p(cutoff_ms, 'bigint')}
                  ORDER BY created_at
                  LIMIT {p(batch_size, 'bigint')}
                  FOR UPDATE SKIP LOCKED
                )"""
        ctes = [victims]
        for i, table in enumerate(PAYLOAD_TABLES):
            ctes.append(
                f"""d{i} AS (
                  DELETE FROM {self.table(table)} t USING victims
                  WHERE {self.sql.wf_join('t', 'victims')}
                  RETURNING 1
                )"""
            )
        ctes.append(
            f"""gone AS (
                  DELETE FROM {self.table('workflow_status')} t USING victims
                  WHERE {self.sql.wf_join('t', 'victims')}
                  RETURNING t.workflow_uuid
                )"""
        )
        return Query(f"WITH {', '.join(ctes)} SELECT workflow_uuid FROM gone", p.values)

    def cancel_created_before(self, cutoff_ms: int, now_ms: int) -> Query:
        p = Params()
        return self._cancel_where(
            f"""{self.sql.scoped(None, p)}
                AND status = ANY({p(list(IN_FLIGHT_STATUSES), 'text[]')})
                AND created_at < {p(cutoff_ms, 'bigint')}""", now_ms, p)


class WorkflowControl:
    """The operations, run on the system database's pool with its retry policy."""

    def __init__(self, sysdb: SystemDatabase) -> None:
        self.sysdb = sysdb
        self.sql = ControlStatements(sysdb.sql)

    async def _retried(self, what: str, operation: Callable[[], Awaitable[T]]) -> T:
        return await self.sysdb._retried(what, operation)

    async def _fetch(self, query: Query, what: str) -> list[asyncpg.Record]:
        pool = self.sysdb.pool
        return await self._retried(what, lambda: pool.fetch(query.sql, *query.params))

    async def cancel(self, workflow_ids: Sequence[str], *, children: bool,
                     now_ms: int) -> list[tuple[str, str | None]]:
        """Cancel the workflows (and, with ``children``, every descendant), in one
        transaction; unknown IDs raise :class:`NonExistentWorkflowError` and change nothing.
        Returns the IDs whose status changed, with the queue each one was on."""
        ids = list(dict.fromkeys(workflow_ids))

        async def run() -> list[tuple[str, str | None]]:
            async with self.sysdb.pool.acquire() as conn, conn.transaction():
                q = self.sql.existing(ids)
                found = {r["workflow_uuid"] for r in await conn.fetch(q.sql, *q.params)}
                missing = [i for i in ids if i not in found]
                if missing:
                    raise NonExistentWorkflowError(", ".join(missing))
                cancelled: list[tuple[str, str | None]] = []
                visited = set(ids)
                frontier = ids
                while frontier:
                    q = self.sql.cancel(frontier, now_ms)
                    cancelled += [(r["workflow_uuid"], r["queue_name"])
                                  for r in await conn.fetch(q.sql, *q.params)]
                    if not children:
                        break
                    q = self.sql.direct_children(frontier)
                    kids = [r["workflow_uuid"] for r in await conn.fetch(q.sql, *q.params)]
                    frontier = [k for k in kids if k not in visited]
                    visited.update(frontier)
                return cancelled

        return await self._retried("cancelling workflows", run)

    async def descendants(self, workflow_ids: Sequence[str]) -> list[str]:
        """Every workflow started by these, recursively (not including them)."""
        seen = set(workflow_ids)
        found: list[str] = []
        frontier = list(workflow_ids)
        while frontier:
            rows = await self._fetch(self.sql.direct_children(frontier), "reading children")
            frontier = [r["workflow_uuid"] for r in rows if r["workflow_uuid"] not in seen]
            seen.update(frontier)
            found += frontier
        return found

    async def delete(self, workflow_ids: Sequence[str]) -> None:
        """Delete every row of the workflows, in one transaction."""
        ids = list(dict.fromkeys(workflow_ids))
        if not ids:
            return
        queries = self.sql.delete(ids)

        async def run() -> None:
            async with self.sysdb.pool.acquire() as conn, conn.transaction():
                for q in queries:
                    await conn.execute(q.sql, *q.params)

        await self._retried("deleting workflows", run)

    async def cancelled_among(self, workflow_ids: Sequence[str]) -> set[str]:
        rows = await self._fetch(self.sql.cancelled_among(workflow_ids), "reading statuses")
        return {r["workflow_uuid"] for r in rows}

    async def list_workflows(self, f: WorkflowFilter) -> list[asyncpg.Record]:
        return await self._fetch(self.sql.list_workflows(f), "listing workflows")

    async def list_steps(self, workflow_id: str) -> list[asyncpg.Record]:
        return await self._fetch(self.sql.list_steps(workflow_id), "listing steps")

    async def list_versions(self) -> list[VersionRecord]:
        rows = await self._fetch(self.sql.list_versions(), "listing application versions")
        return [VersionRecord(**dict(r)) for r in rows]

    async def latest_version(self) -> VersionRecord | None:
        rows = await self._fetch(self.sql.latest_version(), "reading the latest version")
        return VersionRecord(**dict(rows[0])) if rows else None

    async def set_latest_version(self, version_name: str, now_ms: int) -> None:
        q = self.sql.set_latest_version(version_name, now_ms)
        pool = self.sysdb.pool
        await self._retried("setting the latest application version",
                            lambda: pool.execute(q.sql, *q.params))

    async def run_locked(self, job_name: str, job: Callable[[JobConnection], Awaitable[T]]
                         ) -> tuple[bool, T | None]:
        """Run ``job`` on a connection holding the job's transaction-scoped advisory lock,
        if no other executor holds it: (whether it ran, its result). The job's statements
        run in that transaction; the lock goes when it ends (rolled back or committed by
        the job's outcome)."""
        q = self.sql.try_job_lock(job_lock_key(self.sysdb.schema, job_name))
        async with self.sysdb.pool.acquire() as conn, conn.transaction():
            acquired = await conn.fetchval(q.sql, *q.params)
            if not acquired:
                return False, None
            return True, await job(conn)
