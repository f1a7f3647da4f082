"""Statements of a workflow's life: start, steps, outcome and status reads."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from dbos_async._sysdb.statements.base import (
    PENDING,
    PORTABLE_JSON,
    Checkpoint,
    FinalOutcome,
    NewWorkflow,
    Params,
    ParentStep,
    Query,
    StatementBase,
    StatementParts,
)


def _named(cte: str, alias: str) -> str:
    """A reference to the common table expression ``cte`` as ``alias`` (its name, prefixed
    in a statement of several, see ``StatementParts``)."""
    return cte if cte == alias else f"{cte} {alias}"


# What a start returns of the row it inserted or found.
_STARTED_COLUMNS = """workflow_uuid, status, name, class_name, config_name, queue_name,
                      executor_id, creator_xid, owner_xid, serialization,
                      workflow_deadline_epoch_ms, recovery_attempts"""


@dataclass(frozen=True)
class _UnnestedStarts:
    """SQL fragments of a batch of new workflows (see ``_unnested_starts``)."""

    rows: str
    stored: str
    selected: str
    key_names: str
    key_values: str


@dataclass(frozen=True)
class _OwnKeys:
    """SQL fragments of a batch whose rows carry their own keys (see ``_rows_scope``): the
    keys' array parameter, their column name in the rows, and the lock order's first key."""

    arrays: str = ""
    names: str = ""
    order: str = ""


class WorkflowStatements(StatementBase):
    # ---- Workflow start ----

    STATUS_CASTS = {"created_at": "bigint", "updated_at": "bigint",
                    "recovery_attempts": "bigint", "workflow_timeout_ms": "bigint",
                    "workflow_deadline_epoch_ms": "bigint", "priority": "integer",
                    "delay_until_epoch_ms": "bigint", "debounce_deadline_epoch_ms": "bigint",
                    "is_debounced": "boolean", "attributes": "jsonb"}
    """The SQL types of the status columns that are not text."""

    def _status_columns(self, wf: NewWorkflow, creator_xid: str,
                        parent_shard_key: str | None = None) -> dict[str, Any]:
        """The status row a new workflow is written with, column by column (after its key)."""
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
            **self.parent_values(wf.parent_workflow_id, parent_shard_key),
            "serialization": wf.serialization,
            "creator_xid": creator_xid,
            "owner_xid": owner_xid,
            "application_name": self.app_name,
        }
        if wf.attributes is not None:
            values["attributes"] = wf.attributes
        if wf.schedule_name is not None:
            values["schedule_name"] = wf.schedule_name
        if wf.queue_name is not None:
            values.update({
                "deduplication_id": wf.deduplication_id,
                "queue_partition_key": wf.queue_partition_key,
                "delay_until_epoch_ms": wf.delay_until_epoch_ms,
                "debounce_deadline_epoch_ms": wf.debounce_deadline_epoch_ms,
                "is_debounced": wf.is_debounced,
            })
        return values

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
        values = self._status_columns(wf, creator_xid,
                                      parent.shard_key if parent is not None else None)
        casts = self.STATUS_CASTS
        ctes: list[str] = []
        gate = ""
        if parent is not None:
            # FOR NO KEY UPDATE holds the parent's row until commit, so no hand-off of the
            # parent lands between this fence and the child's insert.
            ctes.append(
                f"""parent AS (
                  SELECT status, owner_xid FROM {self.table('workflow_status')}
                  WHERE {self.wf(None, parent.workflow_id, p, shard_key=parent.shard_key)}
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
              RETURNING {_STARTED_COLUMNS}{self.key_columns()}
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
                **self.wf_values(parent.workflow_id, parent.shard_key),
                "workflow_uuid": parent.workflow_id,
                "function_id": parent.function_id,
                "function_name": wf.name,
                "child_workflow_id": wf.workflow_id,
                **self.child_values(wf.workflow_id, wf.shard_key),
                "started_at_epoch_ms": parent.started_at_ms,
                "completed_at_epoch_ms": parent.started_at_ms,
                "serialization": PORTABLE_JSON,
                "application_name": self.app_name,
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

    def insert_status(self, wf: NewWorkflow, creator_xid: str,
                      parent_shard_key: str | None = None) -> Query:
        """The status row of :meth:`insert_workflow` alone, for a transaction that writes the
        inputs with :meth:`insert_inputs` once it knows it created the row (``go``): one
        table per statement, which a router sends to the key's shard whole."""
        p = Params()
        values = self._status_columns(wf, creator_xid, parent_shard_key)
        return Query(
            f"""INSERT INTO {self.table('workflow_status')} AS existing ({', '.join(values)})
                VALUES ({', '.join(p(v, self.STATUS_CASTS.get(k, "text"))
                                   for k, v in values.items())})
                ON CONFLICT ({self.key_conflict('workflow_uuid')})
                  DO UPDATE SET creator_xid = existing.creator_xid
                RETURNING {_STARTED_COLUMNS}{self.key_columns()},
                          creator_xid IS NOT DISTINCT FROM {p(creator_xid, 'text')} AS go""",
            p.values,
        )

    def insert_inputs(self, wf: NewWorkflow) -> Query:
        """The inputs of a workflow whose row this transaction created (see
        :meth:`insert_status`)."""
        p = Params()
        values = {**self.wf_values(wf.workflow_id, wf.shard_key),
                  "workflow_uuid": wf.workflow_id, "inputs": wf.inputs}
        return Query(
            f"""INSERT INTO {self.table('workflow_input')} ({', '.join(values)})
                VALUES ({', '.join(p(v, 'text') for v in values.values())})
                ON CONFLICT ({self.key_conflict('workflow_uuid')}) DO NOTHING""",
            p.values,
        )

    def insert_workflows(self, rows: Sequence[tuple[NewWorkflow, str]],
                         shard_key: str | None) -> Query:
        """Insert a batch of new workflows of one shard key (each with its creator token)
        and their inputs, in one statement; the columns go as arrays, so its size does not
        grow with the batch. A row whose ID or deduplication ID is taken is skipped (ON
        CONFLICT DO NOTHING covers both unique keys). If an existing ID belongs to another
        workflow name, nothing is inserted, so the caller can refuse the batch whole.

        One row comes back per row given, in order: whether it was inserted, the existing
        row under its ID (its name and whether its creator token is this batch's: a retry
        whose first reply was lost), and the active holder of its deduplication ID. The
        reads see the rows as they were before the statement (its snapshot), so a holder
        this same statement inserts is not among them (one an earlier statement of its
        transaction inserted is)."""
        p = Params()
        v = self._unnested_starts(rows, shard_key, p)
        status = self.table("workflow_status")
        # Under the caller's shard_key_scope: each join stays within the batch's key.
        existing = f"{self.scoped('ex', p)} AND ex.workflow_uuid = v.workflow_uuid"
        key_names, key_values = v.key_names, v.key_values
        return Query(
            f"""WITH v AS ({v.rows}), clash AS (
                  SELECT 1 FROM v JOIN {status} ex ON {existing} WHERE ex.name <> v.name
                ), inserted AS (
                  INSERT INTO {status} ({key_names}{v.stored})
                  SELECT {key_values}{v.selected} FROM v
                  WHERE NOT EXISTS (SELECT 1 FROM clash)
                  ON CONFLICT DO NOTHING
                  RETURNING workflow_uuid
                ), input AS (
                  INSERT INTO {self.table('workflow_input')} ({key_names}workflow_uuid, inputs)
                  SELECT {key_values}v.workflow_uuid, v.inputs
                  FROM v JOIN inserted ON inserted.workflow_uuid = v.workflow_uuid
                  ON CONFLICT ({self.key_conflict('workflow_uuid')}) DO NOTHING
                  RETURNING 1
                )
                SELECT v.workflow_uuid, inserted.workflow_uuid IS NOT NULL AS inserted,
                       ex.name AS existing_name, ex.creator_xid = v.creator_xid AS ours,
                       holder.workflow_uuid AS holder_id, holder.name AS holder_name
                FROM v
                LEFT JOIN inserted ON inserted.workflow_uuid = v.workflow_uuid
                LEFT JOIN {status} ex ON {existing}
                LEFT JOIN {status} holder
                  ON {self.scoped('holder', p)} AND holder.queue_name = v.queue_name
                     AND holder.deduplication_id = v.deduplication_id
                ORDER BY v.ord""",
            p.values,
        )

    def start_batch(self, rows: Sequence[tuple[NewWorkflow, str]],
                    shard_key: str | None) -> Query:
        """:meth:`insert_workflow` (without a parent) for a group-commit batch: workflows of
        one shard key and one :meth:`status_shape`, with distinct IDs and no deduplication
        ID (a taken one would fail the whole statement). One row comes back per row given,
        in order, as :meth:`insert_workflow` returns it: the new row, or the existing one
        unchanged, whose ``creator_xid`` tells which."""
        p = Params()
        parts = self._start_batch_parts(self._unnested_starts(rows, shard_key, p), "", "", "")
        return Query(f"WITH {', '.join(parts.ctes)} {parts.rows} ORDER BY v.ord", p.values)

    def start_columns(self, rows: Sequence[tuple[NewWorkflow, str]]) -> list[str]:
        """The status columns a batch of ``rows`` writes (after its key), read once for
        every part of its statement (see :meth:`start_batch_parts`)."""
        return list(dict.fromkeys(c for wf, xid in rows for c in self._status_columns(wf, xid)))

    def start_batch_parts(self, rows: Sequence[tuple[NewWorkflow, str]],
                          shard_keys: Sequence[str], p: Params, prefix: str,
                          like: Sequence[str]) -> StatementParts:
        """:meth:`start_batch` of rows with their keys, as parts of a statement of several
        (see :class:`StatementParts`), writing the columns ``like`` (the
        :meth:`start_columns` of the batch, of which ``rows`` is a part): its text is the
        same for any part of it. Its rows come in no order (their key and ID tell them
        apart)."""
        v = self._unnested_starts(rows, None, p, shard_keys, like)
        return self._start_batch_parts(
            v, prefix, "".join(f" AND status.{c} = v.{c}" for c in self.workflow_key_columns),
            v.key_values)

    def _start_batch_parts(self, v: _UnnestedStarts, prefix: str, same_key: str,
                           lock_order: str) -> StatementParts:
        status = self.table("workflow_status")
        key_names, key_values = v.key_names, v.key_values
        rows, inserted = f"{prefix}v", f"{prefix}status"
        # The rows go in ID order, so two batches meeting the same IDs lock them in the
        # same order and cannot deadlock.
        return StatementParts(
            (f"{rows} AS ({v.rows})",
             f"""{inserted} AS (
                  INSERT INTO {status} AS existing ({key_names}{v.stored})
                  SELECT {key_values}{v.selected} FROM {_named(rows, 'v')}
                  ORDER BY {lock_order}v.workflow_uuid
                  ON CONFLICT ({self.key_conflict('workflow_uuid')})
                    DO UPDATE SET creator_xid = existing.creator_xid
                  RETURNING {_STARTED_COLUMNS}{self.key_columns()}
                )""",
             f"""{prefix}input AS (
                  INSERT INTO {self.table('workflow_input')} ({key_names}workflow_uuid, inputs)
                  SELECT {key_values}v.workflow_uuid, v.inputs
                  FROM {_named(rows, 'v')}
                  JOIN {_named(inserted, 'status')} ON status.workflow_uuid = v.workflow_uuid
                                    AND status.creator_xid = v.creator_xid{same_key}
                  ON CONFLICT ({self.key_conflict('workflow_uuid')}) DO NOTHING
                  RETURNING 1
                )"""),
            f"""SELECT status.* FROM {_named(rows, 'v')} JOIN {_named(inserted, 'status')}
                ON status.workflow_uuid = v.workflow_uuid{same_key}""")

    @staticmethod
    def status_shape(wf: NewWorkflow) -> tuple[bool, bool]:
        """Which optional columns :meth:`_status_columns` writes for ``wf``: rows of one
        shape share a batch statement's column list (a column left out keeps its default)."""
        return wf.queue_name is not None, wf.attributes is not None

    def _unnested_starts(self, rows: Sequence[tuple[NewWorkflow, str]],
                         shard_key: str | None, p: Params,
                         shard_keys: Sequence[str] | None = None,
                         like: Sequence[str] | None = None
                         ) -> _UnnestedStarts:
        """New workflows of one key as a row source: the columns go as arrays, so the
        statement's size does not grow with the batch. With ``shard_keys`` (each row's
        key) the rows may be of several keys, their key one more column; with ``like``,
        the columns are those (of a batch of which ``rows`` is a part)."""
        own: list[str] = []
        if shard_keys is None:
            keys = {col: p(val, "text") for col, val in
                    self.wf_values(rows[0][0].workflow_id, shard_key).items()}
        else:
            [key_column] = self.workflow_key_columns
            keys = {key_column: f"v.{key_column}"}
            own = [p(list(shard_keys), "text[]")]
        given = [self._status_columns(wf, xid) for wf, xid in rows]
        shaped = dict.fromkeys(c for g in given for c in g) if like is None else like
        columns = [c for c in shaped if c not in keys]
        columns.append("inputs")
        for g, (wf, _) in zip(given, rows, strict=True):
            g["inputs"] = wf.inputs
        casts = {c: ("text" if c == "attributes" else self.STATUS_CASTS.get(c, "text"))
                 for c in columns}
        arrays = ", ".join([*own, *(p.array([g.get(c) for g in given], casts[c])
                                    for c in columns)])
        names = [*(keys if own else ()), *columns]
        stored = [c for c in columns if c != "inputs"]
        return _UnnestedStarts(
            rows=f"SELECT * FROM unnest({arrays}) WITH ORDINALITY AS v({', '.join(names)}, ord)",
            stored=", ".join(stored),
            selected=", ".join(f"v.{c}::jsonb" if c == "attributes" else f"v.{c}"
                               for c in stored),
            key_names="".join(f"{c}, " for c in keys),
            key_values="".join(f"{v}, " for v in keys.values()),
        )

    # ---- Steps ----

    def load_checkpoints(self, workflow_id: str) -> Query:
        p = Params()
        return Query(
            f"""SELECT function_id, function_name, output, error, child_workflow_id,
                       serialization{self.key_columns(None, ("child_shard_key",))}
                FROM {self.table('operation_outputs')}
                WHERE {self.wf(None, workflow_id, p)}
                ORDER BY function_id""",
            p.values,
        )

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
        child_workflow_id: str | None = None,
        child_shard_key: str | None = None,
        serialization: str = PORTABLE_JSON,
        hold_ms: int | None = None,
    ) -> Query:
        """Fence, notice cancellation and record a step's outcome, in one statement: the
        checkpoint is selected from the workflow's status row, locked FOR NO KEY UPDATE so no
        hand-off (recovery, cancel, resume) commits between the ownership check and the
        insert, and it lands only while this execution owns a PENDING workflow. The row's own
        key feeds the insert, so Citus runs it as one task on that key's shard. RETURNING
        its (workflow, step) and key, as :meth:`record_steps` does, when it landed; when
        nothing did, :meth:`fence_verdict` says why.

        With ``hold_ms``, run in a transaction that keeps the status row locked while it
        commits elsewhere (a transaction on an application database): the transaction may
        then sit idle that long at most before PostgreSQL ends its session, and the lock."""
        p = Params()
        values = self._checkpoint_values(
            self._key_values_of("ws"), workflow_id, function_id, function_name, p,
            output=output, error=error, started_at_ms=started_at_ms,
            completed_at_ms=completed_at_ms, child_workflow_id=child_workflow_id,
            child_shard_key=child_shard_key, serialization=serialization)
        held = "" if hold_ms is None else (
            " CROSS JOIN pg_catalog.set_config('idle_in_transaction_session_timeout', "
            f"{p(str(hold_ms))}, true) AS held")
        source = f"""{self.table('workflow_status')} ws{held}
                     WHERE {self.wf('ws', workflow_id, p)} AND ws.status = {p(PENDING)}
                       AND ws.owner_xid = {p(owner_xid)}
                     FOR NO KEY UPDATE{' OF ws' if held else ''}"""
        insert = self._insert_select("operation_outputs", values, source,
                                     self._checkpoint_conflict())
        return Query(f"{insert} RETURNING workflow_uuid, function_id{self.key_columns()}",
                     p.values)

    def _rows_scope(self, alias: str, shard_keys: Sequence[str] | None, p: Params
                    ) -> tuple[str, _OwnKeys]:
        """How a batch statement confines the status rows ``alias`` it joins: to the
        caller's shard-key scope, or with ``shard_keys`` to each row's own key, one more
        column of its rows (and first in its lock order: (key, ID))."""
        if shard_keys is None:
            return self.scoped(alias, p), _OwnKeys()
        return (f"{alias}.shard_key = v.shard_key",
                _OwnKeys(f", {p(list(shard_keys), 'text[]')}", ", shard_key",
                         f"{alias}.shard_key, "))

    @staticmethod
    def _any_rows(ids: str) -> str:
        """Whether a batch has rows (``ids``, the array parameter of its IDs): a condition
        of no row, which skips a join whole before it reads a table when there are none (a
        node's batch statement on Citus has a part for each of the node's shards, most of
        them without rows, see routed writes)."""
        return f"cardinality({ids}) > 0"

    def _owned_pending(self, alias: str, p: Params) -> str:
        """The fence of a batch statement: the status row ``alias`` is PENDING and owned by
        its batch row's execution (``v.owner_xid``), checked as a row found by primary key."""
        return f"{self.batch_status_is(alias, PENDING, p)} AND {alias}.owner_xid = v.owner_xid"

    def record_steps(self, rows: Sequence[Checkpoint],
                     shard_keys: Sequence[str] | None = None) -> Query:
        """:meth:`record_step` for a batch of checkpoints of one shard key (under the
        caller's shard_key_scope), in one statement: each lands only while its execution
        owns its PENDING workflow, judged row by row. The status rows are locked FOR NO KEY
        UPDATE (no hand-off commits between the check and the insert) in (key and) ID
        order, so statements locking several of them cannot deadlock one another. Where two
        rows claim one step, the first given lands. RETURNING each landed row's (workflow,
        step) and key; a row missing from it asks :meth:`fence_verdict` why, as alone.
        With ``shard_keys`` (each row's key), the rows may be of several keys: for one
        Citus shard's own table, which holds the rows of all its keys (see routed)."""
        p = Params()
        return Query(self._record_steps_insert(rows, shard_keys, p), p.values)

    def record_steps_parts(self, rows: Sequence[Checkpoint], shard_keys: Sequence[str],
                           p: Params, prefix: str) -> StatementParts:
        """:meth:`record_steps` of rows with their keys, as parts of a statement of several
        (see :class:`StatementParts`); its text is the same for any rows, none included."""
        landed = f"{prefix}landed"
        return StatementParts(
            (f"{landed} AS ({self._record_steps_insert(rows, shard_keys, p)})",),
            f"SELECT * FROM {landed}")

    def _record_steps_insert(self, rows: Sequence[Checkpoint], shard_keys: Sequence[str] | None,
                             p: Params) -> str:
        # Every column goes whatever the rows hold (a child's key is NULL without a child),
        # so the text is one for every batch. The rows are read column by column (named
        # tuples, transposed at once).
        given = dict(zip(Checkpoint._fields, zip(*rows, strict=True), strict=True)) if rows \
            else dict.fromkeys(Checkpoint._fields, ())
        children = [self.child_values(r.child_workflow_id, r.child_shard_key)
                    for r in rows] if self.workflow_key_columns else []
        values: dict[str, Sequence[Any]] = {
            "workflow_uuid": given["workflow_id"], "function_id": given["function_id"],
            "function_name": given["function_name"], "owner_xid": given["owner_xid"],
            "output": given["output"], "error": given["error"],
            "child_workflow_id": given["child_workflow_id"],
            **{f"child_{c}": [child.get(f"child_{c}") for child in children]
               for c in self.workflow_key_columns},
            "started_at_epoch_ms": given["started_at_ms"],
            "completed_at_epoch_ms": given["completed_at_ms"],
            "serialization": given["serialization"]}
        names = list(values)
        casts = {"function_id": "integer", "started_at_epoch_ms": "bigint",
                 "completed_at_epoch_ms": "bigint"}
        refs = {c: p.array(v, casts.get(c, "text")) for c, v in values.items()}
        arrays, ids = ", ".join(refs.values()), refs["workflow_uuid"]
        stored = [c for c in names if c != "owner_xid"]
        keys = self._key_values_of("ws")
        columns = [*keys, *stored, "application_name"]
        selected = [*keys.values(), *(f"v.{c}" for c in stored), p(self.app_name, "text")]
        scope, own = self._rows_scope("ws", shard_keys, p)
        return f"""INSERT INTO {self.table('operation_outputs')} ({', '.join(columns)})
                SELECT {', '.join(selected)}
                FROM unnest({arrays}{own.arrays})
                  WITH ORDINALITY AS v({', '.join(names)}{own.names}, ord)
                JOIN {self.table('workflow_status')} ws
                  ON {scope} AND ws.workflow_uuid = v.workflow_uuid
                     AND {self._any_rows(ids)}
                     AND {self._owned_pending('ws', p)}
                ORDER BY {own.order}ws.workflow_uuid, v.ord
                FOR NO KEY UPDATE OF ws
                {self._checkpoint_conflict()}
                RETURNING workflow_uuid, function_id{self.key_columns()}"""

    def fence_verdict(self, workflow_id: str, owner_xid: str) -> Query:
        """Why a fenced write landed nothing: the workflow's status and whether this execution
        still owns it (``inserted`` is false: a write that lands needs no verdict)."""
        p = Params()
        return Query(
            f"""SELECT status, owner_xid IS NOT DISTINCT FROM {p(owner_xid)} AS owned,
                       FALSE AS inserted
                FROM {self.table('workflow_status')} WHERE {self.wf(None, workflow_id, p)}""",
            p.values,
        )

    def get_checkpoint(self, workflow_id: str, function_id: int) -> Query:
        p = Params()
        return Query(
            f"""SELECT function_id, function_name, output, error, child_workflow_id,
                       serialization{self.key_columns(None, ("child_shard_key",))}
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
        RETURNING the ID and key, as :meth:`record_outcomes` does, when it was recorded.
        """
        p = Params()
        output_values = self._output_values(workflow_id, output, error, p)
        return Query(
            f"""WITH updated AS (
                  {self._finish_update(workflow_id, status, owner_xid, now_ms, p)}
                ), stored AS (
                  INSERT INTO {self.table('workflow_output')} ({', '.join(output_values)})
                  SELECT {', '.join(output_values.values())}
                  WHERE EXISTS (SELECT 1 FROM updated)
                  {self._output_conflict()}
                  RETURNING 1
                )
                SELECT workflow_uuid{self.key_columns()} FROM updated""",
            p.values,
        )

    def _finish_update(self, workflow_id: str, status: str, owner_xid: str, now_ms: int,
                       p: Params) -> str:
        """The UPDATE of a terminal outcome, applied only to a PENDING row this execution
        still owns; RETURNING its ID (and key) when it was."""
        return f"""UPDATE {self.table('workflow_status')}
                  SET status = {p(status)},
                      -- A finished workflow holds no deduplication ID and has no owner.
                      deduplication_id = NULL,
                      owner_xid = NULL,
                      updated_at = {p(now_ms, 'bigint')},
                      completed_at = {p(now_ms, 'bigint')}
                  WHERE {self.wf(None, workflow_id, p)} AND status = {p(PENDING)}
                    AND owner_xid = {p(owner_xid)}
                  RETURNING workflow_uuid{self.key_columns()}"""

    def _output_values(self, workflow_id: str, output: str | None, error: str | None,
                       p: Params) -> dict[str, str]:
        values = self._key_values(workflow_id, p)
        values.update({"workflow_uuid": p(workflow_id, "text"),
                       "output": p(output, "text"), "error": p(error, "text")})
        return values

    def _output_conflict(self) -> str:
        return (f"ON CONFLICT ({self.key_conflict('workflow_uuid')}) "
                "DO UPDATE SET output = EXCLUDED.output, error = EXCLUDED.error")

    def record_outcomes(self, rows: Sequence[FinalOutcome], now_ms: int,
                        shard_keys: Sequence[str] | None = None) -> Query:
        """:meth:`record_outcome` for a batch of workflows of one shard key (under the
        caller's shard_key_scope; each workflow once), in one statement, judged row by row:
        a row's status is set only while its execution owns it PENDING, and its payload is
        written only if it was. RETURNING the IDs (and key) whose outcome was recorded.
        With ``shard_keys`` (each row's key), the rows may be of several keys, as
        :meth:`record_steps` takes them."""
        p = Params()
        parts = self.record_outcomes_parts(rows, now_ms, shard_keys, p, "")
        return Query(f"WITH {', '.join(parts.ctes)} {parts.rows}", p.values)

    def record_outcomes_parts(self, rows: Sequence[FinalOutcome], now_ms: int,
                              shard_keys: Sequence[str] | None, p: Params, prefix: str
                              ) -> StatementParts:
        """:meth:`record_outcomes` as parts of a statement of several (see
        :class:`StatementParts`); its text is the same for any rows, none included."""
        # FinalOutcome's fields, in order: the rows (named tuples) transposed at once.
        names = {"workflow_uuid": "text", "status": "text", "owner_xid": "text",
                 "output": "text", "error": "text"}
        columns = zip(*rows, strict=True) if rows else [()] * len(names)
        refs = [p.array(column, cast)
                for column, cast in zip(columns, names.values(), strict=True)]
        arrays = ", ".join(refs)
        keys = self._key_values_of("updated")
        output_columns = [*keys, "workflow_uuid", "output", "error"]
        scope, own = self._rows_scope("ws", shard_keys, p)
        same_key = "" if shard_keys is None else " AND updated.shard_key = v.shard_key"
        v, updated = f"{prefix}v", f"{prefix}updated"
        return StatementParts(
            (f"""{v} AS (
                  SELECT * FROM unnest({arrays}{own.arrays}) AS v({', '.join(names)}{own.names})
                )""",
             f"""{updated} AS (
                  UPDATE {self.table('workflow_status')} ws
                  SET status = v.status,
                      -- A finished workflow holds no deduplication ID and has no owner.
                      deduplication_id = NULL,
                      owner_xid = NULL,
                      updated_at = {p(now_ms, 'bigint')},
                      completed_at = {p(now_ms, 'bigint')}
                  FROM {_named(v, 'v')}
                  WHERE {scope} AND ws.workflow_uuid = v.workflow_uuid
                    AND {self._any_rows(refs[0])}
                    AND {self._owned_pending('ws', p)}
                  RETURNING ws.workflow_uuid{self.key_columns('ws')}
                )""",
             f"""{prefix}stored AS (
                  INSERT INTO {self.table('workflow_output')} ({', '.join(output_columns)})
                  SELECT {', '.join([*keys.values(), 'v.workflow_uuid', 'v.output', 'v.error'])}
                  FROM {_named(v, 'v')} JOIN {_named(updated, 'updated')}
                    ON updated.workflow_uuid = v.workflow_uuid{same_key}
                  ON CONFLICT ({self.key_conflict('workflow_uuid')})
                    DO UPDATE SET output = EXCLUDED.output, error = EXCLUDED.error
                  RETURNING 1
                )"""),
            f"SELECT workflow_uuid{self.key_columns()} FROM {updated}")

    # ---- Reads ----

    def get_workflow(self, workflow_id: str, *, load_input: bool, load_output: bool) -> Query:
        p = Params()
        columns, joins = self.status_select(load_input=load_input, load_output=load_output)
        return Query(
            f"""SELECT {columns}
                FROM {self.table('workflow_status')} ws {joins}
                WHERE {self.wf('ws', workflow_id, p)}""",
            p.values,
        )
