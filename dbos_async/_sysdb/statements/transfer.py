"""Statements of exporting and importing whole workflows: every row a workflow owns, read
for a batch of workflows and written back one statement per table.

The exported columns are the unsharded schema's (version 125), plus the keys of a
workflow's parent and of the children its steps started (NULL unsharded); the workflow's
own key travels beside its rows. Reads and writes locate rows through the shard-key seam,
so both schemas export and import.
"""

from __future__ import annotations

from collections.abc import Sequence

from dbos_async._sysdb.statements.base import Params, Query, WorkflowAddress
from dbos_async._sysdb.statements.management.control import ControlStatements, WorkflowFilter

EXPORT_COLUMNS: dict[str, tuple[str, ...]] = {
    "workflow_status": (
        "workflow_uuid", "status", "name", "authenticated_user", "assumed_role",
        "authenticated_roles", "request", "output", "error", "executor_id", "created_at",
        "updated_at", "application_version", "application_id", "class_name", "config_name",
        "recovery_attempts", "queue_name", "workflow_timeout_ms", "workflow_deadline_epoch_ms",
        "inputs", "started_at_epoch_ms", "deduplication_id", "priority",
        "queue_partition_key", "forked_from", "owner_xid", "parent_workflow_id",
        "serialization", "delay_until_epoch_ms", "was_forked_from", "rate_limited",
        "completed_at", "attributes", "schedule_name", "debounce_deadline_epoch_ms",
        "is_debounced", "application_name", "creator_xid", "parent_shard_key",
    ),
    "workflow_input": ("workflow_uuid", "inputs", "retention_timestamp"),
    "workflow_output": ("workflow_uuid", "output", "error", "retention_timestamp"),
    "operation_outputs": (
        "workflow_uuid", "function_id", "function_name", "output", "error",
        "child_workflow_id", "started_at_epoch_ms", "completed_at_epoch_ms", "serialization",
        "application_name", "retention_timestamp", "child_shard_key",
    ),
    "notifications": (
        "message_uuid", "destination_uuid", "topic", "message", "created_at_epoch_ms",
        "serialization", "consumed", "consumed_by_function_id",
    ),
    "workflow_events": ("workflow_uuid", "key", "value", "serialization"),
    "workflow_events_history": ("workflow_uuid", "function_id", "key", "value",
                                "serialization"),
    "streams": ("workflow_uuid", "key", "value", "offset", "function_id", "serialization"),
}
"""Each table of a workflow's rows, in the order an import writes them (the status row
first: the others reference it), with the columns an export line carries for it."""

KEY_REFERENCE_COLUMNS = ("parent_shard_key", "child_shard_key")
"""Exported columns naming another workflow's key: stored only by a sharded schema."""

WORKFLOW_COLUMN = {"notifications": "destination_uuid"}
"""The column naming the workflow a table's row belongs to, where it is not workflow_uuid."""

_ORDER = {
    "operation_outputs": "function_id",
    "notifications": "created_at_epoch_ms, message_uuid",
    "workflow_events": "key",
    "workflow_events_history": "function_id, key",
    "streams": 'key, "offset"',
}


def _quoted(column: str) -> str:
    return '"offset"' if column == "offset" else column


class ExportStatements(ControlStatements):
    def stored_columns(self, table: str) -> tuple[str, ...]:
        """The exported columns of ``table`` this schema stores (the key references only
        when sharded)."""
        return tuple(c for c in EXPORT_COLUMNS[table]
                     if self.sharded or c not in KEY_REFERENCE_COLUMNS)

    def _selected(self, table: str, alias: str) -> str:
        """The exported columns of ``table`` (NULL for a key this schema does not store),
        then the row's own key when sharded."""
        stored = self.stored_columns(table)
        columns = [f"{alias}.{_quoted(c)}" if c in stored else f"NULL::text AS {c}"
                   for c in EXPORT_COLUMNS[table]]
        return ", ".join(columns) + self.key_columns(alias)

    def export_status(self, f: WorkflowFilter) -> Query:
        """Every exported column of the status rows a listing filter selects."""
        return self.filtered_status(f, self._selected("workflow_status", "ws"))

    def export_rows(self, table: str, refs: Sequence[WorkflowAddress]) -> Query:
        """The rows of ``table`` the workflows ``refs`` own, in a stable order."""
        p = Params()
        column = WORKFLOW_COLUMN.get(table, "workflow_uuid")
        order = f"{column}, {_ORDER[table]}" if table in _ORDER else column
        return Query(
            f"""SELECT {self._selected(table, 't')} FROM {self.table(table)} t
                WHERE {self.among('t', refs, p, column)}
                ORDER BY {order}""",
            p.values,
        )

    def import_rows(self, table: str, rows_json: str) -> Query:
        """Insert the rows of ``rows_json`` (a JSON array of objects holding this schema's
        columns of ``table`` and, sharded, ``shard_key``) in one statement. The column
        types come from the table itself (``jsonb_populate_recordset``), so a value of the
        wrong type fails the statement."""
        p = Params()
        columns = ", ".join((*self.workflow_key_columns,
                             *(_quoted(c) for c in self.stored_columns(table))))
        rows = p(rows_json, "jsonb")
        return Query(
            f"""INSERT INTO {self.table(table)} ({columns})
                SELECT {columns}
                FROM jsonb_populate_recordset(NULL::{self.table(table)}, {rows})""",
            p.values,
        )

    def existing_among(self, refs: Sequence[WorkflowAddress]) -> Query:
        """Which of these workflows the database holds already, with their keys."""
        p = Params()
        return Query(
            f"""SELECT workflow_uuid{self.key_columns()} FROM {self.table('workflow_status')}
                WHERE {self.among(None, refs, p)}""",
            p.values,
        )
