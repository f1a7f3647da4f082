"""The SQL of the system database, one builder per statement.

Statements locate a workflow's rows only through the seam below (``wf``, ``wf_in``,
``wf_join``, ``wf_values``, ``key_conflict``, ``scoped``, ``global_``, ``claim_gate``,
``key_column``). This class implements the unsharded versions; a sharded subclass adds its
shard key to each without rewriting a statement. Every value is a parameter; the only text
spliced into SQL is the schema identifier, validated and quoted once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from dbos_async.errors import DBOSError
from dbos_async.sysdb import shard_keys

PENDING = "PENDING"
SUCCESS = "SUCCESS"
ERROR = "ERROR"
CANCELLED = "CANCELLED"
ENQUEUED = "ENQUEUED"
DELAYED = "DELAYED"
MAX_RECOVERY_ATTEMPTS_EXCEEDED = "MAX_RECOVERY_ATTEMPTS_EXCEEDED"

ACTIVE_STATUSES = (PENDING, ENQUEUED, DELAYED)

PORTABLE_JSON = "portable_json"


class Params:
    """Collects positional parameters while a statement is built; each call returns its ``$n``."""

    def __init__(self) -> None:
        self.values: list[Any] = []

    def __call__(self, value: Any, cast: str | None = None) -> str:
        self.values.append(value)
        ref = f"${len(self.values)}"
        return f"{ref}::{cast}" if cast else ref


@dataclass(frozen=True)
class Query:
    sql: str
    params: Sequence[Any] = field(default_factory=tuple)


@dataclass(frozen=True)
class NewWorkflow:
    """The columns a new workflow row is written with."""

    workflow_id: str
    name: str
    status: str
    inputs: str
    executor_id: str
    application_version: str | None
    created_at_ms: int
    class_name: str | None = None
    config_name: str | None = None
    queue_name: str | None = None
    timeout_ms: int | None = None
    deadline_epoch_ms: int | None = None
    parent_workflow_id: str | None = None
    authenticated_user: str | None = None
    assumed_role: str | None = None
    authenticated_roles: str | None = None
    priority: int = 0
    serialization: str = PORTABLE_JSON
    shard_key: str | None = None
    # Queue columns (see dbos_async/executor/queues.py).
    deduplication_id: str | None = None
    queue_partition_key: str | None = None
    delay_until_epoch_ms: int | None = None
    debounce_deadline_epoch_ms: int | None = None
    is_debounced: bool = False


@dataclass(frozen=True)
class ParentStep:
    """The checkpoint a parent records when it starts a child, fenced by the parent's owner."""

    workflow_id: str
    function_id: int
    owner_xid: str
    started_at_ms: int


INTERNAL_QUEUE_NAME = "_dbos_internal_queue"
"""The queue DBOS uses to run resumed workflows; every executor dispatches it."""

DEDUP_INDEX = "uq_workflow_status_dedup_id"


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

CLAIMED_COLUMNS = """workflow_uuid, status, name, class_name, config_name, owner_xid,
                     serialization, workflow_deadline_epoch_ms, recovery_attempts,
                     queue_partition_key"""


def qualify(alias: str | None, column: str) -> str:
    return f"{alias}.{column}" if alias else column


