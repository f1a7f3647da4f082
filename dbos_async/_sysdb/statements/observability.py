"""Read-only statements for dashboards (the console): event history, unconsumed messages,
stream values, per-minute queue activity, each queue's oldest waiting workflow, what
each executor runs, the work waiting for each application version, and the workflow and
step aggregates of a time range (counts and duration percentiles).

None takes a lock: they are plain SELECTs, run as observability reads (a read-only
transaction under ``statement_timeout``, see ``DatabaseCore._observed_fetch``).
"""

from __future__ import annotations

from dbos_async._sysdb.statements.base import (
    DELAYED,
    DEPTH_SAMPLES_TABLE,
    ENQUEUED,
    ERROR,
    MAX_RECOVERY_ATTEMPTS_EXCEEDED,
    PENDING,
    SUCCESS,
    Params,
    Query,
    StatementBase,
)

MINUTE_MS = 60_000
HISTORY_MINUTES = 24 * 60
"""The longest queue depth history read (a day): depth samples older are deleted."""

WORKFLOW_GROUPS = ("status", "name", "queue_name", "application_version", "executor_id")
"""The columns workflow aggregates may be grouped by."""

TIME_COLUMNS = {"created": "created_at", "completed": "completed_at"}
"""Which timestamp a workflow aggregate's time range applies to; each has its own index."""

_PERCENTILES = "percentile_cont(ARRAY[0.5, 0.95, 0.99]::float8[]) WITHIN GROUP (ORDER BY {0})"


