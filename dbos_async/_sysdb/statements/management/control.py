"""Statements of operating workflows: cancel, delete, list, steps, resume, fork, rewind, and
the maintenance jobs (retention, global timeout) under an advisory lock.

Like the other families they are built on the shard-key seam, so a sharded database routes
them too.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

from dbos_async._sysdb.statements.base import (
    ACTIVE_STATUSES,
    CANCELLED,
    DEPTH_SAMPLES_TABLE,
    ENQUEUED,
    ERROR,
    MAX_RECOVERY_ATTEMPTS_EXCEEDED,
    PENDING,
    PORTABLE_JSON,
    SUCCESS,
    Params,
    Query,
    StatementBase,
)

TERMINAL_STATUSES = (SUCCESS, ERROR, CANCELLED, MAX_RECOVERY_ATTEMPTS_EXCEEDED)
"""Statuses a workflow never leaves by itself; the retention job deletes only these. The
others, ``ACTIVE_STATUSES``, are what the global timeout cancels, what
``list_queued_workflows`` lists by default and what a rewind refuses."""

WORKFLOW_STATUSES = (*ACTIVE_STATUSES, *TERMINAL_STATUSES)
"""Every status a workflow may have, active ones first: what a listing filters by."""

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


def job_lock_key(schema: str, application_name: str | None, job_name: str) -> int:
    """The advisory lock key of a background job, named as DBOS Transact names it: one per
    application, as each application's job touches only its own rows."""
    return advisory_lock_key(
        f"dbos.background_job.{schema}.{application_name or ''}.{job_name}")


@dataclass(frozen=True)
class WorkflowFilter:
    """Filters of a workflow listing; list-valued filters match any of their values.

    Times are epoch milliseconds, every bound inclusive: ``start_ms``/``end_ms`` on
    ``created_at``, ``completed_*`` on ``completed_at``, ``dequeued_*`` on
    ``started_at_epoch_ms`` (when a claim took it from its queue). A bound excludes the rows
    whose column is NULL. The three-valued flags (None: either) test ``was_forked_from``,
    ``forked_from IS NOT NULL`` (``is_fork``) and ``parent_workflow_id IS NOT NULL``.
    """

    workflow_ids: Sequence[str] | None = None
    statuses: Sequence[str] | None = None
    names: Sequence[str] | None = None
    start_ms: int | None = None
    end_ms: int | None = None
    completed_after_ms: int | None = None
    completed_before_ms: int | None = None
    dequeued_after_ms: int | None = None
    dequeued_before_ms: int | None = None
    was_forked_from: bool | None = None
    is_fork: bool | None = None
    has_parent: bool | None = None
    schedule_names: Sequence[str] | None = None
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
    # Sharded databases: the workflows' own keys, their parents' keys.
    shard_keys: Sequence[str] | None = None
    parent_shard_keys: Sequence[str] | None = None
    limit: int | None = None
    offset: int | None = None
    sort_desc: bool = False
    load_input: bool = False
    load_output: bool = False


@dataclass(frozen=True)
class RetentionCutoff:
    """What the retention job deletes: terminal workflows that finished (or, never
    started, were created) before ``finished_before_ms``, or were created before
    ``created_before_ms`` (the creation time of the newest workflow a row threshold
    keeps); None: no such bound."""

    finished_before_ms: int | None = None
    created_before_ms: int | None = None


# The columns a fork copies (and a rewind restores), besides the workflow's key.
STEP_COPY_COLUMNS = ("function_id", "function_name", "output", "error", "child_workflow_id",
                     "started_at_epoch_ms", "completed_at_epoch_ms", "serialization",
                     "application_name")
STREAM_COPY_COLUMNS = ("key", "value", "serialization", '"offset"', "function_id")
HISTORY_COPY_COLUMNS = ("function_id", "key", "value", "serialization")
EVENT_COPY_COLUMNS = ("key", "value", "serialization")


