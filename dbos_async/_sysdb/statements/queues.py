"""Statements of queues: registration, claims, partitions, delays and dedup.

See dbos_async/_executor/queues.py and dispatcher.py.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from dbos_async._sysdb.statements.base import (
    DELAYED,
    DEPTH_SAMPLES_TABLE,
    ENQUEUED,
    PENDING,
    Params,
    Payload,
    Query,
    StatementBase,
    qualify,
)
from dbos_async.errors import DBOSError

INTERNAL_QUEUE_NAME = "_dbos_internal_queue"
"""The queue DBOS uses to run resumed workflows; every executor dispatches it."""

DEDUP_INDEX = "uq_workflow_status_dedup_id"


_SHARD_INDEX = re.compile(rf'"{DEDUP_INDEX}(_\d+)?"')


def is_dedup_conflict(error: Exception) -> bool:
    """Whether ``error`` is a violation of the deduplication index. Citus reports it under
    the shard's copy of the index (``<name>_<shard id>``), and only in the message."""
    name = getattr(error, "constraint_name", None)
    if name is not None:
        return bool(_SHARD_INDEX.fullmatch(f'"{name}"'))
    return bool(_SHARD_INDEX.search(str(error)))


@dataclass(frozen=True)
class QueueRecord:
    """A queue's flow-control settings, as stored in the ``queues`` table."""

    name: str
    concurrency: int | None = None
    worker_concurrency: int | None = None
    rate_limit_max: int | None = None
    rate_limit_period_sec: float | None = None
    partition_queue: bool = False
    partition_concurrency: int | None = None
    partition_worker_concurrency: int | None = None
    partition_rate_limit_max: int | None = None
    partition_rate_limit_period_sec: float | None = None
    polling_interval_sec: float = 1.0

    @property
    def shared_budget(self) -> bool:
        """Whether a limit is shared by every executor dequeuing from this queue."""
        return (self.concurrency is not None or self.rate_limit_max is not None
                or self.partition_concurrency is not None
                or self.partition_rate_limit_max is not None)

    @property
    def head_of_line(self) -> bool:
        """Partition concurrency 1 and no queue-wide limit: the batched head-of-line sweep."""
        return (self.partition_queue and self.partition_concurrency == 1
                and self.concurrency is None and self.rate_limit_max is None
                and self.partition_rate_limit_max is None)


QUEUE_COLUMNS = (
    "name", "concurrency", "worker_concurrency", "rate_limit_max", "rate_limit_period_sec",
    "partition_queue", "partition_concurrency", "partition_worker_concurrency",
    "partition_rate_limit_max", "partition_rate_limit_period_sec", "polling_interval_sec",
)

QUEUE_CASTS = {
    "concurrency": "integer", "worker_concurrency": "integer", "rate_limit_max": "integer",
    "rate_limit_period_sec": "float8", "partition_queue": "boolean",
    "partition_concurrency": "integer", "partition_worker_concurrency": "integer",
    "partition_rate_limit_max": "integer", "partition_rate_limit_period_sec": "float8",
    "polling_interval_sec": "float8",
}
"""The SQL types of the queue settings' parameters."""

CLAIMED_COLUMNS = """workflow_uuid, status, name, class_name, config_name, owner_xid,
                     serialization, workflow_deadline_epoch_ms, recovery_attempts,
                     queue_partition_key, attributes, authenticated_user, assumed_role,
                     authenticated_roles"""