class ObservabilityStatements(StatementBase):
    def event_history(self, workflow_id: str, limit: int) -> Query:
        """Every value each event of the workflow was set to, by the step that set it."""
        p = Params()
        return Query(
            f"""SELECT function_id, key, value, serialization
                FROM {self.table('workflow_events_history')}
                WHERE {self.wf(None, workflow_id, p)}
                ORDER BY function_id, key LIMIT {p(limit, 'integer')}""",
            p.values,
        )

    def unconsumed_messages(self, workflow_id: str, limit: int) -> Query:
        """Messages sent to the workflow that it has not received yet, oldest first (the
        order ``recv`` takes them in)."""
        p = Params()
        return Query(
            f"""SELECT message_uuid, topic, message, serialization, created_at_epoch_ms
                FROM {self.table('notifications')}
                WHERE {self.wf(None, workflow_id, p, column='destination_uuid')}
                  AND NOT consumed
                ORDER BY created_at_epoch_ms, message_uuid LIMIT {p(limit, 'integer')}""",
            p.values,
        )

    def stream_values(self, workflow_id: str, limit: int) -> Query:
        """The values written to the workflow's streams, by key and offset."""
        p = Params()
        return Query(
            f"""SELECT key, "offset" AS stream_offset, value, serialization
                FROM {self.table('streams')}
                WHERE {self.wf(None, workflow_id, p)}
                ORDER BY key, "offset" LIMIT {p(limit, 'integer')}""",
            p.values,
        )

    def queue_activity(self, since_ms: int) -> Query:
        """Per queue and minute since ``since_ms``: how many workflows started and how many
        finished. Each half is a range scan of the partial index on its timestamp."""
        p = Params()
        since = p(since_ms, "bigint")
        minute = p(MINUTE_MS, "bigint")
        halves = [
            f"""SELECT queue_name, {p(kind, 'text')} AS kind, {column} / {minute} AS minute,
                       count(*) AS workflows
                FROM {self.table('workflow_status')}
                WHERE {self.scoped(None, p)} AND {self.own_scope(None, p)}
                  AND queue_name IS NOT NULL AND {column} >= {since}
                GROUP BY queue_name, {column} / {minute}"""
            for kind, column in (("started", "started_at_epoch_ms"),
                                 ("completed", "completed_at"))
        ]
        return Query(" UNION ALL ".join(halves) + " ORDER BY queue_name, minute", p.values)

    def queue_arrivals(self, since_ms: int) -> Query:
        """Per queue and minute since ``since_ms``: how many workflows were enqueued (by
        creation time; a range scan of the created_at index)."""
        p = Params()
        minute = p(MINUTE_MS, "bigint")
        return Query(
            f"""SELECT queue_name, created_at / {minute} AS minute, count(*) AS workflows
                FROM {self.table('workflow_status')}
                WHERE {self.scoped(None, p)} AND {self.own_scope(None, p)}
                  AND queue_name IS NOT NULL AND created_at >= {p(since_ms, 'bigint')}
                GROUP BY queue_name, created_at / {minute}""",
            p.values,
        )

    def depth_samples(self, since_ms: int) -> Query:
        """The queues' depth samples of this application's scope (see ``sample_depths``)
        from the minute ``since_ms`` on: a range scan of the table's key."""
        p = Params()
        return Query(
            f"""SELECT queue_name, minute_epoch_ms / {p(MINUTE_MS, 'bigint')} AS minute, waiting
                FROM {self.table(DEPTH_SAMPLES_TABLE)}
                WHERE application_name = {p(self.app_name or '', 'text')}
                  AND minute_epoch_ms >= {p(since_ms, 'bigint')}""",
            p.values,
        )

    def workflow_activity(self, start_ms: int, end_ms: int, bucket_ms: int) -> Query:
        """Per workflow name and ``bucket_ms`` interval of [start_ms, end_ms): how many
        workflows finished, how many of them succeeded and how many failed (ERROR or out
        of recovery attempts). A range scan of the completed_at index."""
        p = Params()
        bucket = p(bucket_ms, "bigint")
        return Query(
            f"""SELECT name, completed_at / {bucket} AS bucket, count(*) AS finished,
                       count(*) FILTER (WHERE status = {p(SUCCESS)}) AS succeeded,
                       count(*) FILTER (WHERE status = ANY({p([ERROR,
                           MAX_RECOVERY_ATTEMPTS_EXCEEDED], 'text[]')})) AS failed
                FROM {self.table('workflow_status')}
                WHERE {self.scoped(None, p)} AND {self.own_scope(None, p)}
                  AND completed_at >= {p(start_ms, 'bigint')}
                  AND completed_at < {p(end_ms, 'bigint')}
                GROUP BY name, completed_at / {bucket} ORDER BY name, bucket""",
            p.values,
        )

    def oldest_waiting(self) -> Query:
        """Each queue's oldest workflow still waiting to start (ENQUEUED or DELAYED): one
        branch per status, each read through that status's partial index, so the cost
        follows the backlog, not the table."""
        p = Params()
        branches = [
            f"""SELECT queue_name, workflow_uuid, name, status, created_at{self.key_columns()}
                FROM {self.table('workflow_status')}
                WHERE {self.scoped(None, p)} AND {self.own_scope(None, p)}
                  AND queue_name IS NOT NULL AND status = {p(status)}"""
            for status in (ENQUEUED, DELAYED)
        ]
        return Query(
            f"""SELECT DISTINCT ON (queue_name) * FROM ({" UNION ALL ".join(branches)}) waiting
                ORDER BY queue_name, created_at, workflow_uuid""",
            p.values,
        )

    def pending_by_executor(self, shown: int) -> Query:
        """Per application and executor, how many PENDING workflows it owns and its
        ``shown`` oldest (ID, name, key), read through the partial index on PENDING rows."""
        p = Params()
        key = "shard_key" if self.sharded else "NULL::text"
        return Query(
            f"""SELECT application_name, executor_id, count(*) AS pending,
                       (array_agg(workflow_uuid ORDER BY created_at, workflow_uuid))
                         [1:{p(shown, 'integer')}] AS workflow_ids,
                       (array_agg(name ORDER BY created_at, workflow_uuid))
                         [1:{p(shown, 'integer')}] AS names,
                       (array_agg({key} ORDER BY created_at, workflow_uuid))
                         [1:{p(shown, 'integer')}] AS shard_keys
                FROM {self.table('workflow_status')}
                WHERE {self.scoped(None, p)} AND {self.own_scope(None, p)}
                  AND status = {p(PENDING)}
                GROUP BY application_name, executor_id""",
            p.values,
        )

    def waiting_by_version(self, other_than: str | None) -> Query:
        """Per application version other than ``other_than`` (every one, when None), how
        many PENDING and ENQUEUED workflows of this application (and unclaimed ones) carry
        it: work only an executor of that version runs. Reads the in-flight rows through
        the partial index on them; an unversioned row (run by the latest version) counts
        for none."""
        p = Params()
        other = (f"AND application_version <> {p(other_than)}"
                 if other_than is not None else "")
        return Query(
            f"""SELECT application_version,
                       count(*) FILTER (WHERE status = {p(PENDING)}) AS pending,
                       count(*) FILTER (WHERE status = {p(ENQUEUED)}) AS enqueued
                FROM {self.table('workflow_status')}
                WHERE {self.scoped(None, p)} AND {self.own_scope(None, p)}
                  AND status = ANY({p([PENDING, ENQUEUED], 'text[]')})
                  AND application_version IS NOT NULL {other}
                GROUP BY application_version
                ORDER BY application_version""",
            p.values,
        )

    def executors_seen_since(self, since_ms: int) -> Query:
        """The (application, executor) pairs that started a workflow since ``since_ms``
        (an idle executor owns no PENDING row), a range of the created_at index."""
        p = Params()
        return Query(
            f"""SELECT DISTINCT application_name, executor_id
                FROM {self.table('workflow_status')}
                WHERE {self.scoped(None, p)} AND {self.own_scope(None, p)}
                  AND created_at >= {p(since_ms, 'bigint')} AND executor_id IS NOT NULL""",
            p.values,
        )

    def workflow_aggregates(self, group_by: tuple[str, ...], time_column: str,
                            start_ms: int, end_ms: int) -> Query:
        """Workflows whose ``time_column`` timestamp falls in [start_ms, end_ms), counted per
        combination of the ``group_by`` columns (those not grouped read NULL), with the
        mean and percentiles of their run time (completed_at minus the start: the dequeue
        for a queued workflow, the creation otherwise; unfinished ones have none). A range
        scan of that timestamp's index, so the cost follows the range, not the table."""
        p = Params()
        column = TIME_COLUMNS[time_column]
        groups = [g for g in WORKFLOW_GROUPS if g in group_by]
        selected = ", ".join(g if g in groups else f"NULL::text AS {g}" for g in WORKFLOW_GROUPS)
        grouping = f"GROUP BY {', '.join(groups)} ORDER BY {', '.join(groups)}" if groups else ""
        return Query(
            f"""SELECT {selected}, count(*) AS workflows,
                       avg(run_ms)::float8 AS mean_ms, {_PERCENTILES.format('run_ms')}
                         AS percentiles
                FROM (SELECT *, completed_at - coalesce(started_at_epoch_ms, created_at)
                                  AS run_ms
                      FROM {self.table('workflow_status')}
                      WHERE {self.scoped(None, p)} AND {self.own_scope(None, p)}
                        AND {column} >= {p(start_ms, 'bigint')}
                        AND {column} < {p(end_ms, 'bigint')}) ranged
                {grouping}""",
            p.values,
        )

    def step_aggregates(self, start_ms: int, end_ms: int) -> Query:
        """Steps (every recorded checkpoint) completed in [start_ms, end_ms), counted per
        name and outcome (SUCCESS, or ERROR when the step recorded an error), with the mean
        and percentiles of their durations. A range scan of the index on completion time
        and name."""
        p = Params()
        return Query(
            f"""SELECT function_name AS name, outcome, count(*) AS steps,
                       avg(run_ms)::float8 AS mean_ms, {_PERCENTILES.format('run_ms')}
                         AS percentiles
                FROM (SELECT function_name,
                             CASE WHEN error IS NULL THEN 'SUCCESS' ELSE 'ERROR' END
                               AS outcome,
                             completed_at_epoch_ms - started_at_epoch_ms AS run_ms
                      FROM {self.table('operation_outputs')}
                      WHERE {self.scoped(None, p)} AND {self.own_scope(None, p)}
                        AND completed_at_epoch_ms >= {p(start_ms, 'bigint')}
                        AND completed_at_epoch_ms < {p(end_ms, 'bigint')}) ranged
                GROUP BY name, outcome ORDER BY name, outcome""",
            p.values,
        )

    @staticmethod
    def session_waits(connection_name: str) -> Query:
        """What each busy session of this process (its ``application_name``) waits on: how
        the executor says why its operations are slow (a commit held by a synchronous
        standby, a lock). ``pg_stat_activity`` shows another role's sessions' wait events
        only to privileged roles, and every session here is this executor's own role."""
        p = Params()
        return Query(
            f"""SELECT wait_event_type, wait_event FROM pg_stat_activity
                WHERE application_name = {p(connection_name)} AND state = 'active'
                  AND pid <> pg_backend_pid()""",
            p.values,
        )
