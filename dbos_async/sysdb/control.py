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
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeAlias, TypeVar

import asyncpg
from asyncpg.pool import PoolConnectionProxy

from dbos_async.errors import DBOSError, NonExistentWorkflowError
from dbos_async.sysdb.statements import (
    ACTIVE_STATUSES,
    CANCELLED,
    ENQUEUED,
    ERROR,
    MAX_RECOVERY_ATTEMPTS_EXCEEDED,
    PORTABLE_JSON,
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
"""Statuses a workflow never leaves by itself; the retention job deletes only these. The
others, ``ACTIVE_STATUSES``, are what the global timeout cancels, what
``list_queued_workflows`` lists by default and what a rewind refuses."""

PAYLOAD_TABLES = ("workflow_input", "workflow_output", "operation_outputs")
"""Tables of a workflow without a foreign key to workflow_status: deleted explicitly.
notifications, workflow_events, workflow_events_history and streams cascade."""

STREAM_CLOSED_SERIALIZED = '"__DBOS_STREAM_CLOSED__"'
"""A stream's close marker as stored: the sentinel every DBOS SDK uses, in portable JSON.
``close_stream`` writes it, ``read_stream`` stops at it, a rewind removes it past the cut."""

BACKGROUND_JOB_LOCK_IDLE_TIMEOUT_MS = 5000
"""A job lock holder idle in its transaction this long (a frozen process) loses its session,
and with it the lock."""


def advisory_lock_key(name: str) -> int:
    """The leading 8 bytes of SHA-256 of ``name``, big-endian, signed: a bigint lock key."""
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big", signed=True)


def job_lock_key(schema: str, job_name: str) -> int:
    """The advisory lock key of a background job, named as DBOS Transact names it."""
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
    # Owners to list (plus unclaimed rows); None: this application's own (every one when it
    # has no name), except for a lookup by workflow IDs, which is unscoped unless given.
    application_names: Sequence[str] | None = None
    # A JSON object (as text) the workflow's attributes must contain (jsonb @>).
    attributes: str | None = None
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
        columns, joins = self.sql.status_select(load_input=f.load_input,
                                                load_output=f.load_output)
        where = [self.sql.scoped("ws", p)]

        def any_of(column: str, values: Sequence[str] | None) -> None:
            if values is not None:
                where.append(f"ws.{column} = ANY({p(list(values), 'text[]')})")

        if f.workflow_ids is not None:
            where.append(f"ws.workflow_uuid = ANY({p(list(f.workflow_ids), 'text[]')})")
            # An ID-keyed read is an identity read: scoped only when asked.
            where.append(self.sql.app_scope("ws", p, f.application_names))
        else:
            where.append(self.sql.app_scope(
                "ws", p, f.application_names if f.application_names is not None
                else self.sql.app_name))
        if f.attributes is not None:
            # Containment, served by the GIN index idx_workflow_status_attributes.
            where.append(f"ws.attributes @> {p(f.attributes, 'jsonb')}")
        statuses = f.statuses
        if statuses is None and f.queues_only:
            statuses = ACTIVE_STATUSES
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
            f"""SELECT {columns}
                FROM {self.table('workflow_status')} ws {joins}
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

    def list_versions(self) -> Query:
        """This application's versions and unclaimed ones (all, when it has no name)."""
        p = Params()
        return Query(
            f"""SELECT {self.sql.VERSION_COLUMNS} FROM {self.table('application_versions')}
                WHERE {self.sql.global_(None, p)} AND {self.sql.own_scope(None, p)}
                ORDER BY version_timestamp DESC, version_name""",
            p.values,
        )

    def latest_version(self) -> Query:
        """The newest of this application's own and unclaimed versions."""
        p = Params()
        return Query(self.sql.latest_version_sql(p), p.values)

    def set_latest_version(self, version_name: str, now_ms: int) -> Query:
        """Bump ``version_name`` above every other version (registering it if unknown)."""
        p = Params()
        table = self.table("application_versions")
        # Strictly later than the newest, even if the clock is behind a peer's.
        stamp = (f"GREATEST({p(now_ms, 'bigint')}, (SELECT COALESCE(max(version_timestamp), 0) + 1"
                 f" FROM {table} WHERE {self.sql.global_(None, p)}))")
        name, app = p(version_name), p(self.sql.app_name, "text")
        # Only this application's own or an unclaimed version is bumped (and claimed); one
        # owned by another application is left alone (the caller then reports it).
        return Query(
            f"""WITH bumped AS (
                  UPDATE {table} SET version_timestamp = {stamp},
                    application_name = COALESCE(application_name, {app})
                  WHERE {self.sql.global_(None, p)} AND version_name = {name}
                    AND {self.sql.own_scope(None, p)}
                  RETURNING 1
                )
                INSERT INTO {table}
                  (version_id, version_name, version_timestamp, created_at, application_name)
                SELECT gen_random_uuid()::text, {name}, {stamp}, {p(now_ms, 'bigint')}, {app}
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
                AND status = ANY({p(list(ACTIVE_STATUSES), 'text[]')})
                AND created_at < {p(cutoff_ms, 'bigint')}""", now_ms, p)


    # ---- Resume, fork, rewind (DBOS Transact's resume, fork and rewind) ----

    def resume(self, workflow_ids: Sequence[str], queue_name: str, now_ms: int) -> Query:
        """Put the workflows back on ``queue_name`` as ENQUEUED, with a fresh start (no
        owner, attempts, deadline or dedup ID); SUCCESS and ERROR rows are left alone.
        Clearing the owner fences any execution still running somewhere."""
        p = Params()
        now = p(now_ms, "bigint")
        return Query(
            f"""UPDATE {self.table('workflow_status')}
                SET status = {p(ENQUEUED)}, owner_xid = NULL, queue_name = {p(queue_name)},
                    recovery_attempts = 0, workflow_deadline_epoch_ms = NULL,
                    deduplication_id = NULL, started_at_epoch_ms = NULL,
                    updated_at = {now}, completed_at = NULL
                WHERE {self.sql.wf_in(None, workflow_ids, p)}
                  AND status <> ALL({p([SUCCESS, ERROR], 'text[]')})
                RETURNING workflow_uuid""",
            p.values,
        )

    def lock_for_fork(self, workflow_id: str) -> Query:
        """The workflow's status and its highest recorded step, its row locked."""
        p = Params()
        return Query(
            f"""SELECT ws.status,
                       (SELECT max(oo.function_id) FROM {self.table('operation_outputs')} oo
                        WHERE {self.sql.wf_join('oo', 'ws')}) AS last_step
                FROM {self.table('workflow_status')} ws
                WHERE {self.sql.wf('ws', workflow_id, p)}
                FOR NO KEY UPDATE OF ws""",
            p.values,
        )

    def insert_fork(self, original_id: str, fork_id: str, queue_name: str,
                    application_version: str | None, timeout_ms: int | None,
                    now_ms: int) -> list[Query]:
        """The fork's status row (the original's identity, inputs and serialization,
        ENQUEUED on ``queue_name``, ``forked_from`` the original) and its inputs; and the
        original marked ``was_forked_from``."""
        p = Params()
        keys = {c: p(v) for c, v in self.sql.wf_values(fork_id).items()}
        now = p(now_ms, "bigint")
        status = Query(
            f"""INSERT INTO {self.table('workflow_status')} (
                  {''.join(f'{c}, ' for c in keys)}workflow_uuid, status, name, class_name,
                  config_name, queue_name, authenticated_user, assumed_role,
                  authenticated_roles, application_version, application_id, forked_from,
                  serialization, attributes, application_name, workflow_timeout_ms,
                  created_at, updated_at, recovery_attempts, priority)
                SELECT {''.join(f'{v}, ' for v in keys.values())}{p(fork_id)}, {p(ENQUEUED)},
                  name, class_name, config_name, {p(queue_name)}, authenticated_user,
                  assumed_role, authenticated_roles,
                  COALESCE({p(application_version)}, application_version), application_id,
                  workflow_uuid, serialization, attributes,
                  COALESCE(application_name, {p(self.sql.app_name, 'text')}),
                  {p(timeout_ms, 'bigint')}, {now}, {now}, 0, 0
                FROM {self.table('workflow_status')}
                WHERE {self.sql.wf(None, original_id, p)}""",
            p.values,
        )
        p = Params()
        keys = {c: p(v) for c, v in self.sql.wf_values(fork_id).items()}
        inputs = Query(
            f"""INSERT INTO {self.table('workflow_input')}
                  ({''.join(f'{c}, ' for c in keys)}workflow_uuid, inputs)
                SELECT {''.join(f'{v}, ' for v in keys.values())}{p(fork_id)},
                       COALESCE(wi.inputs, ws.inputs)
                FROM {self.table('workflow_status')} ws
                LEFT JOIN {self.table('workflow_input')} wi ON {self.sql.wf_join('wi', 'ws')}
                WHERE {self.sql.wf('ws', original_id, p)}""",
            p.values,
        )
        p = Params()
        marked = Query(
            f"""UPDATE {self.table('workflow_status')} SET was_forked_from = TRUE
                WHERE {self.sql.wf(None, original_id, p)}""",
            p.values,
        )
        return [status, inputs, marked]

    def copy_history(self, original_id: str, fork_id: str, start_step: int,
                     replacement_children: dict[str, str]) -> list[Query]:
        """Copy what the original recorded below ``start_step`` to the fork: its
        checkpoints (child IDs replaced as asked), streams, events history, and each
        event's latest value among those."""
        table = self.table
        queries = []
        p = Params()
        fork, start = p(fork_id), p(start_step, "integer")
        child = (f"""COALESCE((SELECT r.new FROM unnest({p(list(replacement_children), 'text[]')},
                       {p(list(replacement_children.values()), 'text[]')}) AS r(old, new)
                       WHERE r.old = oo.child_workflow_id), oo.child_workflow_id)"""
                 if replacement_children else "oo.child_workflow_id")
        queries.append(Query(
            f"""INSERT INTO {table('operation_outputs')} (workflow_uuid, function_id,
                  function_name, output, error, child_workflow_id, started_at_epoch_ms,
                  completed_at_epoch_ms, serialization, application_name)
                SELECT {fork}, oo.function_id, oo.function_name, oo.output, oo.error, {child},
                       oo.started_at_epoch_ms, oo.completed_at_epoch_ms, oo.serialization,
                       oo.application_name
                FROM {table('operation_outputs')} oo
                WHERE {self.sql.wf('oo', original_id, p)} AND oo.function_id < {start}""",
            p.values,
        ))
        p = Params()
        fork, start = p(fork_id), p(start_step, "integer")
        queries.append(Query(
            f"""INSERT INTO {table('streams')}
                  (workflow_uuid, key, value, serialization, "offset", function_id)
                SELECT {fork}, s.key, s.value, s.serialization, s."offset", s.function_id
                FROM {table('streams')} s
                WHERE {self.sql.wf('s', original_id, p)} AND s.function_id < {start}""",
            p.values,
        ))
        p = Params()
        fork, start = p(fork_id), p(start_step, "integer")
        queries.append(Query(
            f"""INSERT INTO {table('workflow_events_history')}
                  (workflow_uuid, function_id, key, value, serialization)
                SELECT {fork}, h.function_id, h.key, h.value, h.serialization
                FROM {table('workflow_events_history')} h
                WHERE {self.sql.wf('h', original_id, p)} AND h.function_id < {start}""",
            p.values,
        ))
        p = Params()
        fork, start = p(fork_id), p(start_step, "integer")
        queries.append(Query(
            f"""INSERT INTO {table('workflow_events')} (workflow_uuid, key, value, serialization)
                SELECT DISTINCT ON (h.key) {fork}, h.key, h.value, h.serialization
                FROM {table('workflow_events_history')} h
                WHERE {self.sql.wf('h', original_id, p)} AND h.function_id < {start}
                ORDER BY h.key, h.function_id DESC""",
            p.values,
        ))
        return queries

    def rewind(self, workflow_id: str, start_step: int) -> list[Query]:
        """Discard what the workflow recorded from ``start_step`` on (DBOS Transact's rewind):
        events published past the cut rolled back to their last value below it (the
        events history is the undo log), stream close markers past the cut removed so the
        replay can append, checkpoints and history past the cut deleted, messages consumed
        past the cut or not yet consumed deleted, and the recorded output deleted."""
        table = self.table
        queries = []

        def past_cut(key: str, p: Params, start: str) -> str:
            return f"""EXISTS (
                  SELECT 1 FROM {table('workflow_events_history')} discarded
                  WHERE {self.sql.wf('discarded', workflow_id, p)} AND discarded.key = {key}
                    AND discarded.function_id >= {start})"""

        p = Params()
        start = p(start_step, "integer")
        queries.append(Query(
            f"""DELETE FROM {table('workflow_events')} e
                WHERE {self.sql.wf('e', workflow_id, p)} AND {past_cut('e.key', p, start)}""",
            p.values,
        ))
        p = Params()
        start = p(start_step, "integer")
        queries.append(Query(
            f"""INSERT INTO {table('workflow_events')} (workflow_uuid, key, value, serialization)
                SELECT DISTINCT ON (h.key) h.workflow_uuid, h.key, h.value, h.serialization
                FROM {table('workflow_events_history')} h
                WHERE {self.sql.wf('h', workflow_id, p)} AND h.function_id < {start}
                  AND {past_cut('h.key', p, start)}
                ORDER BY h.key, h.function_id DESC""",
            p.values,
        ))
        p = Params()
        queries.append(Query(
            f"""DELETE FROM {table('streams')}
                WHERE {self.sql.wf(None, workflow_id, p)}
                  AND function_id >= {p(start_step, 'integer')}
                  AND value = {p(STREAM_CLOSED_SERIALIZED)}
                  AND serialization = {p(PORTABLE_JSON)}""",
            p.values,
        ))
        for name in ("operation_outputs", "workflow_events_history"):
            p = Params()
            queries.append(Query(
                f"""DELETE FROM {table(name)} WHERE {self.sql.wf(None, workflow_id, p)}
                      AND function_id >= {p(start_step, 'integer')}""",
                p.values,
            ))
        p = Params()
        queries.append(Query(
            f"""DELETE FROM {table('notifications')}
                WHERE {self.sql.wf(None, workflow_id, p, column='destination_uuid')}
                  AND (consumed_by_function_id >= {p(start_step, 'integer')}
                       OR consumed = false)""",
            p.values,
        ))
        p = Params()
        queries.append(Query(
            f"DELETE FROM {table('workflow_output')} WHERE {self.sql.wf(None, workflow_id, p)}",
            p.values,
        ))
        return queries

    def requeue_rewound(self, workflow_id: str, status: str, queue_name: str,
                        application_version: str | None, now_ms: int) -> Query:
        """Re-enqueue a rewound workflow; re-asserting the status read keeps a workflow
        that moved on underneath from being resurrected."""
        p = Params()
        return Query(
            f"""UPDATE {self.table('workflow_status')}
                SET status = {p(ENQUEUED)}, owner_xid = NULL, queue_name = {p(queue_name)},
                    recovery_attempts = 0, workflow_deadline_epoch_ms = NULL,
                    deduplication_id = NULL, started_at_epoch_ms = NULL, completed_at = NULL,
                    output = NULL, error = NULL, updated_at = {p(now_ms, 'bigint')},
                    application_version = COALESCE({p(application_version)},
                                                   application_version)
                WHERE {self.sql.wf(None, workflow_id, p)} AND status = {p(status)}""",
            p.values,
        )


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
                await self._require_existing(conn, ids)
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
        await self.sysdb.check_version_owner(version_name)

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

    # ---- Resume, fork, rewind ----

    async def resume(self, workflow_ids: Sequence[str], queue_name: str,
                     now_ms: int) -> list[str]:
        """Re-enqueue the workflows on ``queue_name`` (see :meth:`ControlStatements.resume`),
        in one transaction; unknown IDs raise :class:`NonExistentWorkflowError` and change
        nothing. Returns the IDs that were re-enqueued (a SUCCESS or ERROR one is not)."""
        ids = list(dict.fromkeys(workflow_ids))

        async def run() -> list[str]:
            async with self.sysdb.pool.acquire() as conn, conn.transaction():
                await self._require_existing(conn, ids)
                q = self.sql.resume(ids, queue_name, now_ms)
                return [r["workflow_uuid"] for r in await conn.fetch(q.sql, *q.params)]

        return await self._retried("resuming workflows", run)

    async def _require_existing(self, conn: JobConnection, ids: Sequence[str]) -> None:
        q = self.sql.existing(ids)
        found = {r["workflow_uuid"] for r in await conn.fetch(q.sql, *q.params)}
        missing = [i for i in ids if i not in found]
        if missing:
            raise NonExistentWorkflowError(", ".join(missing))

    async def _locked_for_fork(self, conn: JobConnection, workflow_id: str,
                               start_step: int) -> str:
        """Lock the workflow's row and check ``start_step`` against its recorded steps:
        from 0 to one past the last recorded step. Returns its status."""
        q = self.sql.lock_for_fork(workflow_id)
        row = await conn.fetchrow(q.sql, *q.params)
        if row is None:
            raise NonExistentWorkflowError(workflow_id)
        last = row["last_step"] if row["last_step"] is not None else -1
        if isinstance(start_step, bool) or not isinstance(start_step, int) \
                or not 0 <= start_step <= last + 1:
            raise DBOSError(
                f"start_step {start_step!r} is out of range for workflow {workflow_id!r}: "
                + (f"its recorded steps are 0..{last}, so start_step must be from 0 to "
                   f"{last + 1}" if last >= 0 else "it has no recorded step, so start_step "
                   "must be 0"))
        status: str = row["status"]
        return status

    async def fork(self, original_id: str, fork_id: str, start_step: int, *, queue_name: str,
                   application_version: str | None, timeout_ms: int | None,
                   replacement_children: dict[str, str], now_ms: int) -> None:
        """Create ``fork_id`` from ``original_id`` with its history below ``start_step``,
        in one transaction."""

        async def run() -> None:
            async with self.sysdb.pool.acquire() as conn, conn.transaction():
                await self._locked_for_fork(conn, original_id, start_step)
                queries = self.sql.insert_fork(original_id, fork_id, queue_name,
                                               application_version, timeout_ms, now_ms)
                if start_step > 0:
                    queries += self.sql.copy_history(original_id, fork_id, start_step,
                                                     replacement_children)
                try:
                    for q in queries:
                        await conn.execute(q.sql, *q.params)
                except asyncpg.UniqueViolationError:
                    raise DBOSError(f"Cannot fork {original_id!r} as {fork_id!r}: a workflow "
                                    "with that ID exists") from None

        await self._retried(f"forking workflow {original_id}", run)

    async def rewind(self, workflow_id: str, start_step: int, *, queue_name: str,
                     application_version: str | None, now_ms: int) -> None:
        """Discard the workflow's history from ``start_step`` on and re-enqueue it under
        its own ID, in one transaction; only a finished (terminal) workflow is rewound."""

        async def run() -> None:
            async with self.sysdb.pool.acquire() as conn, conn.transaction():
                status = await self._locked_for_fork(conn, workflow_id, start_step)
                if status in ACTIVE_STATUSES:
                    raise DBOSError(f"Cannot rewind {workflow_id!r} ({status}): only a "
                                    "finished workflow can be rewound; cancel it first")
                for q in self.sql.rewind(workflow_id, start_step):
                    await conn.execute(q.sql, *q.params)
                q = self.sql.requeue_rewound(workflow_id, status, queue_name,
                                             application_version, now_ms)
                if await conn.execute(q.sql, *q.params) != "UPDATE 1":
                    raise DBOSError(f"Workflow {workflow_id!r} changed status while being "
                                    "rewound; retry the rewind")

        await self._retried(f"rewinding workflow {workflow_id}", run)