class QueueStatements(StatementBase):

    def upsert_queue(self, queue: QueueRecord, now_ms: int) -> Query:
        """Record a queue declared in code; the declaration in code wins over a stored one."""
        p = Params()
        values = {column: getattr(queue, column) for column in QUEUE_COLUMNS}
        values["application_name"] = self.app_name
        refs = [p(v, QUEUE_CASTS.get(k, "text")) for k, v in values.items()]
        updates = ", ".join(f"{c} = EXCLUDED.{c}" for c in QUEUE_COLUMNS if c != "name")
        table = self.table("queues")
        # A queue's name is its address, unique across the applications sharing the
        # database: a named application updates only its own or an unclaimed queue (and
        # claims the latter); a nameless one leaves the owner as it is. No row comes back
        # when another application owns the name (see queue_owner).
        return Query(
            f"""INSERT INTO {table}
                  ({', '.join(values)}, priority_enabled, created_at, updated_at)
                -- priority_enabled is vestigial: every queue dispatches in priority order.
                VALUES ({', '.join(refs)}, TRUE, {p(now_ms, 'bigint')}, {p(now_ms, 'bigint')})
                ON CONFLICT (name) DO UPDATE SET {updates}, updated_at = EXCLUDED.updated_at,
                  application_name = COALESCE(queues.application_name,
                                              EXCLUDED.application_name)
                WHERE queues.application_name IS NULL OR EXCLUDED.application_name IS NULL
                   OR queues.application_name = EXCLUDED.application_name
                RETURNING 1""",
            p.values,
        )

    def queue_owner(self, name: str) -> Query:
        p = Params()
        return Query(
            f"""SELECT application_name FROM {self.table('queues')}
                WHERE {self.global_(None, p)} AND name = {p(name)}""",
            p.values,
        )

    def lock_queue(self, name: str) -> Query:
        """A stored queue's settings and owner, its row locked: FOR UPDATE, so that of two
        concurrent changes of one queue each starts from the other's result."""
        p = Params()
        return Query(
            f"""SELECT {', '.join(QUEUE_COLUMNS)}, application_name FROM {self.table('queues')}
                WHERE {self.global_(None, p)} AND name = {p(name)}
                FOR UPDATE""",
            p.values,
        )

    def update_queue(self, queue: QueueRecord, now_ms: int) -> Query:
        """Store new settings of an existing queue, leaving its owner as it is."""
        p = Params()
        settings = ", ".join(f"{column} = {p(getattr(queue, column), QUEUE_CASTS.get(column))}"
                             for column in QUEUE_COLUMNS if column != "name")
        return Query(
            f"""UPDATE {self.table('queues')}
                SET {settings}, updated_at = {p(now_ms, 'bigint')}
                WHERE {self.global_(None, p)} AND name = {p(queue.name)}""",
            p.values,
        )

    def delete_queue(self, name: str) -> Query:
        p = Params()
        return Query(
            f"""DELETE FROM {self.table('queues')}
                WHERE {self.global_(None, p)} AND name = {p(name)}""",
            p.values,
        )

    def list_queues(self, names: Sequence[str] | None) -> Query:
        """The stored queues (those named, or all)."""
        p = Params()
        # By name: an address lookup; all: what this application owns (and unclaimed ones).
        named = (f"AND name = ANY({p(list(names), 'text[]')})" if names is not None
                 else f"AND {self.own_scope(None, p)}")
        return Query(
            f"""SELECT {', '.join(QUEUE_COLUMNS)} FROM {self.table('queues')}
                WHERE {self.global_(None, p)} {named} ORDER BY name""",
            p.values,
        )

    def _version_clause(self, application_version: str | None, p: Params,
                        alias: str | None = None) -> str:
        # DBOS's "latest version" rule: a claim takes workflows of this executor's
        # version, and unversioned ones (enqueued by SQL or another client) only while this
        # version is the latest registered one, or none is registered. Once a newer version
        # is registered, an old executor leaves unversioned work to the new one. Read in the
        # claim's statement, so under SERIALIZABLE a concurrent version bump is a conflict.
        column = qualify(alias, "application_version")
        if application_version is None:
            return f"{column} IS NULL"
        version = p(application_version)
        latest = f"({self.latest_version_sql(p, 'version_name')})"
        # The version test is a boolean subquery of its own (an InitPlan): the planner
        # then estimates the clause by the column's statistics alone, where a comparison
        # with the subquery inline is guessed at 0.5% of the rows, which on a backlog of
        # unversioned rows turns the claim's index scan into a scan and sort of them all.
        return (f"({column} = {version} OR ({column} IS NULL"
                f" AND (SELECT COALESCE({latest}, {version}) = {version})))")

    def _partition_filter(self, partition_key: str | None, p: Params) -> str:
        return (f"AND queue_partition_key = {p(partition_key)}"
                if partition_key is not None else "")

    def queue_pending_count(self, queue_name: str, partition_key: str | None) -> Query:
        """How many of the queue's (or partition's) workflows are running, on any executor.

        Read inside the claim's transaction: at REPEATABLE READ / SERIALIZABLE the count and
        the select below see one snapshot, and a concurrent claim makes ours fail (40001).
        """
        p = Params()
        return Query(
            f"""SELECT count(*) AS running FROM {self.table('workflow_status')}
                WHERE {self.scoped(None, p)} AND {self.own_scope(None, p)}
                  AND queue_name = {p(queue_name)}
                  AND status = {p(PENDING)} {self._partition_filter(partition_key, p)}""",
            p.values,
        )

    def queue_depths(self) -> Query:
        """How many workflows of each queue wait or run, by status (DELAYED, ENQUEUED,
        PENDING): this application's own and unclaimed ones, under every shard key."""
        p = Params()
        return Query(
            f"""SELECT queue_name, status, count(*) AS workflows
                FROM {self.table('workflow_status')}
                WHERE {self.scoped(None, p)} AND {self.own_scope(None, p)}
                  AND queue_name IS NOT NULL
                  AND status = ANY({p([DELAYED, ENQUEUED, PENDING], 'text[]')})
                GROUP BY queue_name, status ORDER BY queue_name, status""",
            p.values,
        )

    def queue_started_since(self, queue_name: str, partition_key: str | None,
                            since_ms: int) -> Query:
        """Rate limiting: how many of the queue's workflows started after ``since_ms``, and
        the oldest such start (when the next slot frees). Read inside the claim's transaction.
        """
        p = Params()
        return Query(
            f"""SELECT count(*) AS started, min(started_at_epoch_ms) AS oldest
                FROM {self.table('workflow_status')}
                WHERE {self.scoped(None, p)} AND queue_name = {p(queue_name)}
                  -- Count only what this application would dequeue, as the claim does.
                  AND {self.own_scope(None, p)}
                  AND rate_limited = true
                  AND status <> ALL({p([ENQUEUED, DELAYED], 'text[]')})
                  AND started_at_epoch_ms > {p(since_ms, 'bigint')}
                  {self._partition_filter(partition_key, p)}""",
            p.values,
        )

    def select_startable(
        self, queue_name: str, partition_key: str | None, names: Sequence[str],
        application_version: str | None, limit: int | None,
    ) -> Query:
        """Lock the queue's next workflows (priority, then age) that this executor can run,
        inside a claim that spends a budget shared across executors.

        Only functions registered here are taken: another executor's workflows stay ENQUEUED.
        FOR UPDATE NOWAIT, so two claimers of the same head rows do not queue behind each
        other's locks; the loser fails at once (55P03) and retries with a fresh snapshot and
        count.
        """
        p = Params()
        return Query(self._startable(queue_name, partition_key, names, application_version,
                                     limit, "FOR UPDATE NOWAIT", p), p.values)

    def _startable(
        self, queue_name: str, partition_key: str | None, names: Sequence[str],
        application_version: str | None, limit: int | None, lock: str, p: Params,
    ) -> str:
        return f"""SELECT workflow_uuid, priority, created_at
                FROM {self.table('workflow_status')}
                WHERE {self.scoped(None, p)} AND status = {p(ENQUEUED)}
                  AND queue_name = {p(queue_name)}
                  AND {self._version_clause(application_version, p)}
                  AND {self.own_scope(None, p)}
                  AND name = ANY({p(list(names), 'text[]')})
                  AND {self.claim_gate(queue_name, partition_key, p)}
                  {self._partition_filter(partition_key, p)}
                ORDER BY priority ASC, created_at ASC
                LIMIT {p(limit, 'bigint')}
                {lock}"""

    def claim_startable(
        self, queue_name: str, partition_key: str | None, names: Sequence[str],
        application_version: str | None, limit: int | None, executor_id: str, now_ms: int,
    ) -> Query:
        """Lock and start the queue's next workflows in one autocommit statement, for a queue
        with no budget shared across executors (nothing to count first).

        FOR UPDATE SKIP LOCKED under READ COMMITTED: concurrent claimers take disjoint rows and
        never wait. Returns the started rows in priority, then age, order.
        """
        p = Params()
        picked = self._startable(queue_name, partition_key, names, application_version, limit,
                                 "FOR UPDATE SKIP LOCKED", p)
        # The picked rows are locked by this very statement, so their status and queue need no
        # second look; their keys, as one array, are looked up in the primary key whatever the
        # statistics say (a join, or a status filter, can be planned as a scan of the queue's
        # index when they are stale, as they are right after a large enqueue).
        flip = self._flip("ws.workflow_uuid = ANY(ARRAY(SELECT picked_id FROM picked))",
                          executor_id, application_version, False, now_ms, "", p)
        return Query(
            f"""WITH picked (picked_id, picked_priority, picked_created_at) AS ({picked}),
                flipped AS ({flip})
                SELECT flipped.* FROM flipped
                JOIN picked ON picked.picked_id = flipped.workflow_uuid
                ORDER BY picked.picked_priority ASC, picked.picked_created_at ASC""",
            p.values,
        )

    def unregistered_enqueued(
        self, queue_name: str, names: Sequence[str], known: Sequence[str],
        application_version: str | None, limit: int,
    ) -> Query:
        """ENQUEUED workflows of the queue that this executor would take but for their
        function, which it lacks: one (name, workflow) per function name, skipping the
        ``known`` names already reported. Run only after a claim round found nothing."""
        p = Params()
        return Query(
            f"""SELECT DISTINCT ON (name) name, workflow_uuid
                FROM {self.table('workflow_status')}
                WHERE {self.scoped(None, p)} AND status = {p(ENQUEUED)}
                  AND queue_name = {p(queue_name)}
                  AND {self._version_clause(application_version, p)}
                  AND {self.own_scope(None, p)}
                  AND NOT (name = ANY({p(list(names) + list(known), 'text[]')}))
                ORDER BY name, created_at
                LIMIT {p(limit, 'bigint')}""",
            p.values,
        )

    def flip_claimed(
        self, workflow_ids: Sequence[str], queue_name: str, executor_id: str,
        application_version: str | None, rate_limited: bool, now_ms: int,
        partition_heads: bool = False,
    ) -> Query:
        """Start the claimed workflows: PENDING, each under a fresh owner token.

        The rows are already locked by this transaction; the status and queue are checked
        again, and RETURNING reports exactly the rows flipped, with their inputs. With
        ``partition_heads`` a row starts only if its partition has nothing running, read by
        this new statement after the partition's advisory lock was taken.
        """
        p = Params()
        guard = ""
        if partition_heads:
            guard = f"""AND NOT EXISTS (
                      SELECT 1 FROM {self.table('workflow_status')} running
                      WHERE {self.scoped('running', p)} AND running.queue_name = ws.queue_name
                        AND running.status = {p(PENDING)}
                        AND running.queue_partition_key = ws.queue_partition_key)"""
        target = (f"{self.wf_in('ws', workflow_ids, p)} "
                  f"AND {self.batch_status_is('ws', ENQUEUED, p)} "
                  f"AND ws.queue_name = {p(queue_name)}")
        return Query(self._flip(target, executor_id, application_version, rate_limited,
                                now_ms, guard, p),
                     p.values)

    def _flip(self, target: str, executor_id: str,
              application_version: str | None, rate_limited: bool, now_ms: int, guard: str,
              p: Params) -> str:
        """The UPDATE that starts the ``target`` rows (a predicate on ``ws``)."""
        # Never earlier than the write that made the row startable (an enqueue, a resume,
        # a delay falling due): a claimer whose clock was read before that write committed
        # must not make the retry of a resume (which finds its work by updated_at) take the
        # claim for undone, nor record a start before the delay's end.
        now = f"GREATEST(ws.updated_at, {p(now_ms, 'bigint')})"
        return f"""UPDATE {self.table('workflow_status')} ws
                SET status = {p(PENDING)},
                    owner_xid = {self.fresh_owner(p)},
                    executor_id = {p(executor_id)},
                    application_version = COALESCE(ws.application_version,
                                                   {p(application_version)}),
                    started_at_epoch_ms = {now},
                    rate_limited = {p(rate_limited, 'boolean')},
                    -- Claim an unclaimed row for this application; a nameless dequeuer
                    -- leaves ownership untouched.
                    application_name = COALESCE(ws.application_name, {p(self.app_name)}),
                    recovery_attempts = recovery_attempts + 1,
                    updated_at = {now},
                    -- The start-to-close timeout starts now, when the workflow starts.
                    workflow_deadline_epoch_ms = CASE
                      WHEN workflow_timeout_ms IS NOT NULL AND workflow_deadline_epoch_ms IS NULL
                      THEN {now} + LEAST(workflow_timeout_ms, 9223372036854775807 - {now})
                      ELSE workflow_deadline_epoch_ms END
                WHERE {target} AND {self.scoped('ws', p)} AND {self.own_scope('ws', p)} {guard}
                RETURNING {CLAIMED_COLUMNS}{self.key_columns('ws')},
                          ws.started_at_epoch_ms - ws.created_at AS queued_ms,
                          (SELECT wi.inputs FROM {self.table('workflow_input')} wi
                           WHERE {self.scoped_join('wi', 'ws', p)}) AS inputs,
                          -- A fresh workflow has none: its execution need not load them.
                          EXISTS (SELECT 1 FROM {self.table('operation_outputs')} oo
                                  WHERE {self.scoped_join('oo', 'ws', p)}) AS has_checkpoints"""

    def _partitions_cte(self, queue_name: str, after: str | None, p: Params) -> str:
        """CTEs ending in ``partitions(pk)``: the queue's partition keys with ENQUEUED
        work, in key order starting just after ``after`` and wrapping around to it (a claim
        loop's rotation, see ``dbos_async._executor.queues.rotation``).

        Each lap is a recursive loose index scan: one seek per distinct key on
        idx_workflow_status_partition_dequeue_v3, so the cost follows the number of
        partitions, not the depth of the backlog. The laps are joined by UNION ALL, whose
        Append returns its first input, then its second, and stops pulling as soon as the
        consumer's LIMIT is met.
        """
        table = self.table("workflow_status")
        q, enq = p(queue_name), p(ENQUEUED)
        scope = f"""{self.scoped(None, p)} AND {self.own_scope(None, p)}
                    AND queue_name = {q} AND status = {enq}"""

        def lap(name: str, bound: str) -> str:
            return f"""{name} AS (
                  (SELECT queue_partition_key AS pk FROM {table}
                   WHERE {scope} AND queue_partition_key IS NOT NULL {bound}
                   ORDER BY queue_partition_key LIMIT 1)
                  UNION ALL
                  SELECT (SELECT queue_partition_key FROM {table}
                          WHERE {scope} AND queue_partition_key > {name}.pk {bound}
                          ORDER BY queue_partition_key LIMIT 1)
                  FROM {name} WHERE {name}.pk IS NOT NULL
                )"""

        if after is None:
            return f"""{lap('later', '')},
                partitions AS (SELECT pk FROM later WHERE pk IS NOT NULL)"""
        cursor = p(after)
        return f"""{lap('later', f'AND queue_partition_key > {cursor}')},
                {lap('earlier', f'AND queue_partition_key <= {cursor}')},
                partitions AS (
                  SELECT pk FROM later WHERE pk IS NOT NULL
                  UNION ALL
                  SELECT pk FROM earlier WHERE pk IS NOT NULL)"""

    def dequeue_scopes(self, queue_name: str, *, distributed: bool = False) -> Query:
        """The keys a sharded queue's claim rounds visit: those with ENQUEUED work of
        this application (one multi-shard read, no lock).

        Both shapes read idx_workflow_status_queue_keys (ENQUEUED rows by queue, then key)
        alone. On PostgreSQL a recursive loose index scan seeks from one key to the next,
        so the cost follows the number of keys, not the backlog. A distributed table
        (Citus) refuses a recursive CTE that does not name one key, so there each shard
        runs the DISTINCT itself, through that index: its part reads the shard's ENQUEUED
        entries of the queue, never its heap or its other rows. (Citus's
        run_command_on_shards could run the loose scan per shard, but it was measured
        four times slower than this pushed-down DISTINCT.)

        Args:
            queue_name: The queue.
            distributed: Whether the table is distributed by key (Citus).
        """
        if not self.sharded:
            raise DBOSError("Dequeue scopes exist only on a sharded system database")
        p = Params()
        table = self.table("workflow_status")
        # The application's scope filters the index entries it walks (application_name is
        # in the index): a key whose ENQUEUED rows all belong to another application costs
        # a walk over them, each other key one seek.
        enqueued = (f"queue_name = {p(queue_name)} AND status = {p(ENQUEUED)} "
                    f"AND {self.own_scope(None, p)}")
        if distributed:
            return Query(f"SELECT DISTINCT shard_key FROM {table} WHERE {enqueued}", p.values)
        return Query(
            f"""WITH RECURSIVE keys AS (
                  (SELECT shard_key FROM {table} WHERE {enqueued}
                   ORDER BY shard_key LIMIT 1)
                  UNION ALL
                  SELECT (SELECT shard_key FROM {table}
                          WHERE {enqueued} AND shard_key > keys.shard_key
                          ORDER BY shard_key LIMIT 1)
                  FROM keys WHERE keys.shard_key IS NOT NULL
                )
                SELECT shard_key FROM keys WHERE shard_key IS NOT NULL""",
            p.values,
        )

    def dequeue_scopes_on_shards(self, queue_name: str, shard_ids: Sequence[int]) -> Query:
        """:meth:`dequeue_scopes` over the given shards of ``workflow_status`` on a Citus
        node, named as that node's own tables (``workflow_status_<shard>``): a plain
        statement on that node alone, so one node out of reach does not hide the keys of
        the others. Each shard's part reads its index as the distributed statement's does.
        """
        p = Params()
        enqueued = (f"queue_name = {p(queue_name)} AND status = {p(ENQUEUED)} "
                    f"AND {self.own_scope(None, p)}")
        parts = " UNION ".join(
            f"SELECT DISTINCT shard_key FROM {self.table('workflow_status')}_{shard_id} "
            f"WHERE {enqueued}" for shard_id in shard_ids)
        return Query(parts, p.values)

    def queue_partitions(self, queue_name: str, cap: int, after: str | None = None) -> Query:
        """The distinct partition keys with ENQUEUED workflows, at most ``cap`` of them, in
        key order from just after ``after`` round to it."""
        p = Params()
        return Query(
            f"""WITH RECURSIVE {self._partitions_cte(queue_name, after, p)}
                SELECT pk FROM partitions LIMIT {p(cap, 'bigint')}""",
            p.values,
        )

    def partition_heads(self, queue_name: str, application_version: str | None,
                        cap: int, after: str | None = None) -> Query:
        """The head-of-line workflow of each partition that has none running, the
        partitions walked from just after ``after`` (see :meth:`_partitions_cte`).

        For partition concurrency 1: the head is taken whatever its function, so a partition
        whose head this executor cannot run waits for one that can, in order. The idle test
        sits inside the per-partition subquery, so the heads come out in the walk's order
        (an anti-join outside it could be planned as a merge join, sorted by key).
        """
        p = Params()
        table = self.table("workflow_status")
        partitions = self._partitions_cte(queue_name, after, p)
        q = p(queue_name)
        return Query(
            f"""WITH RECURSIVE {partitions}
                SELECT head.workflow_uuid FROM partitions
                CROSS JOIN LATERAL (
                  SELECT workflow_uuid FROM {table}
                  WHERE {self.scoped(None, p)} AND queue_name = {q}
                    AND status = {p(ENQUEUED)} AND queue_partition_key = partitions.pk
                    AND {self._version_clause(application_version, p)}
                    AND {self.own_scope(None, p)}
                    AND NOT EXISTS (
                      SELECT 1 FROM {table} running
                      WHERE {self.scoped('running', p)} AND running.queue_name = {q}
                        AND running.status = {p(PENDING)}
                        AND running.queue_partition_key = partitions.pk)
                  ORDER BY priority ASC, created_at ASC, workflow_uuid
                  LIMIT 1) head
                LIMIT {p(cap, 'bigint')}""",
            p.values,
        )

    def lock_partition_heads(self, workflow_ids: Sequence[str], queue_name: str,
                             names: Sequence[str]) -> Query:
        """Lock a fixed set of heads, and each one's partition for this transaction.

        Never a LIMIT query: SKIP LOCKED there could slide past a locked head and admit the
        next one out of order. The transaction-scoped advisory lock on (queue, partition)
        makes sweepers of one partition take turns; the flip that follows, a new statement,
        then sees any workflow the previous holder started there.
        """
        p = Params()
        q = p(queue_name)
        return Query(
            f"""SELECT workflow_uuid FROM {self.table('workflow_status')}
                WHERE {self.wf_in(None, workflow_ids, p)} AND status = {p(ENQUEUED)}
                  AND queue_name = {q} AND queue_partition_key IS NOT NULL
                  AND {self.own_scope(None, p)}
                  AND name = ANY({p(list(names), 'text[]')})
                  AND pg_try_advisory_xact_lock(
                        hashtextextended({q} || ':' || queue_partition_key, 0))
                FOR UPDATE SKIP LOCKED""",
            p.values,
        )

    def poll_queues(self, now_ms: int, queue_names: Sequence[str], names: Sequence[str],
                    application_version: str | None) -> Query:
        """The queue watcher's one statement: DELAYED workflows whose time has come become
        ENQUEUED (returns their queues, and the next due time), and which of
        ``queue_names`` hold ENQUEUED workflows this executor could start (functions in
        ``names``, its version rule), as written by writers that send no notification.

        A debounced workflow gives up its debounce key when promoted: its window has
        closed, so a later call starts a new one. One index probe per queue name (EXISTS),
        whatever the backlog. No lock is taken: the claim that follows locks what it starts.
        """
        p = Params()
        table = self.table("workflow_status")
        now = p(now_ms, "bigint")
        delayed = p(DELAYED)
        # One uncorrelated EXISTS per queue name: Citus refuses a subquery correlated with
        # a row of unnest().
        probes = []
        for queue_name in queue_names:
            queue = p(queue_name)
            probes.append(
                f"""CASE WHEN EXISTS (
                      SELECT 1 FROM {table}
                      WHERE {self.scoped(None, p)} AND status = {p(ENQUEUED)}
                        AND queue_name = {queue}
                        AND {self._version_clause(application_version, p)}
                        AND {self.own_scope(None, p)}
                        AND name = ANY({p(list(names), 'text[]')})) THEN {queue} END""")
        enqueued = f"array_remove(ARRAY[{', '.join(probes)}]::text[], NULL)"
        return Query(
            f"""WITH due AS (
                  UPDATE {table}
                  SET status = {p(ENQUEUED)}, updated_at = {now},
                      deduplication_id = CASE WHEN is_debounced THEN NULL
                                              ELSE deduplication_id END
                  WHERE {self.scoped(None, p)} AND status = {delayed}
                    AND delay_until_epoch_ms <= {now}
                  RETURNING queue_name
                )
                SELECT (SELECT array_agg(DISTINCT queue_name) FROM due) AS promoted,
                       (SELECT min(delay_until_epoch_ms) FROM {table}
                        WHERE {self.scoped(None, p)} AND status = {delayed}
                          AND delay_until_epoch_ms > {now}) AS next_due,
                       {enqueued} AS enqueued""",
            p.values,
        )

    def sample_depths(self, queue_names: Sequence[str], minute_ms: int, now_ms: int,
                      keep_since_ms: int) -> Query:
        """Store how many workflows of each of ``queue_names`` wait (ENQUEUED or DELAYED) as
        the minute ``minute_ms``'s depth sample, for the queues no executor of this
        application sampled in that minute yet (the first sample of a minute stands: the
        others skip their counts), and delete this application's samples older than
        ``keep_since_ms``. Keyed by the application ('' without one), whose rows the count
        is scoped to. No lock is read or taken beyond the inserted keys': two executors
        sampling at once both count, and the conflict keeps one row."""
        p = Params()
        samples = self.table(DEPTH_SAMPLES_TABLE)
        application = p(self.app_name or "", "text")
        minute = p(minute_ms, "bigint")
        # One count per status, each served by its partial index (the ENQUEUED rows by
        # queue; the DELAYED ones, few, by due time): a list of both statuses matches
        # neither index's predicate, and the count would scan the table.
        waiting = [f"""(SELECT count(*) FROM {self.table('workflow_status')} w
                        WHERE {self.scoped('w', p)} AND {self.own_scope('w', p)}
                          AND w.queue_name = q.name AND w.status = {p(status)})"""
                   for status in (ENQUEUED, DELAYED)]
        return Query(
            f"""WITH trimmed AS (
                  DELETE FROM {samples}
                  WHERE application_name = {application}
                    AND minute_epoch_ms < {p(keep_since_ms, 'bigint')}
                )
                INSERT INTO {samples} (application_name, minute_epoch_ms, queue_name,
                                       waiting, sampled_at_epoch_ms)
                SELECT {application}, {minute}, q.name, {' + '.join(waiting)},
                       {p(now_ms, 'bigint')}
                FROM unnest({p(list(queue_names), 'text[]')}) AS q(name)
                WHERE NOT EXISTS (
                  SELECT 1 FROM {samples} s
                  WHERE s.application_name = {application} AND s.minute_epoch_ms = {minute}
                    AND s.queue_name = q.name)
                ON CONFLICT (application_name, minute_epoch_ms, queue_name) DO NOTHING""",
            p.values,
        )

    def find_deduplicated(self, queue_name: str, deduplication_id: str) -> Query:
        """The active workflow holding a deduplication ID on a queue."""
        p = Params()
        return Query(
            f"""SELECT workflow_uuid, name FROM {self.table('workflow_status')}
                WHERE {self.scoped(None, p)} AND queue_name = {p(queue_name)}
                  AND deduplication_id = {p(deduplication_id)}""",
            p.values,
        )

    def debounce_existing(self, queue_name: str, key: str, name: str, inputs: Payload,
                          delay_until_ms: int, now_ms: int) -> Query:
        """Push back a still-DELAYED debounced workflow (no later than its debounce deadline)
        and give it the latest inputs (and their format), in one statement; no row if none
        is waiting."""
        p = Params()
        until = p(delay_until_ms, "bigint")
        return Query(
            f"""WITH bounced AS (
                  UPDATE {self.table('workflow_status')}
                  SET delay_until_epoch_ms = CASE
                        WHEN debounce_deadline_epoch_ms IS NULL THEN {until}
                        ELSE LEAST({until}, debounce_deadline_epoch_ms) END,
                      updated_at = {p(now_ms, 'bigint')},
                      serialization = {p(inputs.serialization)}
                  WHERE {self.scoped(None, p)} AND queue_name = {p(queue_name)}
                    AND deduplication_id = {p(key)} AND status = {p(DELAYED)}
                    AND is_debounced AND name = {p(name)}
                  RETURNING workflow_uuid{self.key_columns()}
                ), replaced AS (
                  UPDATE {self.table('workflow_input')} wi SET inputs = {p(inputs.text)}
                  FROM bounced WHERE {self.wf_join('wi', 'bounced')}
                    AND {self.scoped('wi', p)}
                  RETURNING 1
                )
                SELECT workflow_uuid FROM bounced""",
            p.values,
        )
