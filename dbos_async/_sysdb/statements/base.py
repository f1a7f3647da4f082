"""Building blocks of the system database's statements: parameters, the shard-key seam, and
the pieces every fenced write shares.

Statements locate a workflow's rows only through the seam (``wf``, ``wf_in``, ``wf_join``,
``wf_values``, ``key_conflict``, ``scoped``, ``global_``, ``claim_gate``). This base
implements the unsharded versions; a sharded subclass adds its shard key to each without
rewriting a statement. Every value is a parameter; the only text spliced into SQL is the
schema identifier, validated and quoted once.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from dbos_async._sysdb import shard_keys
from dbos_async.errors import DBOSError
from dbos_async.statuses import WorkflowStatusString

# The statuses as plain text, the form bound as statement parameters.
PENDING = WorkflowStatusString.PENDING.value
SUCCESS = WorkflowStatusString.SUCCESS.value
ERROR = WorkflowStatusString.ERROR.value
CANCELLED = WorkflowStatusString.CANCELLED.value
ENQUEUED = WorkflowStatusString.ENQUEUED.value
DELAYED = WorkflowStatusString.DELAYED.value
MAX_RECOVERY_ATTEMPTS_EXCEEDED = WorkflowStatusString.MAX_RECOVERY_ATTEMPTS_EXCEEDED.value

ACTIVE_STATUSES = (PENDING, ENQUEUED, DELAYED)

DEPTH_SAMPLES_TABLE = "dbos_async_depth_samples"
"""The queues' measured depths, an addition of this package's own to the unsharded schema
(sql/additions/depth_samples.sql; its name there, and in migrations.py, is this one)."""

PORTABLE_JSON = "portable_json"


class Params:
    """Collects positional parameters while a statement is built; each call returns its ``$n``."""

    def __init__(self) -> None:
        self.values: list[Any] = []

    def __call__(self, value: Any, cast: str | None = None) -> str:
        self.values.append(value)
        ref = f"${len(self.values)}"
        return f"{ref}::{cast}" if cast else ref

    def array(self, values: Sequence[Any], element: str) -> str:
        """``values`` as one parameter of SQL type ``element[]``, sent as ``text[]``.

        asyncpg encodes a ``text[]`` parameter by itself, but for any other array type it
        first asks the server about the type (once per connection and type), a catalogue
        query that takes seconds on a Citus coordinator. The server parses the texts
        instead, to the same values."""
        if element == "text":
            return self(list(values), "text[]")
        return self([None if v is None else str(v) for v in values], f"text[]::{element}[]")


@dataclass(frozen=True)
class Query:
    sql: str
    params: Sequence[Any] = field(default_factory=tuple)


@dataclass(frozen=True)
class StatementParts:
    """A batch statement taken apart, so that several can run as one statement: its common
    table expressions (``name AS (...)``, each name made unique by a prefix) and the
    SELECT of the rows it returns over them. Data-modifying expressions must be at a
    statement's top level, so statements are joined as parts, not nested."""

    ctes: tuple[str, ...]
    rows: str


class Payload(NamedTuple):
    """A value as stored: its text and the format it is written in (the ``serialization``
    column beside it), which tells every reader how to decode it (a named tuple: one is
    built for every value written)."""

    text: str
    serialization: str = PORTABLE_JSON


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
    # Queue columns (see dbos_async/_executor/queues.py).
    deduplication_id: str | None = None
    queue_partition_key: str | None = None
    delay_until_epoch_ms: int | None = None
    debounce_deadline_epoch_ms: int | None = None
    is_debounced: bool = False
    # Custom attributes (a JSON object as text), stored in the jsonb ``attributes`` column.
    attributes: str | None = None
    # The schedule that started it, if one did.
    schedule_name: str | None = None


@dataclass(frozen=True)
class ParentStep:
    """The checkpoint a parent records when it starts a child, fenced by the parent's owner."""

    workflow_id: str
    function_id: int
    owner_xid: str
    started_at_ms: int
    shard_key: str | None = None