class ControlStatements(StatementBase):
    def existing(self, workflow_ids: Sequence[str]) -> Query:
        p = Params()
        return Query(
            f"""SELECT workflow_uuid FROM {self.table('workflow_status')}
                WHERE {self.wf_in(None, workflow_ids, p)}""",
            p.values,
        )

    # ---- Cancel and delete ----

    def cancel(self, workflow_ids: Sequence[str], now_ms: int) -> Query:
        """CANCELLED, unless finished or already cancelled (so a second cancel is a no-op)."""
        p = Params()
        # The IDs again on the updated side: a router sees the key there too.
        return self._cancel_where(
            f"""{self.wf_in(None, workflow_ids, p)}
                AND status <> ALL({p([SUCCESS, ERROR, CANCELLED], 'text[]')})""", now_ms, p,
            also=self.wf_in("ws", workflow_ids, p))

    def active_created_before(self, cutoff_ms: int) -> Query:
        """The global timeout's candidates on a sharded database, read without a lock (a
        lock spanning shards is refused); each is then cancelled under its own key."""
        p = Params()
        return Query(
            f"""SELECT workflow_uuid{self.key_columns()} FROM {self.table('workflow_status')}
                WHERE {self.scoped(None, p)} AND {self.own_scope(None, p)}
                  AND status = ANY({p(list(ACTIVE_STATUSES), 'text[]')})
                  AND created_at < {p(cutoff_ms, 'bigint')}""",
            p.values,
        )

    def terminal_finished_before(self, cutoff: RetentionCutoff, batch_size: int) -> Query:
        """A batch of the retention job's victims on a sharded database, read without a
        lock; each key's are then deleted with their rows."""
        p = Params()
        return Query(
            f"""SELECT workflow_uuid{self.key_columns()} FROM {self.table('workflow_status')}
                WHERE {self._retention_victim(cutoff, p)}
                ORDER BY created_at
                LIMIT {p(batch_size, 'bigint')}""",
            p.values,
        )

    def _retention_victim(self, cutoff: RetentionCutoff, p: Params) -> str:
        """A terminal workflow of this application (or unclaimed) past either cutoff."""
        past = []
        if cutoff.finished_before_ms is not None:
            past.append(f"COALESCE(completed_at, created_at) < "
                        f"{p(cutoff.finished_before_ms, 'bigint')}")
        if cutoff.created_before_ms is not None:
            past.append(f"created_at < {p(cutoff.created_before_ms, 'bigint')}")
        return f"""{self.scoped(None, p)} AND {self.own_scope(None, p)}
                   AND status = ANY({p(list(TERMINAL_STATUSES), 'text[]')})
                   AND ({' OR '.join(past) or 'FALSE'})"""

    def newest_created_at(self, rows: int) -> Query:
        """The creation time of this application's (and unclaimed) ``rows``-th newest
        workflow: a walk back of workflow_status_created_at_index that far."""
        p = Params()
        return Query(
            f"""SELECT created_at FROM {self.table('workflow_status')}
                WHERE {self.scoped(None, p)} AND {self.own_scope(None, p)}
                ORDER BY created_at DESC
                LIMIT 1 OFFSET {p(rows - 1, 'bigint')}""",
            p.values,
        )

    def cancel_created_before(self, cutoff_ms: int, now_ms: int) -> Query:
        """The global timeout: cancel every in-flight workflow of this application (and
        unclaimed ones) created before ``cutoff_ms``."""
        p = Params()
        return self._cancel_where(
            f"""{self.scoped(None, p)} AND {self.own_scope(None, p)}
                AND status = ANY({p(list(ACTIVE_STATUSES), 'text[]')})
                AND created_at < {p(cutoff_ms, 'bigint')}""", now_ms, p)

    def _cancel_where(self, predicate: str, now_ms: int, p: Params,
                      also: str = "TRUE") -> Query:
        """Cancel the rows matching ``predicate``; returns each one's ID and the queue it
        was on (so that queue's claim loops can be told a slot is free). Clearing the owner
        fences the running execution; clearing the queue and dedup ID frees its queue slot."""
        table = self.table("workflow_status")
        now = p(now_ms, "bigint")
        # FOR UPDATE: the queue returned (the UPDATE clears it) is read from the locked
        # row, so it is the slot this cancel frees even if a resume moved the row meanwhile.
        return Query(
            f"""WITH target AS (
                  SELECT workflow_uuid, queue_name{self.key_columns()} FROM {table}
                  WHERE {predicate}
                  FOR UPDATE
                )
                UPDATE {table} ws
                SET status = {p(CANCELLED)}, owner_xid = NULL, queue_name = NULL,
                    deduplication_id = NULL, started_at_epoch_ms = NULL,
                    updated_at = {now}, completed_at = {now}
                FROM target WHERE {self.wf_join('ws', 'target')} AND {also}
                RETURNING ws.workflow_uuid, target.queue_name{self.key_columns('ws')}""",
            p.values,
        )

    def direct_children(self, workflow_ids: Sequence[str]) -> Query:
        p = Params()
        return Query(
            f"""SELECT workflow_uuid{self.key_columns()} FROM {self.table('workflow_status')}
                WHERE {self.scoped(None, p)} AND {self.parent_in(workflow_ids, p)}""",
            p.values,
        )

    def delete(self, workflow_ids: Sequence[str]) -> list[Query]:
        """Every row of the workflows: the payload tables, then the status row (which
        cascades to notifications, events, event history and streams)."""
        queries = []
        for table in (*PAYLOAD_TABLES, "workflow_status"):
            p = Params()
            queries.append(Query(
                f"DELETE FROM {self.table(table)} WHERE {self.wf_in(None, workflow_ids, p)}",
                p.values,
            ))
        return queries

    def cancelled_among(self, workflow_ids: Sequence[str]) -> Query:
        p = Params()
        return Query(
            f"""SELECT workflow_uuid FROM {self.table('workflow_status')}
                WHERE {self.wf_in(None, workflow_ids, p)} AND status = {p(CANCELLED)}""",
            p.values,
        )

    # ---- Listing ----

    def list_workflows(self, f: WorkflowFilter) -> Query:
        """The one listing statement: every filter a parameter, payloads joined on demand."""
        return self.filtered_status(
            f, *self.status_select(load_input=f.load_input, load_output=f.load_output))

    def filtered_status(self, f: WorkflowFilter, columns: str, joins: str = "") -> Query:
        """``columns`` of the status rows (``ws``, with ``joins``) that ``f`` selects, in
        its order and page: what a listing and an export read."""
        p = Params()
        where = [self.scoped("ws", p)]

        def any_of(column: str, values: Sequence[str] | None) -> None:
            if values is not None:
                where.append(f"ws.{column} = ANY({p(list(values), 'text[]')})")

        if f.workflow_ids is not None:
            where.append(f"ws.workflow_uuid = ANY({p(list(f.workflow_ids), 'text[]')})")
            # An ID-keyed read is an identity read: scoped only when asked.
            where.append(self.app_scope("ws", p, f.application_names))
        else:
            where.append(self.app_scope(
                "ws", p, f.application_names if f.application_names is not None
                else self.app_name))
        if f.shard_keys is not None:
            where.append(self.key_in("ws", f.shard_keys, p))
        if f.parent_shard_keys is not None:
            where.append(self.key_in("ws", f.parent_shard_keys, p, "parent_shard_key"))
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
        any_of("schedule_name", f.schedule_names)
        # Each bound is a range on a column some index covers (workflow_status_created_at_
        # index, idx_workflow_status_completed_at, idx_workflow_status_started_at).
        for column, bound, op in (("created_at", f.start_ms, ">="),
                                  ("created_at", f.end_ms, "<="),
                                  ("completed_at", f.completed_after_ms, ">="),
                                  ("completed_at", f.completed_before_ms, "<="),
                                  ("started_at_epoch_ms", f.dequeued_after_ms, ">="),
                                  ("started_at_epoch_ms", f.dequeued_before_ms, "<=")):
            if bound is not None:
                where.append(f"ws.{column} {op} {p(bound, 'bigint')}")
        if f.was_forked_from is not None:
            where.append(f"ws.was_forked_from = {p(f.was_forked_from, 'boolean')}")
        for column, wanted in (("forked_from", f.is_fork),
                               ("parent_workflow_id", f.has_parent)):
            # IS NOT NULL is what the partial indexes on these columns cover.
            if wanted is not None:
                where.append(f"ws.{column} IS {'NOT ' if wanted else ''}NULL")
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

    def list_steps(self, workflow_id: str, *, limit: int | None = None,
                   offset: int | None = None, load_output: bool = True) -> Query:
        """A workflow's checkpoints by position, a page of ``limit`` after ``offset``;
        without ``load_output`` their outputs and errors are not read."""
        p = Params()
        payload = "output, error" if load_output else "NULL AS output, NULL AS error"
        page = ""
        if limit is not None:
            page += f" LIMIT {p(limit, 'bigint')}"
        if offset is not None:
            page += f" OFFSET {p(offset, 'bigint')}"
        return Query(
            f"""SELECT function_id, function_name, {payload}, child_workflow_id,
                       started_at_epoch_ms, completed_at_epoch_ms,
                       serialization{self.key_columns(None, ("child_shard_key",))}
                FROM {self.table('operation_outputs')}
                WHERE {self.wf(None, workflow_id, p)}
                ORDER BY function_id{page}""",
            p.values,
        )

    def step_position(self, workflow_id: str, *, name: str | None, failed: bool,
                      index: int) -> Query:
        """The position of one of a workflow's checkpoints: of those named ``name`` (any
        name if None) and, with ``failed``, that recorded an error, the ``index``-th by
        position (negative: counted back from the last, -1 being the last); a walk of the
        primary key (workflow, position)."""
        p = Params()
        conditions = [self.wf(None, workflow_id, p)]
        if name is not None:
            conditions.append(f"function_name = {p(name)}")
        if failed:
            conditions.append("error IS NOT NULL")
        order = "ASC" if index >= 0 else "DESC"
        skip = index if index >= 0 else -index - 1
        return Query(
            f"""SELECT function_id FROM {self.table('operation_outputs')}
                WHERE {' AND '.join(conditions)}
                ORDER BY function_id {order}
                LIMIT 1 OFFSET {p(skip, 'bigint')}""",
            p.values,
        )

    # ---- Maintenance ----

    def try_job_lock(self, key: int) -> Query:
        """Take the job's transaction-scoped advisory lock, or learn another executor holds
        it; the idle timeout frees it from a holder that froze mid-job."""
        p = Params()
        return Query(
            f"""SELECT pg_try_advisory_xact_lock({p(key, 'bigint')}) AS acquired
                FROM set_config('idle_in_transaction_session_timeout',
                                {p(str(BACKGROUND_JOB_LOCK_IDLE_TIMEOUT_MS))}, true)""",
            p.values,
        )

    def delete_depth_samples_before(self, cutoff_ms: int) -> Query:
        """The retention job's part of the depth samples: this application's minutes
        before ``cutoff_ms`` (a range of the table's key)."""
        p = Params()
        return Query(
            f"""DELETE FROM {self.table(DEPTH_SAMPLES_TABLE)}
                WHERE application_name = {p(self.app_name or '', 'text')}
                  AND minute_epoch_ms < {p(cutoff_ms, 'bigint')}""",
            p.values,
        )

    def delete_terminal_batch(self, cutoff: RetentionCutoff, batch_size: int) -> Query:
        """Delete up to ``batch_size`` terminal workflows of this application (and unclaimed
        ones) past ``cutoff``, with every row they own; returns their IDs."""
        p = Params()
        # FOR UPDATE SKIP LOCKED: a row some other statement holds (a resume, a fork) is
        # left for the next round instead of waited on.
        victims = f"""victims AS (
                  SELECT workflow_uuid{self.key_columns()} FROM {self.table('workflow_status')}
                  WHERE {self._retention_victim(cutoff, p)}
                  ORDER BY created_at
                  LIMIT {p(batch_size, 'bigint')}
                  FOR UPDATE SKIP LOCKED
                )"""
        ctes = [victims]
        for i, table in enumerate(PAYLOAD_TABLES):
            ctes.append(
                f"""d{i} AS (
                  DELETE FROM {self.table(table)} t USING victims
                  WHERE {self.wf_join('t', 'victims')}
                  RETURNING 1
                )"""
            )
        ctes.append(
            f"""gone AS (
                  DELETE FROM {self.table('workflow_status')} t USING victims
                  WHERE {self.wf_join('t', 'victims')}
                  RETURNING t.workflow_uuid
                )"""
        )
        return Query(f"WITH {', '.join(ctes)} SELECT workflow_uuid FROM gone", p.values)

    # ---- Resume, fork, rewind (DBOS Transact's resume, fork and rewind) ----

    def resume(self, workflow_ids: Sequence[str], queue_name: str, now_ms: int,
               again: bool = False, application_version: str | None = None) -> Query:
        """Put the workflows back on ``queue_name`` as ENQUEUED, with a fresh start (no
        owner, attempts, deadline or dedup ID); SUCCESS and ERROR rows are left alone.
        Clearing the owner fences any execution still running somewhere. ``again`` (a
        retry of a resume at ``now_ms`` whose outcome is unknown): rows found
        :meth:`resumed_since` are left alone, so an execution that claimed one since runs on.
        ``application_version``: run them under that version (None: keep theirs)."""
        p = Params()
        now = p(now_ms, "bigint")
        since = f"AND NOT ({self._resumed_since(queue_name, now_ms, p)})" if again else ""
        version = p(application_version)
        return Query(
            f"""UPDATE {self.table('workflow_status')}
                SET status = {p(ENQUEUED)}, owner_xid = NULL, queue_name = {p(queue_name)},
                    application_version = COALESCE({version}::text, application_version),
                    recovery_attempts = 0, workflow_deadline_epoch_ms = NULL,
                    deduplication_id = NULL, started_at_epoch_ms = NULL,
                    updated_at = {now}, completed_at = NULL
                WHERE {self.wf_in(None, workflow_ids, p)}
                  AND status <> ALL({p([SUCCESS, ERROR], 'text[]')}) {since}
                RETURNING workflow_uuid""",
            p.values,
        )

    def resumed_since(self, workflow_ids: Sequence[str], queue_name: str,
                      now_ms: int) -> Query:
        """Which of the workflows are on ``queue_name``, ENQUEUED or PENDING, and changed
        at or after ``now_ms``: resumed by an attempt of the resume at ``now_ms`` whose
        reply was lost, then perhaps claimed."""
        p = Params()
        return Query(
            f"""SELECT workflow_uuid FROM {self.table('workflow_status')}
                WHERE {self.wf_in(None, workflow_ids, p)}
                  AND {self._resumed_since(queue_name, now_ms, p)}""",
            p.values,
        )

    def _resumed_since(self, queue_name: str, now_ms: int, p: Params) -> str:
        return (f"queue_name = {p(queue_name)} "
                f"AND status = ANY({p([ENQUEUED, PENDING], 'text[]')}) "
                f"AND updated_at >= {p(now_ms, 'bigint')}")

    def lock_for_fork(self, workflow_id: str) -> Query:
        """The workflow's status and its highest recorded step, its row locked."""
        p = Params()
        # FOR NO KEY UPDATE OF ws: the status and history read stay as read until the fork
        # or rewind commits; a hand-off, and every fenced write of a running execution,
        # locks the same row first.
        return Query(
            f"""SELECT ws.status,
                       (SELECT max(oo.function_id) FROM {self.table('operation_outputs')} oo
                        WHERE {self.wf('oo', workflow_id, p)}) AS last_step
                FROM {self.table('workflow_status')} ws
                WHERE {self.wf('ws', workflow_id, p)}
                FOR NO KEY UPDATE OF ws""",
            p.values,
        )

    def insert_fork(self, original_id: str, fork_id: str, queue_name: str,
                    application_version: str | None, timeout_ms: int | None,
                    now_ms: int, creator_xid: str, partition_key: str | None = None
                    ) -> list[Query]:
        """The fork's status row (the original's identity, inputs and serialization,
        ENQUEUED on ``queue_name``, in partition ``partition_key`` of a partitioned one,
        ``forked_from`` the original, created by ``creator_xid``) and its inputs; and the
        original marked ``was_forked_from``."""
        # The fork lives under its original's key, read from the rows copied (see
        # _key_values_of: so Citus copies on that key's shard).
        p = Params()
        keys = self._key_values_of("src")
        now = p(now_ms, "bigint")
        status = Query(
            f"""INSERT INTO {self.table('workflow_status')} (
                  {''.join(f'{c}, ' for c in keys)}workflow_uuid, status, name, class_name,
                  config_name, queue_name, authenticated_user, assumed_role,
                  authenticated_roles, application_version, application_id, forked_from,
                  serialization, attributes, application_name, workflow_timeout_ms,
                  created_at, updated_at, recovery_attempts, priority, queue_partition_key,
                  creator_xid)
                SELECT {''.join(f'{v}, ' for v in keys.values())}{p(fork_id)}, {p(ENQUEUED)},
                  name, class_name, config_name, {p(queue_name)}, authenticated_user,
                  assumed_role, authenticated_roles,
                  COALESCE({p(application_version)}, application_version), application_id,
                  workflow_uuid, serialization, attributes,
                  COALESCE(application_name, {p(self.app_name, 'text')}),
                  {p(timeout_ms, 'bigint')}, {now}, {now}, 0, 0, {p(partition_key, 'text')},
                  {p(creator_xid)}
                FROM {self.table('workflow_status')} src
                WHERE {self.wf('src', original_id, p)}""",
            p.values,
        )
        p = Params()
        keys = self._key_values_of("ws")
        inputs = Query(
            f"""INSERT INTO {self.table('workflow_input')}
                  ({''.join(f'{c}, ' for c in keys)}workflow_uuid, inputs)
                SELECT {''.join(f'{v}, ' for v in keys.values())}{p(fork_id)},
                       COALESCE(wi.inputs, ws.inputs)
                FROM {self.table('workflow_status')} ws
                LEFT JOIN {self.table('workflow_input')} wi ON {self.wf_join('wi', 'ws')}
                WHERE {self.wf('ws', original_id, p)}""",
            p.values,
        )
        p = Params()
        marked = Query(
            f"""UPDATE {self.table('workflow_status')} SET was_forked_from = TRUE
                WHERE {self.wf(None, original_id, p)}""",
            p.values,
        )
        return [status, inputs, marked]

    def fork_creator(self, fork_id: str) -> Query:
        """Who created the workflow ``fork_id`` (a fork's token), if it exists."""
        p = Params()
        return Query(
            f"""SELECT creator_xid FROM {self.table('workflow_status')}
                WHERE {self.wf(None, fork_id, p)}""",
            p.values,
        )

    def ambiguous_children(self, original_id: str, start_step: int,
                           child_ids: Sequence[str]) -> Query:
        """One of ``child_ids`` that the original's steps below ``start_step`` record
        under more than one child key (sharded: IDs are unique per key, and a replacement
        names a child by ID alone, so it could not say which one it replaces)."""
        p = Params()
        return Query(
            f"""SELECT child_workflow_id FROM {self.table('operation_outputs')}
                WHERE {self.wf(None, original_id, p)}
                  AND function_id < {p(start_step, 'integer')}
                  AND child_workflow_id = ANY({p(list(child_ids), 'text[]')})
                GROUP BY child_workflow_id
                HAVING COUNT(DISTINCT child_shard_key) > 1
                LIMIT 1""",
            p.values,
        )

    def copy_history(self, original_id: str, fork_id: str, start_step: int,
                     replacement_children: dict[str, str]) -> list[Query]:
        """Copy what the original recorded below ``start_step`` to the fork: its
        checkpoints (child IDs replaced as asked), streams, events history, and each
        event's latest value among those."""
        return [
            # A sharded step also names the key of the child it started.
            self._copy_below("operation_outputs",
                             (*STEP_COPY_COLUMNS, *(("child_shard_key",) if self.sharded else ())),
                             original_id, fork_id, start_step,
                             replacement_children=replacement_children),
            self._copy_below("streams", STREAM_COPY_COLUMNS, original_id, fork_id, start_step),
            self._copy_below("workflow_events_history", HISTORY_COPY_COLUMNS, original_id,
                             fork_id, start_step),
            self._copy_below("workflow_events", EVENT_COPY_COLUMNS, original_id, fork_id,
                             start_step, source="workflow_events_history"),
        ]

    def _copy_below(self, into: str, columns: Sequence[str], original_id: str, copy_id: str,
                    start_step: int, *, source: str | None = None,
                    replacement_children: dict[str, str] | None = None,
                    only_past_cut: bool = False) -> Query:
        """Insert into ``into``, as rows of ``copy_id``, the ``columns`` of the original's
        rows (of ``source``, by default the same table) recorded below ``start_step``.
        Into workflow_events goes each key's latest value; ``only_past_cut`` keeps the keys
        written again from ``start_step`` on. ``replacement_children`` maps a recorded
        child ID to the copy's."""
        p = Params()
        start = p(start_step, "integer")
        selected = {c: f"src.{c}" for c in columns}
        if replacement_children:
            selected["child_workflow_id"] = f"""COALESCE(
                  (SELECT r.new FROM unnest({p(list(replacement_children), 'text[]')},
                          {p(list(replacement_children.values()), 'text[]')}) AS r(old, new)
                   WHERE r.old = src.child_workflow_id), src.child_workflow_id)"""
        # The copy lives under the original's key (a fork's, or the workflow itself).
        values = {**self._key_values_of("src"), "workflow_uuid": p(copy_id), **selected}
        where = [self.wf("src", original_id, p), f"src.function_id < {start}"]
        if only_past_cut:
            where.append(self._past_cut(original_id, "src.key", start, p))
        distinct = order = ""
        if into == "workflow_events":
            distinct, order = "DISTINCT ON (src.key) ", "ORDER BY src.key, src.function_id DESC"
        return Query(
            f"""INSERT INTO {self.table(into)} ({', '.join(values)})
                SELECT {distinct}{', '.join(values.values())}
                FROM {self.table(source or into)} src
                WHERE {' AND '.join(where)}
                {order}""",
            p.values,
        )

    def _past_cut(self, workflow_id: str, key: str, start: str, p: Params) -> str:
        """Whether the workflow's events history has a write of ``key`` from step ``start``
        (a parameter) on."""
        return f"""EXISTS (
                  SELECT 1 FROM {self.table('workflow_events_history')} discarded
                  WHERE {self.wf('discarded', workflow_id, p)} AND discarded.key = {key}
                    AND discarded.function_id >= {start})"""

    def rewind(self, workflow_id: str, start_step: int) -> list[Query]:
        """Discard what the workflow recorded from ``start_step`` on (DBOS Transact's rewind):
        events published past the cut rolled back to their last value below it (the
        events history is the undo log), stream close markers past the cut removed so the
        replay can append, checkpoints and history past the cut deleted, messages consumed
        past the cut or not yet consumed deleted, and the recorded output deleted."""
        table = self.table
        p = Params()
        start = p(start_step, "integer")
        queries = [
            Query(f"""DELETE FROM {table('workflow_events')} e
                      WHERE {self.wf('e', workflow_id, p)}
                        AND {self._past_cut(workflow_id, 'e.key', start, p)}""", p.values),
            self._copy_below("workflow_events", EVENT_COPY_COLUMNS, workflow_id, workflow_id,
                             start_step, source="workflow_events_history", only_past_cut=True),
        ]
        p = Params()
        queries.append(Query(
            f"""DELETE FROM {table('streams')}
                WHERE {self.wf(None, workflow_id, p)}
                  AND function_id >= {p(start_step, 'integer')}
                  AND value = {p(STREAM_CLOSED_SERIALIZED)}
                  AND serialization = {p(PORTABLE_JSON)}""",
            p.values,
        ))
        for name in ("operation_outputs", "workflow_events_history"):
            p = Params()
            queries.append(Query(
                f"""DELETE FROM {table(name)} WHERE {self.wf(None, workflow_id, p)}
                      AND function_id >= {p(start_step, 'integer')}""",
                p.values,
            ))
        p = Params()
        queries.append(Query(
            f"""DELETE FROM {table('notifications')}
                WHERE {self.wf(None, workflow_id, p, column='destination_uuid')}
                  AND (consumed_by_function_id >= {p(start_step, 'integer')}
                       OR consumed = false)""",
            p.values,
        ))
        p = Params()
        queries.append(Query(
            f"DELETE FROM {table('workflow_output')} WHERE {self.wf(None, workflow_id, p)}",
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
                WHERE {self.wf(None, workflow_id, p)} AND status = {p(status)}""",
            p.values,
        )