class Statements:
    """Builds the system database's statements for one schema."""

    def __init__(self, quoted_schema: str) -> None:
        self.schema = quoted_schema

    def table(self, name: str) -> str:
        return f"{self.schema}.{name}"

    # ---- The seam: how statements locate a workflow's rows ----

    @property
    def sharded(self) -> bool:
        return False

    def _reject_shard_key(self, workflow_id: str, shard_key: str | None = None) -> None:
        if shard_key is not None or shard_keys.bound_shard_key(workflow_id) is not None:
            raise DBOSError("A shard key was given, but this system database is not sharded")

    def wf(
        self,
        alias: str | None,
        workflow_id: str,
        p: Params,
        column: str = "workflow_uuid",
        shard_key: str | None = None,
    ) -> str:
        """Predicate selecting one workflow's rows."""
        self._reject_shard_key(workflow_id, shard_key)
        return f"{qualify(alias, column)} = {p(workflow_id)}"

    def wf_in(self, alias: str | None, workflow_ids: Sequence[str], p: Params) -> str:
        """Predicate selecting several workflows' rows."""
        for workflow_id in workflow_ids:
            self._reject_shard_key(workflow_id)
        return f"{qualify(alias, 'workflow_uuid')} = ANY({p(list(workflow_ids), 'text[]')})"

    def wf_join(self, left: str, right: str) -> str:
        """Condition joining two tables' rows of the same workflow."""
        return f"{left}.workflow_uuid = {right}.workflow_uuid"

    def wf_values(self, workflow_id: str, shard_key: str | None = None) -> dict[str, Any]:
        """Extra column values for a new row of this workflow."""
        self._reject_shard_key(workflow_id, shard_key)
        return {}

    def key_conflict(self, *columns: str) -> str:
        """Conflict target for a unique key of a workflow table."""
        return ", ".join(columns)

    def scoped(self, alias: str | None, p: Params) -> str:
        """Predicate confining a statement that names no single workflow to the current shard."""
        return "TRUE"

    def global_(self, alias: str | None, p: Params) -> str:
        """Predicate selecting a global table's rows (queues, schedules, versions)."""
        return "TRUE"

    def claim_gate(self, queue_name: str, partition_key: str | None, p: Params) -> str:
        """Predicate a queue claim must also meet; sharded, it caps claimers per key."""
        return "TRUE"

    def key_column(self, alias: str | None, column: str = "shard_key") -> str | None:
        """A shard-key column to read back with a row, if this schema has one."""
        return None

    # ---- Workflow start ----

    def insert_workflow(
        self, wf: NewWorkflow, creator_xid: str, parent: ParentStep | None = None
    ) -> Query:
        """Insert a workflow and its inputs in one autocommit statement.

        An existing row comes back unchanged (the no-op update makes ON CONFLICT return it), so
        the caller compares ``creator_xid`` to learn whether this call created it: a retry of a
        statement that committed but lost its reply recognises its own row. The inputs are
        written only by the creator. With ``parent``, the statement also fences the parent's
        ownership under a row lock and records the parent's step naming the child, so a stale
        parent execution cannot start a child.
        """
        p = Params()
        owner_xid = creator_xid if wf.status == PENDING else None
        values: dict[str, Any] = {
            **self.wf_values(wf.workflow_id, wf.shard_key),
            "workflow_uuid": wf.workflow_id,
            "status": wf.status,
            "name": wf.name,
            "class_name": wf.class_name,
            "config_name": wf.config_name,
            "queue_name": wf.queue_name,
            "authenticated_user": wf.authenticated_user,
            "assumed_role": wf.assumed_role,
            "authenticated_roles": wf.authenticated_roles,
            "executor_id": wf.executor_id,
            "application_version": wf.application_version,
            "created_at": wf.created_at_ms,
            "updated_at": wf.created_at_ms,
            "recovery_attempts": 1 if wf.status == PENDING else 0,
            "workflow_timeout_ms": wf.timeout_ms,
            "workflow_deadline_epoch_ms": wf.deadline_epoch_ms,
            "priority": wf.priority,
            "parent_workflow_id": wf.parent_workflow_id,
            "serialization": wf.serialization,
            "creator_xid": creator_xid,
            "owner_xid": owner_xid,
        }
        if wf.queue_name is not None:
            values.update({
                "deduplication_id": wf.deduplication_id,
                "queue_partition_key": wf.queue_partition_key,
                "delay_until_epoch_ms": wf.delay_until_epoch_ms,
                "debounce_deadline_epoch_ms": wf.debounce_deadline_epoch_ms,
                "is_debounced": wf.is_debounced,
            })
        casts = {"created_at": "bigint", "updated_at": "bigint", "recovery_attempts": "bigint",
                 "workflow_timeout_ms": "bigint", "workflow_deadline_epoch_ms": "bigint",
                 "priority": "integer", "delay_until_epoch_ms": "bigint",
                 "debounce_deadline_epoch_ms": "bigint", "is_debounced": "boolean"}
        ctes: list[str] = []
        gate = ""
        if parent is not None:
            # FOR NO KEY UPDATE holds the parent's row until commit, so no hand-off of the
            # parent lands between this fence and the child's insert.
            ctes.append(
                f"""parent AS (
                  SELECT status, owner_xid FROM {self.table('workflow_status')}
                  WHERE {self.wf(None, parent.workflow_id, p)}
                  FOR NO KEY UPDATE
                )"""
            )
            gate = (
                f"WHERE EXISTS (SELECT 1 FROM parent WHERE parent.status = {p(PENDING)} "
                f"AND parent.owner_xid = {p(parent.owner_xid)})"
            )
        columns = ", ".join(values)
        selected = ", ".join(p(v, casts.get(k, "text")) for k, v in values.items())
        ctes.append(
            f"""status AS (
              INSERT INTO {self.table('workflow_status')} ({columns})
              SELECT {selected} {gate}
              ON CONFLICT ({self.key_conflict('workflow_uuid')})
                DO UPDATE SET creator_xid = workflow_status.creator_xid
              RETURNING workflow_uuid, status, name, class_name, config_name, queue_name,
                        executor_id, creator_xid, owner_xid, serialization,
                        workflow_deadline_epoch_ms, recovery_attempts
            )"""
        )
        input_values = {**self.wf_values(wf.workflow_id, wf.shard_key),
                        "workflow_uuid": wf.workflow_id, "inputs": wf.inputs}
        ctes.append(
            f"""input AS (
              INSERT INTO {self.table('workflow_input')} ({', '.join(input_values)})
              SELECT {', '.join(p(v, 'text') for v in input_values.values())}
              FROM status WHERE status.creator_xid = {p(creator_xid)}
              ON CONFLICT ({self.key_conflict('workflow_uuid')}) DO NOTHING
              RETURNING 1
            )"""
        )
        select = "SELECT status.* FROM status"
        if parent is not None:
            step_values = {
                **self.wf_values(parent.workflow_id),
                "workflow_uuid": parent.workflow_id,
                "function_id": parent.function_id,
                "function_name": wf.name,
                "child_workflow_id": wf.workflow_id,
                "started_at_epoch_ms": parent.started_at_ms,
                "completed_at_epoch_ms": parent.started_at_ms,
                "serialization": PORTABLE_JSON,
            }
            step_casts = {"function_id": "integer", "started_at_epoch_ms": "bigint",
                          "completed_at_epoch_ms": "bigint"}
            ctes.append(
                f"""step AS (
                  INSERT INTO {self.table('operation_outputs')} ({', '.join(step_values)})
                  SELECT {', '.join(p(v, step_casts.get(k, "text"))
                                    for k, v in step_values.items())}
                  FROM status
                  ON CONFLICT ({self.key_conflict('workflow_uuid', 'function_id')}) DO NOTHING
                  RETURNING 1
                )"""
            )
            select = """SELECT parent.status AS parent_status, parent.owner_xid AS parent_owner,
                               status.*
                        FROM parent LEFT JOIN status ON TRUE"""
        return Query(f"WITH {', '.join(ctes)} {select}", p.values)

    # ---- Recovery ----

    def claim_pending(
        self,
        executor_id: str,
        application_version: str | None,
        now_ms: int,
        exclude: Sequence[str] = (),
    ) -> Query:
        """Take ownership of this executor's PENDING workflows, each under a fresh owner token.

        The new ``owner_xid`` fences off any execution still running from before (in this
        process or a zombie elsewhere): its next durable write fails the ownership check.
        """
        p = Params()
        version = (
            f"application_version = {p(application_version)}"
            if application_version is not None
            else "application_version IS NULL"
        )
        return Query(
            f"""UPDATE {self.table('workflow_status')} ws
                SET owner_xid = gen_random_uuid()::text,
                    recovery_attempts = recovery_attempts + 1,
                    updated_at = {p(now_ms, 'bigint')}
                WHERE {self.scoped('ws', p)}
                  AND status = {p(PENDING)} AND executor_id = {p(executor_id)} AND {version}
                  -- Executions already running here keep their ownership.
                  AND NOT (workflow_uuid = ANY({p(list(exclude), 'text[]')}))
                RETURNING workflow_uuid, status, name, class_name, config_name, owner_xid,
                          serialization, workflow_deadline_epoch_ms, recovery_attempts,
                          (SELECT wi.inputs FROM {self.table('workflow_input')} wi
                           WHERE {self.wf_join('wi', 'ws')}) AS inputs""",
            p.values,
        )

    def load_checkpoints(self, workflow_id: str) -> Query:
        p = Params()
        return Query(
            f"""SELECT function_id, function_name, output, error, child_workflow_id, serialization
                FROM {self.table('operation_outputs')}
                WHERE {self.wf(None, workflow_id, p)}
                ORDER BY function_id""",
            p.values,
        )

    # ---- Steps ----

    def record_step(
        self,
        workflow_id: str,
        function_id: int,
        function_name: str,
        owner_xid: str,
        output: str | None,
        error: str | None,
        started_at_ms: int,
        completed_at_ms: int,
    ) -> Query:
        """Fence, notice cancellation and record a step's outcome, in one round trip.

        The status row is locked FOR NO KEY UPDATE, so no hand-off (recovery, cancel, resume)
        commits between the ownership check and the insert; the insert happens only while this
        execution owns a PENDING workflow. ON CONFLICT DO NOTHING keeps the first record of a
        step; the caller reads an existing one back when ``inserted`` is false.
        """
        p = Params()
        owner = self._owner_cte(workflow_id, p)
        step = self._step_cte(workflow_id, function_id, function_name, owner_xid, p,
                              output=output, error=error, started_at_ms=started_at_ms,
                              completed_at_ms=completed_at_ms)
        return Query(f"WITH {owner}, {step} {self._verdict(owner_xid, 'step', p)}", p.values)

    def get_checkpoint(self, workflow_id: str, function_id: int) -> Query:
        p = Params()
        return Query(
            f"""SELECT function_id, function_name, output, error, child_workflow_id, serialization
                FROM {self.table('operation_outputs')}
                WHERE {self.wf(None, workflow_id, p)}
                  AND function_id = {p(function_id, 'integer')}""",
            p.values,
        )

    # ---- Workflow outcome ----

    def record_outcome(
        self,
        workflow_id: str,
        status: str,
        owner_xid: str,
        output: str | None,
        error: str | None,
        now_ms: int,
    ) -> Query:
        """Record a workflow's terminal outcome in one autocommit statement.

        The UPDATE applies only to a PENDING row this execution still owns; the output is
        written only if the UPDATE was, so a stale execution leaves no payload behind.
        """
        p = Params()
        target = self.wf(None, workflow_id, p)
        keys = self.wf_values(workflow_id)
        output_values = {**keys, "workflow_uuid": workflow_id, "output": output, "error": error}
        return Query(
            f"""WITH updated AS (
                  UPDATE {self.table('workflow_status')}
                  SET status = {p(status)},
                      -- A finished workflow holds no deduplication ID and has no owner.
                      deduplication_id = NULL,
                      owner_xid = NULL,
                      updated_at = {p(now_ms, 'bigint')},
                      completed_at = {p(now_ms, 'bigint')}
                  WHERE {target} AND status = {p(PENDING)} AND owner_xid = {p(owner_xid)}
                  RETURNING 1
                ), stored AS (
                  INSERT INTO {self.table('workflow_output')} ({', '.join(output_values)})
                  SELECT {', '.join(p(v, 'text') for v in output_values.values())}
                  WHERE EXISTS (SELECT 1 FROM updated)
                  ON CONFLICT ({self.key_conflict('workflow_uuid')})
                    DO UPDATE SET output = EXCLUDED.output, error = EXCLUDED.error
                  RETURNING 1
                )
                SELECT count(*) AS count FROM updated""",
            p.values,
        )

    def cancel_workflows(self, workflow_ids: Sequence[str], now_ms: int) -> Query:
        """Mark workflows CANCELLED unless already finished; clearing the owner stops them."""
        p = Params()
        return Query(
            f"""UPDATE {self.table('workflow_status')}
                SET status = {p(CANCELLED)}, owner_xid = NULL, queue_name = NULL,
                    deduplication_id = NULL, started_at_epoch_ms = NULL,
                    updated_at = {p(now_ms, 'bigint')}, completed_at = {p(now_ms, 'bigint')}
                WHERE {self.wf_in(None, workflow_ids, p)}
                  AND status NOT IN ({p(SUCCESS)}, {p(ERROR)})""",
            p.values,
        )

    # ---- Reads ----

    STATUS_COLUMNS = (
        "workflow_uuid", "status", "name", "class_name", "config_name", "queue_name",
        "executor_id", "application_version", "application_id", "authenticated_user",
        "assumed_role", "authenticated_roles", "created_at", "updated_at", "recovery_attempts",
        "workflow_timeout_ms", "workflow_deadline_epoch_ms", "started_at_epoch_ms",
        "deduplication_id", "priority", "queue_partition_key", "forked_from",
        "parent_workflow_id", "serialization", "completed_at",
    )

    def get_workflow(self, workflow_id: str, *, load_input: bool, load_output: bool) -> Query:
        p = Params()
        columns = [f"ws.{c}" for c in self.STATUS_COLUMNS]
        joins = []
        if load_input:
            columns.append("COALESCE(wi.inputs, ws.inputs) AS inputs")
            joins.append(
                f"LEFT JOIN {self.table('workflow_input')} wi ON {self.wf_join('wi', 'ws')}"
            )
        if load_output:
            columns += ["COALESCE(wo.output, ws.output) AS output",
                        "COALESCE(wo.error, ws.error) AS error"]
            joins.append(
                f"LEFT JOIN {self.table('workflow_output')} wo ON {self.wf_join('wo', 'ws')}"
            )
        return Query(
            f"""SELECT {', '.join(columns)}
                FROM {self.table('workflow_status')} ws {' '.join(joins)}
                WHERE {self.wf('ws', workflow_id, p)}""",
            p.values,
        )

    # ---- Application versions ----

    def register_version(self, version_name: str, now_ms: int) -> Query:
        """Record this application version; an existing one keeps its original timestamp."""
        p = Params()
        return Query(
            f"""INSERT INTO {self.table('application_versions')}
                  (version_id, version_name, version_timestamp, created_at)
                VALUES (gen_random_uuid()::text, {p(version_name)}, {p(now_ms, 'bigint')},
                        {p(now_ms, 'bigint')})
                ON CONFLICT DO NOTHING""",
            p.values,
        )

    # ---- Messages, events, streams (see dbos_async/sysdb/notifications.py) ----

    def _owner_cte(self, workflow_id: str, p: Params) -> str:
        # FOR NO KEY UPDATE: no hand-off (recovery, cancel, resume) of the workflow commits
        # between the ownership check and the writes of the same statement.
        return f"""owner AS (
                  SELECT status, owner_xid FROM {self.table('workflow_status')}
                  WHERE {self.wf(None, workflow_id, p)}
                  FOR NO KEY UPDATE
                )"""

    def _owned(self, owner_xid: str, p: Params) -> str:
        return f"owner.status = {p(PENDING)} AND owner.owner_xid = {p(owner_xid)}"

    def _verdict(self, owner_xid: str, write: str, p: Params) -> str:
        """What a fenced statement returns: the status, whether we own it, whether ``write``
        landed."""
        owned = f"owner.owner_xid IS NOT DISTINCT FROM {p(owner_xid)}"
        return f"""SELECT owner.status, {owned} AS owned,
                       EXISTS (SELECT 1 FROM {write}) AS inserted
                FROM owner"""

    def _step_cte(
        self,
        workflow_id: str,
        function_id: int,
        function_name: str,
        owner_xid: str,
        p: Params,
        *,
        output: str | None,
        started_at_ms: int,
        completed_at_ms: int,
        error: str | None = None,
        output_sql: str | None = None,
        source: str = "owner",
    ) -> str:
        """An insert of a checkpoint, guarded by the owner CTE; RETURNING 1 when it landed."""
        values: dict[str, str] = {
            col: p(val, 'text') for col, val in self.wf_values(workflow_id).items()
        }
        values.update({
            "workflow_uuid": p(workflow_id, "text"),
            "function_id": p(function_id, "integer"),
            "function_name": p(function_name, "text"),
            "output": output_sql if output_sql is not None else p(output, "text"),
            "error": p(error, "text"),
            "started_at_epoch_ms": p(started_at_ms, "bigint"),
            "completed_at_epoch_ms": p(completed_at_ms, "bigint"),
            "serialization": p(PORTABLE_JSON, "text"),
        })
        where = "" if source != "owner" else f"WHERE {self._owned(owner_xid, p)}"
        return f"""step AS (
                  INSERT INTO {self.table('operation_outputs')} ({', '.join(values)})
                  SELECT {', '.join(values.values())}
                  FROM {source} {where}
                  ON CONFLICT ({self.key_conflict('workflow_uuid', 'function_id')}) DO NOTHING
                  RETURNING 1
                )"""

    def _notification_values(
        self, destination_id: str, message_uuid: str, topic: str, message: str, p: Params
    ) -> dict[str, str]:
        values = {col: p(val, 'text') for col, val in self.wf_values(destination_id).items()}
        values.update({
            "message_uuid": p(message_uuid, "text"),
            "destination_uuid": p(destination_id, "text"),
            "topic": p(topic, "text"),
            "message": p(message, "text"),
            "serialization": p(PORTABLE_JSON, "text"),
        })
        return values

    def send_message(
        self, destination_id: str, message_uuid: str, topic: str, message: str
    ) -> Query:
        """Insert a message (from outside a workflow); a repeated message_uuid is ignored.

        The trigger on notifications NOTIFYs dbos_notifications_channel. A missing
        destination fails the foreign key (23503).
        """
        p = Params()
        values = self._notification_values(destination_id, message_uuid, topic, message, p)
        return Query(
            f"""INSERT INTO {self.table('notifications')} ({', '.join(values)})
                VALUES ({', '.join(values.values())})
                ON CONFLICT ({self.key_conflict('message_uuid')}) DO NOTHING""",
            p.values,
        )

    def send_message_fenced(
        self, workflow_id: str, owner_xid: str, destination_id: str, message_uuid: str,
        topic: str, message: str,
    ) -> Query:
        """Insert a message from a step of ``workflow_id``: only while the caller owns it.

        Not a checkpoint (the step's own checkpoint covers it); the status row lock fences
        the insert against a hand-off of the sending workflow.
        """
        p = Params()
        owner = self._owner_cte(workflow_id, p)
        values = self._notification_values(destination_id, message_uuid, topic, message, p)
        return Query(
            f"""WITH {owner}, sent AS (
                  INSERT INTO {self.table('notifications')} ({', '.join(values)})
                  SELECT {', '.join(values.values())}
                  FROM owner WHERE {self._owned(owner_xid, p)}
                  ON CONFLICT ({self.key_conflict('message_uuid')}) DO NOTHING
                  RETURNING 1
                )
                {self._verdict(owner_xid, 'sent', p)}""",
            p.values,
        )

    def send_message_recorded(
        self, workflow_id: str, function_id: int, owner_xid: str, destination_id: str,
        message_uuid: str, topic: str, message: str, now_ms: int,
    ) -> Query:
        """A workflow's send: its checkpoint and the message, in one fenced statement.

        The message is inserted only if the checkpoint was (it selects from the step's
        RETURNING), so a retried or replayed send never delivers twice.
        """
        p = Params()
        owner = self._owner_cte(workflow_id, p)
        step = self._step_cte(workflow_id, function_id, "DBOS.send", owner_xid, p,
                              output=None, started_at_ms=now_ms, completed_at_ms=now_ms)
        values = self._notification_values(destination_id, message_uuid, topic, message, p)
        return Query(
            f"""WITH {owner}, {step}, sent AS (
                  INSERT INTO {self.table('notifications')} ({', '.join(values)})
                  SELECT {', '.join(values.values())} FROM step
                  ON CONFLICT ({self.key_conflict('message_uuid')}) DO NOTHING
                  RETURNING 1
                )
                {self._verdict(owner_xid, 'step', p)}""",
            p.values,
        )

    def has_message(self, workflow_id: str, topic: str) -> Query:
        """Whether an unconsumed message for (workflow, topic) is waiting."""
        p = Params()
        return Query(
            f"""SELECT EXISTS (
                  SELECT 1 FROM {self.table('notifications')}
                  WHERE {self.wf(None, workflow_id, p, 'destination_uuid')}
                    AND topic = {p(topic)} AND consumed = false
                ) AS waiting""",
            p.values,
        )

    def consume_message(
        self, workflow_id: str, function_id: int, owner_xid: str, topic: str, now_ms: int
    ) -> Query:
        """recv: consume the oldest unconsumed message and record it as the step's output.

        One fenced statement: the status row lock fences ownership; the message row is
        locked FOR UPDATE SKIP LOCKED (a concurrent consumer takes the next one); nothing is
        consumed if the step is already recorded. ``message`` is NULL if none was waiting.
        """
        p = Params()
        owner = self._owner_cte(workflow_id, p)
        dest = self.wf("n", workflow_id, p, "destination_uuid")
        topic_ref = p(topic)
        fid = p(function_id, "integer")
        step = self._step_cte(workflow_id, function_id, "DBOS.recv", owner_xid, p,
                              output=None, started_at_ms=now_ms, completed_at_ms=now_ms,
                              output_sql="consumed.message", source="consumed")
        return Query(
            f"""WITH {owner}, msg AS (
                  -- Lock the oldest waiting message; SKIP LOCKED passes one being consumed.
                  SELECT n.message_uuid FROM {self.table('notifications')} n
                  WHERE {dest} AND n.topic = {topic_ref} AND n.consumed = false
                    AND EXISTS (SELECT 1 FROM owner WHERE {self._owned(owner_xid, p)})
                    AND NOT EXISTS (
                      SELECT 1 FROM {self.table('operation_outputs')} oo
                      WHERE {self.wf('oo', workflow_id, p)} AND oo.function_id = {fid})
                  ORDER BY n.created_at_epoch_ms, n.message_uuid
                  LIMIT 1
                  FOR UPDATE SKIP LOCKED
                ), consumed AS (
                  UPDATE {self.table('notifications')} n
                  SET consumed = true, consumed_by_function_id = {fid}
                  FROM msg WHERE n.message_uuid = msg.message_uuid
                    AND {self.wf('n', workflow_id, p, 'destination_uuid')}
                  RETURNING n.message, n.serialization
                ), {step}
                SELECT owner.status, owner.owner_xid IS NOT DISTINCT FROM {p(owner_xid)} AS owned,
                       (SELECT message FROM consumed) AS message,
                       (SELECT serialization FROM consumed) AS serialization,
                       EXISTS (SELECT 1 FROM step) AS inserted,
                       -- Already recorded (a retry whose first reply was lost).
                       EXISTS (SELECT 1 FROM {self.table('operation_outputs')} oo
                               WHERE {self.wf('oo', workflow_id, p)}
                                 AND oo.function_id = {fid}) AS recorded
                FROM owner""",
            p.values,
        )

    def _event_ctes(
        self, workflow_id: str, key: str, value: str, function_id: int | None, source: str,
        p: Params,
    ) -> str:
        keys = {col: p(val, 'text') for col, val in self.wf_values(workflow_id).items()}
        event = {**keys, "workflow_uuid": p(workflow_id, "text"), "key": p(key, "text"),
                 "value": p(value, "text"), "serialization": p(PORTABLE_JSON, "text")}
        ctes = [
            f"""event AS (
                  INSERT INTO {self.table('workflow_events')} ({', '.join(event)})
                  SELECT {', '.join(event.values())} FROM {source}
                  ON CONFLICT ({self.key_conflict('workflow_uuid', 'key')})
                    DO UPDATE SET value = EXCLUDED.value, serialization = EXCLUDED.serialization
                  RETURNING 1
                )"""
        ]
        if function_id is not None:
            history = {**keys, "workflow_uuid": p(workflow_id, "text"),
                       "function_id": p(function_id, "integer"), "key": p(key, "text"),
                       "value": p(value, "text"), "serialization": p(PORTABLE_JSON, "text")}
            ctes.append(
                f"""history AS (
                  INSERT INTO {self.table('workflow_events_history')} ({', '.join(history)})
                  SELECT {', '.join(history.values())} FROM {source}
                  ON CONFLICT ({self.key_conflict('workflow_uuid', 'function_id', 'key')})
                    DO UPDATE SET value = EXCLUDED.value, serialization = EXCLUDED.serialization
                  RETURNING 1
                )"""
            )
        return ", ".join(ctes)

    def set_event_recorded(
        self, workflow_id: str, function_id: int, owner_xid: str, key: str, value: str,
        now_ms: int,
    ) -> Query:
        """A workflow's set_event: checkpoint, latest value and history row, one statement.

        The event rows are written only if the checkpoint was, under the status row lock.
        """
        p = Params()
        owner = self._owner_cte(workflow_id, p)
        step = self._step_cte(workflow_id, function_id, "DBOS.setEvent", owner_xid, p,
                              output=None, started_at_ms=now_ms, completed_at_ms=now_ms)
        events = self._event_ctes(workflow_id, key, value, function_id, "step", p)
        return Query(
            f"""WITH {owner}, {step}, {events}
                {self._verdict(owner_xid, 'step', p)}""",
            p.values,
        )

    def set_event_fenced(self, workflow_id: str, owner_xid: str, key: str, value: str) -> Query:
        """set_event from a step: the latest value, written only while the caller owns it."""
        p = Params()
        owner = self._owner_cte(workflow_id, p)
        events = self._event_ctes(workflow_id, key, value, None,
                                  f"owner WHERE {self._owned(owner_xid, p)}", p)
        return Query(
            f"""WITH {owner}, {events}
                {self._verdict(owner_xid, 'event', p)}""",
            p.values,
        )

    def get_event(self, workflow_id: str, key: str) -> Query:
        p = Params()
        return Query(
            f"""SELECT value, serialization FROM {self.table('workflow_events')}
                WHERE {self.wf(None, workflow_id, p)} AND key = {p(key)}""",
            p.values,
        )

    def get_all_events(self, workflow_id: str) -> Query:
        p = Params()
        return Query(
            f"""SELECT key, value, serialization FROM {self.table('workflow_events')}
                WHERE {self.wf(None, workflow_id, p)} ORDER BY key""",
            p.values,
        )

    def _stream_cte(
        self, workflow_id: str, key: str, value: str, function_id: int, source: str, p: Params
    ) -> str:
        keys = {col: p(val, 'text') for col, val in self.wf_values(workflow_id).items()}
        key_ref = p(key, "text")
        values = {
            **keys,
            "workflow_uuid": p(workflow_id, "text"),
            "key": key_ref,
            "value": p(value, "text"),
            # The next offset, derived in the insert; a concurrent writer that took the same
            # one fails the primary key and the caller retries.
            '"offset"': f"""COALESCE((SELECT max(s."offset") FROM {self.table('streams')} s
                                WHERE {self.wf('s', workflow_id, p)} AND s.key = {key_ref}),
                               -1) + 1""",
            "function_id": p(function_id, "integer"),
            "serialization": p(PORTABLE_JSON, "text"),
        }
        return f"""written AS (
                  INSERT INTO {self.table('streams')} ({', '.join(values)})
                  SELECT {', '.join(values.values())} FROM {source}
                  RETURNING "offset"
                )"""

    def write_stream_recorded(
        self, workflow_id: str, function_id: int, function_name: str, owner_xid: str,
        key: str, value: str, now_ms: int,
    ) -> Query:
        """A workflow's stream write (or close): checkpoint and value, in one fenced statement."""
        p = Params()
        owner = self._owner_cte(workflow_id, p)
        step = self._step_cte(workflow_id, function_id, function_name, owner_xid, p,
                              output=None, started_at_ms=now_ms, completed_at_ms=now_ms)
        written = self._stream_cte(workflow_id, key, value, function_id, "step", p)
        return Query(
            f"""WITH {owner}, {step}, {written}
                {self._verdict(owner_xid, 'step', p)}""",
            p.values,
        )

    def write_stream_fenced(
        self, workflow_id: str, owner_xid: str, key: str, value: str, function_id: int
    ) -> Query:
        """A stream write from a step: only while the caller owns the workflow; not recorded."""
        p = Params()
        owner = self._owner_cte(workflow_id, p)
        written = self._stream_cte(workflow_id, key, value, function_id,
                                   f"owner WHERE {self._owned(owner_xid, p)}", p)
        return Query(
            f"""WITH {owner}, {written}
                {self._verdict(owner_xid, 'written', p)}""",
            p.values,
        )

    def read_stream_value(self, workflow_id: str, key: str, offset: int) -> Query:
        """The value at ``offset`` and the writer's status, in one primary-key lookup.

        No row: no such workflow. A NULL ``stream_offset``: nothing at that offset yet.
        """
        p = Params()
        return Query(
            f"""SELECT ws.status, s.value, s.serialization, s."offset" AS stream_offset
                FROM {self.table('workflow_status')} ws
                LEFT JOIN {self.table('streams')} s
                  ON {self.wf_join('s', 'ws')} AND s.key = {p(key)}
                     AND s."offset" = {p(offset, 'integer')}
                WHERE {self.wf('ws', workflow_id, p)}""",
            p.values,
        )

    def completed_among(self, workflow_ids: Sequence[str]) -> Query:
        """Those of these workflows that reached a terminal status."""
        p = Params()
        return Query(
            f"""SELECT workflow_uuid FROM {self.table('workflow_status')}
                WHERE {self.wf_in(None, workflow_ids, p)}
                  AND status <> ALL({p(list(ACTIVE_STATUSES), 'text[]')})""",
            p.values,
        )

    # ---- Queues (see dbos_async/executor/queues.py and dispatcher.py) ----

    def upsert_queue(self, queue: QueueRecord, now_ms: int) -> Query:
        """Record a queue declared in code; the declaration in code wins over a stored one."""
        p = Params()
        values = {column: getattr(queue, column) for column in QUEUE_COLUMNS}
        casts = {"concurrency": "integer", "worker_concurrency": "integer",
                 "rate_limit_max": "integer", "rate_limit_period_sec": "float8",
                 "partition_queue": "boolean", "partition_concurrency": "integer",
                 "partition_worker_concurrency": "integer",
                 "partition_rate_limit_max": "integer",
                 "partition_rate_limit_period_sec": "float8", "polling_interval_sec": "float8"}
        refs = [p(v, casts.get(k, "text")) for k, v in values.items()]
        updates = ", ".join(f"{c} = EXCLUDED.{c}" for c in QUEUE_COLUMNS if c != "name")
        return Query(
            f"""INSERT INTO {self.table('queues')}
                  ({', '.join(values)}, priority_enabled, created_at, updated_at)
                -- priority_enabled is vestigial: every queue dispatches in priority order.
                VALUES ({', '.join(refs)}, TRUE, {p(now_ms, 'bigint')}, {p(now_ms, 'bigint')})
                ON CONFLICT (name) DO UPDATE SET {updates}, updated_at = EXCLUDED.updated_at""",
            p.values,
        )

    def list_queues(self, names: Sequence[str] | None) -> Query:
        """The stored queues (those named, or all)."""
        p = Params()
        named = f"AND name = ANY({p(list(names), 'text[]')})" if names is not None else ""
        return Query(
            f"""SELECT {', '.join(QUEUE_COLUMNS)} FROM {self.table('queues')}
                WHERE {self.global_(None, p)} {named} ORDER BY name""",
            p.values,
        )

    def _version_clause(self, application_version: str | None, p: Params,
                        alias: str | None = None) -> str:
        # The seed's "latest version" rule: a claim takes workflows of this executor's
        # version, and unversioned ones (enqueued by SQL or another client) only while this
        # version is the latest registered one, or none is registered. Once a newer version
        # is registered, an old executor leaves unversioned work to the new one. Read in the
        # claim's statement, so under SERIALIZABLE a concurrent version bump is a conflict.
        column = qualify(alias, "application_version")
        if application_version is None:
            return f"{column} IS NULL"
        version = p(application_version)
        latest = (f"(SELECT av.version_name FROM {self.table('application_versions')} av"
                  f" WHERE {self.global_('av', p)}"
                  " ORDER BY av.version_timestamp DESC LIMIT 1)")
        return (f"({column} = {version} OR ({column} IS NULL"
                f" AND COALESCE({latest}, {version}) = {version}))")

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
                WHERE {self.scoped(None, p)} AND queue_name = {p(queue_name)}
                  AND status = {p(PENDING)} {self._partition_filter(partition_key, p)}""",
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
                  AND rate_limited = true
                  AND status <> ALL({p([ENQUEUED, DELAYED], 'text[]')})
                  AND started_at_epoch_ms > {p(since_ms, 'bigint')}
                  {self._partition_filter(partition_key, p)}""",
            p.values,
        )

    def select_startable(
        self, queue_name: str, partition_key: str | None, names: Sequence[str],
        application_version: str | None, limit: int | None, nowait: bool,
    ) -> Query:
        """Lock the queue's next workflows (priority, then age) that this executor can run.

        Only functions registered here are taken: another executor's workflows stay ENQUEUED.
        ``nowait`` (a budget shared across executors): FOR UPDATE NOWAIT, so two claimers of
        the same head rows do not queue behind each other's locks; the loser fails at once
        (55P03) and retries with a fresh snapshot and count. Otherwise FOR UPDATE SKIP
        LOCKED: claimers take disjoint rows and nobody waits.
        """
        p = Params()
        lock = "FOR UPDATE NOWAIT" if nowait else "FOR UPDATE SKIP LOCKED"
        return Query(
            f"""SELECT workflow_uuid FROM {self.table('workflow_status')}
                WHERE {self.scoped(None, p)} AND status = {p(ENQUEUED)}
                  AND queue_name = {p(queue_name)}
                  AND {self._version_clause(application_version, p)}
                  AND name = ANY({p(list(names), 'text[]')})
                  AND {self.claim_gate(queue_name, partition_key, p)}
                  {self._partition_filter(partition_key, p)}
                ORDER BY priority ASC, created_at ASC
                LIMIT {p(limit, 'bigint')}
                {lock}""",
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
        now = p(now_ms, "bigint")
        guard = ""
        if partition_heads:
            guard = f"""AND NOT EXISTS (
                      SELECT 1 FROM {self.table('workflow_status')} running
                      WHERE {self.scoped('running', p)} AND running.queue_name = ws.queue_name
                        AND running.status = {p(PENDING)}
                        AND running.queue_partition_key = ws.queue_partition_key)"""
        return Query(
            f"""UPDATE {self.table('workflow_status')} ws
                SET status = {p(PENDING)},
                    owner_xid = gen_random_uuid()::text,
                    executor_id = {p(executor_id)},
                    application_version = COALESCE(ws.application_version,
                                                   {p(application_version)}),
                    started_at_epoch_ms = {now},
                    rate_limited = {p(rate_limited, 'boolean')},
                    recovery_attempts = recovery_attempts + 1,
                    updated_at = {now},
                    -- The start-to-close timeout starts now, when the workflow starts.
                    workflow_deadline_epoch_ms = CASE
                      WHEN workflow_timeout_ms IS NOT NULL AND workflow_deadline_epoch_ms IS NULL
                      THEN {now} + LEAST(workflow_timeout_ms, 9223372036854775807 - {now})
                      ELSE workflow_deadline_epoch_ms END
                WHERE {self.wf_in('ws', workflow_ids, p)} AND status = {p(ENQUEUED)}
                  AND queue_name = {p(queue_name)} {guard}
                RETURNING {CLAIMED_COLUMNS},
                          (SELECT wi.inputs FROM {self.table('workflow_input')} wi
                           WHERE {self.wf_join('wi', 'ws')}) AS inputs""",
            p.values,
        )

    def _partitions_cte(self, queue_name: str, p: Params) -> str:
        # Recursive loose index scan: one seek per distinct key on
        # idx_workflow_status_partition_dequeue_v3, so the cost follows the number of
        # partitions, not the depth of the backlog.
        table = self.table("workflow_status")
        q, enq = p(queue_name), p(ENQUEUED)
        scope = self.scoped(None, p)
        return f"""partitions AS (
              (SELECT queue_partition_key AS pk FROM {table}
               WHERE {scope} AND queue_name = {q} AND status = {enq}
                 AND queue_partition_key IS NOT NULL
               ORDER BY queue_partition_key LIMIT 1)
              UNION ALL
              SELECT (SELECT queue_partition_key FROM {table}
                      WHERE {scope} AND queue_name = {q} AND status = {enq}
                        AND queue_partition_key > partitions.pk
                      ORDER BY queue_partition_key LIMIT 1)
              FROM partitions WHERE partitions.pk IS NOT NULL
            )"""

    def queue_partitions(self, queue_name: str, cap: int) -> Query:
        """The distinct partition keys with ENQUEUED workflows, at most ``cap`` of them."""
        p = Params()
        return Query(
            f"""WITH RECURSIVE {self._partitions_cte(queue_name, p)}
                SELECT pk FROM partitions WHERE pk IS NOT NULL LIMIT {p(cap, 'bigint')}""",
            p.values,
        )

    def partition_heads(self, queue_name: str, application_version: str | None,
                        cap: int) -> Query:
        """The head-of-line workflow of each partition that has none running.

        For partition concurrency 1: the head is taken whatever its function, so a partition
        whose head this executor cannot run waits for one that can, in order.
        """
        p = Params()
        table = self.table("workflow_status")
        partitions = self._partitions_cte(queue_name, p)
        q = p(queue_name)
        return Query(
            f"""WITH RECURSIVE {partitions}
                SELECT head.workflow_uuid FROM partitions
                CROSS JOIN LATERAL (
                  SELECT workflow_uuid FROM {table}
                  WHERE {self.scoped(None, p)} AND queue_name = {q}
                    AND status = {p(ENQUEUED)} AND queue_partition_key = partitions.pk
                    AND {self._version_clause(application_version, p)}
                  ORDER BY priority ASC, created_at ASC, workflow_uuid
                  LIMIT 1) head
                WHERE partitions.pk IS NOT NULL
                  AND NOT EXISTS (
                    SELECT 1 FROM {table}
                    WHERE {self.scoped(None, p)} AND queue_name = {q}
                      AND status = {p(PENDING)} AND queue_partition_key = partitions.pk)
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
                  AND name = ANY({p(list(names), 'text[]')})
                  AND pg_try_advisory_xact_lock(
                        hashtextextended({q} || ':' || queue_partition_key, 0))
                FOR UPDATE SKIP LOCKED""",
            p.values,
        )

    def promote_delayed(self, now_ms: int) -> Query:
        """DELAYED workflows whose time has come become ENQUEUED; returns their queues and
        the next due time. A debounced workflow gives up its debounce key here: its window
        has closed, so a later call starts a new one."""
        p = Params()
        table = self.table("workflow_status")
        now = p(now_ms, "bigint")
        delayed = p(DELAYED)
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
                SELECT (SELECT array_agg(DISTINCT queue_name) FROM due) AS queues,
                       (SELECT min(delay_until_epoch_ms) FROM {table}
                        WHERE {self.scoped(None, p)} AND status = {delayed}
                          AND delay_until_epoch_ms > {now}) AS next_due""",
            p.values,
        )

    def requeue_pending(self, executor_id: str, application_version: str | None,
                        now_ms: int, exclude: Sequence[str] = ()) -> Query:
        """Recovery of queued workflows: this executor's PENDING ones go back to ENQUEUED on
        their queue, so the queue's claim (and its limits) admits exactly one runner.

        Clearing the owner fences any execution still running from before.
        """
        p = Params()
        return Query(
            f"""UPDATE {self.table('workflow_status')}
                SET status = {p(ENQUEUED)}, owner_xid = NULL, started_at_epoch_ms = NULL,
                    rate_limited = false, updated_at = {p(now_ms, 'bigint')}
                WHERE {self.scoped(None, p)} AND status = {p(PENDING)}
                  AND executor_id = {p(executor_id)} AND queue_name IS NOT NULL
                  AND {self._recovery_version(application_version, p)}
                  AND NOT (workflow_uuid = ANY({p(list(exclude), 'text[]')}))
                RETURNING workflow_uuid, queue_name""",
            p.values,
        )

    def _recovery_version(self, application_version: str | None, p: Params) -> str:
        return (f"application_version = {p(application_version)}"
                if application_version is not None else "application_version IS NULL")

    def dead_letter_pending(self, executor_id: str, application_version: str | None,
                            max_attempts: int, now_ms: int,
                            exclude: Sequence[str] = ()) -> Query:
        """This executor's PENDING workflows that have used up their recovery attempts become
        MAX_RECOVERY_ATTEMPTS_EXCEEDED (terminal: no owner, no queue slot, no dedup key)."""
        p = Params()
        now = p(now_ms, "bigint")
        return Query(
            f"""UPDATE {self.table('workflow_status')}
                SET status = {p(MAX_RECOVERY_ATTEMPTS_EXCEEDED)}, owner_xid = NULL,
                    deduplication_id = NULL, started_at_epoch_ms = NULL, queue_name = NULL,
                    updated_at = {now}, completed_at = {now}
                WHERE {self.scoped(None, p)} AND status = {p(PENDING)}
                  AND executor_id = {p(executor_id)}
                  AND {self._recovery_version(application_version, p)}
                  AND recovery_attempts > {p(max_attempts, 'bigint')}
                  AND NOT (workflow_uuid = ANY({p(list(exclude), 'text[]')}))
                RETURNING workflow_uuid""",
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

    def debounce_existing(self, queue_name: str, key: str, name: str, inputs: str,
                          delay_until_ms: int, now_ms: int) -> Query:
        """Push back a still-DELAYED debounced workflow (no later than its debounce deadline)
        and give it the latest inputs, in one statement; no row if none is waiting."""
        p = Params()
        until = p(delay_until_ms, "bigint")
        return Query(
            f"""WITH bounced AS (
                  UPDATE {self.table('workflow_status')}
                  SET delay_until_epoch_ms = CASE
                        WHEN debounce_deadline_epoch_ms IS NULL THEN {until}
                        ELSE LEAST({until}, debounce_deadline_epoch_ms) END,
                      updated_at = {p(now_ms, 'bigint')}
                  WHERE {self.scoped(None, p)} AND queue_name = {p(queue_name)}
                    AND deduplication_id = {p(key)} AND status = {p(DELAYED)}
                    AND is_debounced AND name = {p(name)}
                  RETURNING workflow_uuid
                ), replaced AS (
                  UPDATE {self.table('workflow_input')} wi SET inputs = {p(inputs)}
                  FROM bounced WHERE {self.wf_join('wi', 'bounced')}
                  RETURNING 1
                )
                SELECT workflow_uuid FROM bounced""",
            p.values,
        )