class Checkpoint(NamedTuple):
    """A step's outcome to record, fenced by its execution's owner token (see
    ``WorkflowStatements.record_steps``), with the keys of its workflow's child if it
    started one (a named tuple: one is built for every step, and a batch's are read
    column by column)."""

    workflow_id: str
    function_id: int
    function_name: str
    owner_xid: str
    output: str | None
    error: str | None
    started_at_ms: int
    completed_at_ms: int
    child_workflow_id: str | None = None
    child_shard_key: str | None = None
    serialization: str = PORTABLE_JSON


class FinalOutcome(NamedTuple):
    """A workflow's terminal status and payload to record, fenced by its owner token (a
    named tuple: one is built for every workflow that ends)."""

    workflow_id: str
    status: str
    owner_xid: str
    output: str | None
    error: str | None


WorkflowAddress = shard_keys.WorkflowAddress
"""A workflow as a sharded database tells it apart: its ID and shard key (None unsharded)."""


def qualify(alias: str | None, column: str) -> str:
    return f"{alias}.{column}" if alias else column


Writes = Callable[[str], list[tuple[str, str]]]
"""A fenced statement's writes: given the rows they select from (the owner, or the step's
RETURNING), each write's CTE name and INSERT; the first one's landing is the verdict."""


class StatementBase:
    """The seam and shared fragments; the statement families below build on it."""

    def __init__(self, quoted_schema: str) -> None:
        self.schema = quoted_schema

    app_name: str | None = None
    """The application this handle acts for (``application_name``); set by the system
    database. None leaves every statement unscoped and every row's owner untouched."""

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

    def among(self, alias: str | None, refs: Sequence[WorkflowAddress], p: Params,
              column: str = "workflow_uuid") -> str:
        """Predicate true for the rows of these workflows (of any keys: they are given)."""
        return f"{qualify(alias, column)} = ANY({p([i for i, _ in refs], 'text[]')})"

    def parent_in(self, workflow_ids: Sequence[str], p: Params) -> str:
        """Predicate selecting the children of these workflows (under any key)."""
        for workflow_id in workflow_ids:
            self._reject_shard_key(workflow_id)
        return f"parent_workflow_id = ANY({p(list(workflow_ids), 'text[]')})"

    def wf_join(self, left: str, right: str) -> str:
        """Condition joining two tables' rows of the same workflow."""
        return f"{left}.workflow_uuid = {right}.workflow_uuid"

    def scoped_join(self, left: str, right: str, p: Params) -> str:
        """:meth:`wf_join` for a subquery of a statement confined to the current scope."""
        return self.wf_join(left, right)

    def wf_values(self, workflow_id: str, shard_key: str | None = None) -> dict[str, Any]:
        """Extra column values for a new row of this workflow."""
        self._reject_shard_key(workflow_id, shard_key)
        return {}

    def _key_values(self, workflow_id: str, p: Params) -> dict[str, str]:
        """The shard-key columns of a new row of this workflow, as parameters: every
        insert lists them first, so a sharded subclass adds its key in ``wf_values`` alone."""
        return {col: p(val, "text") for col, val in self.wf_values(workflow_id).items()}

    workflow_key_columns: tuple[str, ...] = ()
    """The columns locating a workflow besides its ID (the shard key, when sharded)."""

    def _key_values_of(self, alias: str) -> dict[str, str]:
        """The shard-key columns of a new row, read from the workflow's status row ``alias``:
        Citus runs an INSERT ... SELECT on the key's shard alone only when the key comes
        from the co-located row it selects (a bound key makes it pull rows through the
        coordinator)."""
        return {column: qualify(alias, column) for column in self.workflow_key_columns}

    def key_conflict(self, *columns: str) -> str:
        """Conflict target for a unique key of a workflow table."""
        return ", ".join(columns)

    def fresh_owner(self, p: Params, alias: str = "ws") -> str:
        """A new owner token for each row a claim starts: a random value bound per
        statement and the row's ID, unique per workflow and claim. Computed from parameters
        rather than ``gen_random_uuid()``, which Citus refuses in a distributed UPDATE."""
        return f"({p(str(uuid.uuid4()))} || ':' || {qualify(alias, 'workflow_uuid')})"

    def key_hint(self, workflow_id: str) -> str | None:
        """The key of ``workflow_id``, resolved now for a waiter or notification that
        needs it later; None unsharded."""
        self._reject_shard_key(workflow_id)
        return None

    def scoped(self, alias: str | None, p: Params) -> str:
        """Predicate confining a statement that names no single workflow to the current shard."""
        if shard_keys.current_scope() is not None:
            raise DBOSError("A shard-key scope was given, but this system database is not sharded")
        return "TRUE"

    def global_(self, alias: str | None, p: Params) -> str:
        """Predicate selecting a global table's rows (queues, schedules, versions)."""
        return "TRUE"

    def claim_gate(self, queue_name: str, partition_key: str | None, p: Params) -> str:
        """Predicate a queue claim must also meet; sharded, it caps claimers per key."""
        return "TRUE"

    def parent_values(self, parent_workflow_id: str | None,
                      shard_key: str | None = None) -> dict[str, Any]:
        """Extra column values storing the shard key of a new workflow's parent."""
        return {}

    def child_values(self, child_workflow_id: str | None,
                     shard_key: str | None = None) -> dict[str, Any]:
        """Extra column values storing the shard key of the workflow a step started."""
        return {}

    def key_columns(self, alias: str | None = None,
                    names: Sequence[str] = ("shard_key",)) -> str:
        """The shard-key columns a statement returning rows reads back with each
        (``, shard_key``), so rows of several keys can be told apart; none unsharded."""
        return ""

    def key_in(self, alias: str | None, shard_keys: Sequence[str], p: Params,
               column: str = "shard_key") -> str:
        """Predicate keeping rows whose ``column`` holds one of these shard keys."""
        raise DBOSError("Filtering by shard key requires a sharded system database")

    # ---- Limits of a transaction (SET LOCAL: they end with it) ----

    def idle_transaction_timeout(self, timeout_ms: int) -> Query:
        """Bound how long this transaction may sit idle: PostgreSQL ends the session of a
        caller that stalls while holding row locks, and with it the locks."""
        return self._local_setting("idle_in_transaction_session_timeout", timeout_ms)

    def statement_timeout(self, timeout_ms: int) -> Query:
        """Bound how long each statement of this transaction may run: an observability read
        scanning a huge table cannot hold back vacuum or the pool for minutes."""
        return self._local_setting("statement_timeout", timeout_ms)

    @staticmethod
    def _local_setting(name: str, value_ms: int) -> Query:
        p = Params()
        return Query(f"SELECT set_config({p(name)}, {p(str(value_ms))}, true)", p.values)

    # ---- Status reads ----

    STATUS_COLUMNS = (
        "workflow_uuid", "status", "name", "class_name", "config_name", "queue_name",
        "executor_id", "application_version", "application_id", "authenticated_user",
        "assumed_role", "authenticated_roles", "created_at", "updated_at", "recovery_attempts",
        "workflow_timeout_ms", "workflow_deadline_epoch_ms", "started_at_epoch_ms",
        "deduplication_id", "priority", "queue_partition_key", "forked_from",
        "parent_workflow_id", "serialization", "completed_at", "application_name",
        "attributes", "was_forked_from", "schedule_name",
    )

    def status_select(self, *, load_input: bool, load_output: bool) -> tuple[str, str]:
        """The columns of a status read from ``workflow_status ws``, and the joins of the
        payload tables they need: inputs and outputs only on request."""
        columns = [f"ws.{c}" for c in self.STATUS_COLUMNS]
        keys = self.key_columns("ws", ("shard_key", "parent_shard_key"))
        if keys:
            columns.append(keys.removeprefix(", "))
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
        return ", ".join(columns), " ".join(joins)

    @staticmethod
    def batch_status_is(alias: str, status: str, p: Params) -> str:
        """A batch statement's check that its status row ``alias`` has ``status``, written
        on an expression of the column (alike here: the status is never NULL) so that the
        plan of the batch does not rest on the column's statistics, which lag behind a
        queue's traffic.

        - The planner cannot prove it implies the predicate of a partial index on that
          status (such as idx_workflow_status_pending), so it never reads every row of
          that status through such an index to find the batch among them, a plan whose
          cost grows with the PENDING (or ENQUEUED) workflows of a busy system.
        - It estimates the check at a fixed share of the rows, not by the statistics. With
          a test of the column itself, statistics taken when no row had that status (right
          after a large enqueue) made the planner expect a single row, read the table, and
          match every row of that status against every row of the batch: 0.3-0.4 s for one
          batch of 256 outcomes with 3,000 PENDING of 20,000 rows, against 12 ms now.
        """
        return f"COALESCE({alias}.status, '') = {p(status)}"

    # ---- Application ownership (application_name) ----

    def app_scope(self, alias: str | None, p: Params,
                  names: str | Sequence[str] | None) -> str:
        """Rows owned by these applications plus unclaimed (NULL) ones, which belong to
        every application; None or empty matches every row."""
        if not names:
            return "TRUE"
        column = qualify(alias, "application_name")
        listed = [names] if isinstance(names, str) else list(names)
        return f"({column} = ANY({p(listed, 'text[]')}) OR {column} IS NULL)"

    def own_scope(self, alias: str | None, p: Params) -> str:
        """What this application may recover, dequeue, count and list by default: its own
        rows and unclaimed ones (every row when it has no name)."""
        return self.app_scope(alias, p, self.app_name)

    VERSION_COLUMNS = "version_id, version_name, version_timestamp, created_at, application_name"

    def latest_version_sql(self, p: Params, columns: str = VERSION_COLUMNS) -> str:
        """A query for the newest version this application sees: its own plus unclaimed
        ones (a named peer's deploy does not demote it), or every one when unnamed."""
        table = self.table("application_versions")
        if not self.app_name:
            return (f"SELECT {columns} FROM {table} WHERE {self.global_(None, p)}"
                    " ORDER BY version_timestamp DESC LIMIT 1")
        # One probe per eligible owner, each an index seek: an OR filter could scan a long
        # history of a peer's newer versions. The constant owner stays in the ordering so
        # the IS NULL probe uses the composite index too.
        probes = [
            f"""(SELECT {self.VERSION_COLUMNS} FROM {table}
                 WHERE {self.global_(None, p)} AND {owner}
                 ORDER BY application_name, version_timestamp DESC LIMIT 1)"""
            for owner in (f"application_name = {p(self.app_name)}", "application_name IS NULL")
        ]
        return (f"SELECT {columns} FROM ({' UNION ALL '.join(probes)}) latest"
                " ORDER BY version_timestamp DESC LIMIT 1")

    # ---- Fenced writes: one statement locks, checks ownership and writes ----

    def _insert_select(self, table: str, values: dict[str, str], source: str | None,
                       on_conflict: str = "") -> str:
        """An INSERT of one row of ``values`` (column: SQL) selected from ``source``; with
        no source the row is inserted unconditionally."""
        columns = ", ".join(values)
        if source is None:
            # VALUES, not a SELECT of constants: Citus routes the one but plans the other as an
            # INSERT ... SELECT pulled through the coordinator.
            return f"""INSERT INTO {self.table(table)} ({columns})
                      VALUES ({', '.join(values.values())}) {on_conflict}"""
        return f"""INSERT INTO {self.table(table)} ({columns})
                  SELECT {', '.join(values.values())} FROM {source} {on_conflict}"""

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

    @staticmethod
    def _write_ctes(writes: list[tuple[str, str]]) -> str:
        return ", ".join(f"{name} AS ({insert} RETURNING 1)" for name, insert in writes)

    def _fenced_write(self, workflow_id: str, owner_xid: str, p: Params,
                      writes: Writes) -> Query:
        """Writes from a step of ``workflow_id``: they land only while the caller owns it.
        Not a checkpoint (the step's own covers them); the status row lock fences them
        against a hand-off of the workflow."""
        owner = self._owner_cte(workflow_id, p)
        ctes = writes(f"owner WHERE {self._owned(owner_xid, p)}")
        return Query(f"WITH {owner}, {self._write_ctes(ctes)} "
                     f"{self._verdict(owner_xid, ctes[0][0], p)}", p.values)

    def _recorded_write(self, workflow_id: str, function_id: int, function_name: str,
                        owner_xid: str, now_ms: int, p: Params, writes: Writes) -> Query:
        """A workflow's own write: its checkpoint and the writes, in one fenced statement.
        The writes select from the step's RETURNING, so they land only with the checkpoint
        and a retried or replayed write never lands twice."""
        owner = self._owner_cte(workflow_id, p)
        step = self._step_cte(workflow_id, function_id, function_name, owner_xid, p,
                              output=None, started_at_ms=now_ms, completed_at_ms=now_ms)
        return Query(f"WITH {owner}, {step}, {self._write_ctes(writes('step'))} "
                     f"{self._verdict(owner_xid, 'step', p)}", p.values)

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
        child_workflow_id: str | None = None,
        output_sql: str | None = None,
        serialization_sql: str | None = None,
        source: str | None = None,
    ) -> str:
        """An insert of a checkpoint, from ``source`` or else guarded by the owner CTE;
        RETURNING 1 when it landed."""
        values = self._checkpoint_values(
            self._key_values(workflow_id, p), workflow_id, function_id, function_name, p,
            output=output, started_at_ms=started_at_ms, completed_at_ms=completed_at_ms,
            error=error, child_workflow_id=child_workflow_id, output_sql=output_sql,
            serialization_sql=serialization_sql)
        origin = source or f"owner WHERE {self._owned(owner_xid, p)}"
        return self._write_ctes([
            ("step", self._insert_select("operation_outputs", values, origin,
                                         self._checkpoint_conflict()))])

    def _checkpoint_conflict(self) -> str:
        # The first record of a step stands; a retried or replayed write adds nothing.
        return f"ON CONFLICT ({self.key_conflict('workflow_uuid', 'function_id')}) DO NOTHING"

    def _checkpoint_values(
        self,
        keys: dict[str, str],
        workflow_id: str,
        function_id: int,
        function_name: str,
        p: Params,
        *,
        output: str | None,
        started_at_ms: int,
        completed_at_ms: int,
        error: str | None = None,
        child_workflow_id: str | None = None,
        output_sql: str | None = None,
        child_shard_key: str | None = None,
        serialization: str = PORTABLE_JSON,
        serialization_sql: str | None = None,
    ) -> dict[str, str]:
        """The columns of a checkpoint row (``operation_outputs``), after its ``keys``;
        ``serialization`` is the format of its output and error."""
        values = dict(keys)
        values.update({
            "workflow_uuid": p(workflow_id, "text"),
            "function_id": p(function_id, "integer"),
            "function_name": p(function_name, "text"),
            "output": output_sql if output_sql is not None else p(output, "text"),
            "error": p(error, "text"),
            "child_workflow_id": p(child_workflow_id, "text"),
            **{col: p(val, "text")
               for col, val in self.child_values(child_workflow_id, child_shard_key).items()},
            "started_at_epoch_ms": p(started_at_ms, "bigint"),
            "completed_at_epoch_ms": p(completed_at_ms, "bigint"),
            "serialization": (serialization_sql if serialization_sql is not None
                              else p(serialization, "text")),
            # Mirrors the workflow: the running application records its steps.
            "application_name": p(self.app_name, "text"),
        })
        return values
