"""Whole workflows as lines of JSON: what an export writes and an import reads.

The line format (version :data:`EXPORT_VERSION`) is one JSON object per workflow::

    {"format": "dbos_async.workflow", "version": 1, "workflow_id": "...",
     "shard_key": null, "tables": {"workflow_status": [{...}], "workflow_input": [...],
     "workflow_output": [...], "operation_outputs": [...], "notifications": [...],
     "workflow_events": [...], "workflow_events_history": [...], "streams": [...]}}

Each table lists the workflow's rows, each row an object of exactly that table's columns
(:data:`~dbos_async._sysdb.statements.EXPORT_COLUMNS`), as stored: payloads stay the
serialized text the database holds, so a line moves a workflow without reading its values.
``datasource_outputs`` (present only when it holds rows) carries the records its
transactions left in the exporting executor's application databases, by data source name
(:data:`~dbos_async._sysdb.application.OUTPUT_COLUMNS`).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from dbos_async._executor.peer import Peer
from dbos_async._sysdb.application import OUTPUT_COLUMNS
from dbos_async._sysdb.shard_keys import WorkflowAddress, validate_shard_key
from dbos_async._sysdb.statements import EXPORT_COLUMNS, WorkflowFilter
from dbos_async._sysdb.statements.transfer import WORKFLOW_COLUMN
from dbos_async._sysdb.transfer import WorkflowRows
from dbos_async.errors import DBOSError, WorkflowImportConflictError, WorkflowImportError

EXPORT_FORMAT = "dbos_async.workflow"
EXPORT_VERSION = 1
TRANSACTIONS_KEY = "datasource_outputs"
SINGLE_ROW_TABLES = ("workflow_status",)
AT_MOST_ONE_ROW_TABLES = ("workflow_input", "workflow_output")


@dataclass(frozen=True)
class ExportedWorkflow(WorkflowRows):
    """One workflow with every row it owns, as an export yields it and an import takes
    it. ``status`` is its ``workflow_status`` row (name, status, attributes, ...);
    ``transactions`` its records in application databases, by data source name."""

    transactions: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    @property
    def status(self) -> dict[str, Any]:
        return self.tables["workflow_status"][0]

    def to_json(self) -> str:
        """The workflow as one line of the export format (no newline)."""
        line: dict[str, Any] = {"format": EXPORT_FORMAT, "version": EXPORT_VERSION,
                                "workflow_id": self.workflow_id, "shard_key": self.shard_key,
                                "tables": self.tables}
        if self.transactions:
            line[TRANSACTIONS_KEY] = self.transactions
        return json.dumps(line, separators=(",", ":"))

    @classmethod
    def from_json(cls, line: str, line_number: int | None = None) -> ExportedWorkflow:
        """Parse and check one line of the export format; anything else raises
        :class:`WorkflowImportError` naming the line and the problem."""
        where = f"line {line_number}" if line_number is not None else "the line"
        try:
            data = json.loads(line)
        except ValueError as error:
            raise WorkflowImportError(f"{where} is not JSON: {error}") from None
        if not isinstance(data, dict) or data.get("format") != EXPORT_FORMAT:
            raise WorkflowImportError(
                f"{where} is not an exported workflow (it has no \"format\": "
                f"\"{EXPORT_FORMAT}\")")
        if data.get("version") != EXPORT_VERSION:
            raise WorkflowImportError(
                f"{where} has export format version {data.get('version')!r}; this version of "
                f"dbos_async reads version {EXPORT_VERSION}")
        workflow_id, shard_key = data.get("workflow_id"), data.get("shard_key")
        if not isinstance(workflow_id, str) or not workflow_id:
            raise WorkflowImportError(f"{where} has no workflow_id")
        if shard_key is not None and (not isinstance(shard_key, str) or not shard_key):
            raise WorkflowImportError(f"{where}: shard_key must be a non-empty string or null")
        tables = data.get("tables")
        if not isinstance(tables, dict) or set(tables) != set(EXPORT_COLUMNS):
            raise WorkflowImportError(
                f"{where}: \"tables\" must hold exactly {', '.join(EXPORT_COLUMNS)}")
        for table, rows in tables.items():
            _check_rows(where, workflow_id, table, rows)
        transactions = data.get(TRANSACTIONS_KEY, {})
        if not isinstance(transactions, dict):
            raise WorkflowImportError(f"{where}: {TRANSACTIONS_KEY} must be an object")
        for source, rows in transactions.items():
            if not isinstance(rows, list) or not all(
                    isinstance(row, dict) and set(row) == set(OUTPUT_COLUMNS) for row in rows):
                raise WorkflowImportError(
                    f"{where}: {TRANSACTIONS_KEY} of data source {source!r} must be a list of "
                    f"rows of the columns {', '.join(OUTPUT_COLUMNS)}")
        return cls(workflow_id, shard_key, tables, transactions)


def _check_rows(where: str, workflow_id: str, table: str, rows: Any) -> None:
    if not isinstance(rows, list) or not all(isinstance(row, dict) for row in rows):
        raise WorkflowImportError(f"{where}: table {table} must be a list of row objects")
    if table in SINGLE_ROW_TABLES and len(rows) != 1:
        raise WorkflowImportError(f"{where}: table {table} must have exactly one row")
    if table in AT_MOST_ONE_ROW_TABLES and len(rows) > 1:
        raise WorkflowImportError(f"{where}: table {table} has more than one row")
    columns = set(EXPORT_COLUMNS[table])
    owner = WORKFLOW_COLUMN.get(table, "workflow_uuid")
    for row in rows:
        if set(row) != columns:
            missing, unknown = sorted(columns - set(row)), sorted(set(row) - columns)
            raise WorkflowImportError(
                f"{where}: a row of {table} does not have the columns of format version "
                f"{EXPORT_VERSION} (missing: {missing or 'none'}; unknown: {unknown or 'none'})")
        if row[owner] != workflow_id:
            raise WorkflowImportError(
                f"{where}: a row of {table} belongs to {row[owner]!r}, not {workflow_id!r}")


@dataclass(frozen=True)
class ImportSummary:
    """What an import did: workflows written, and those found already stored as imported
    (identical rows: left as they were)."""

    imported: int
    unchanged: int


ShardKeyOf = Callable[[ExportedWorkflow], str]


async def export_workflows(peer: Peer, f: WorkflowFilter, batch_size: int
                           ) -> AsyncIterator[ExportedWorkflow]:
    _check_batch_size(batch_size)
    async for rows in peer.system_database.export_workflows(f, batch_size):
        transactions = {}
        for name, database in peer.application_databases.items():
            found = await database.export_outputs(rows.ref)
            if found:
                transactions[name] = found
        yield ExportedWorkflow(rows.workflow_id, rows.shard_key, rows.tables, transactions)


async def import_workflows(
    peer: Peer,
    rows: Iterable[ExportedWorkflow | str] | AsyncIterable[ExportedWorkflow | str],
    shard_key_of: ShardKeyOf | None,
    batch_size: int,
) -> ImportSummary:
    _check_batch_size(batch_size)
    sysdb = peer.system_database
    if shard_key_of is not None and not sysdb.sharded:
        raise WorkflowImportError("shard_key_of was given, but the target system database is "
                                  "not sharded")
    keys = _Keys(sysdb.sharded, shard_key_of)
    imported = unchanged = 0
    batch: list[ExportedWorkflow] = []

    async def flush() -> None:
        nonlocal imported, unchanged
        if batch:
            targeted = keys.target(batch)
            for workflow in batch:  # checked before anything is written
                for source in workflow.transactions:
                    if source not in peer.application_databases:
                        raise WorkflowImportError(
                            f"Workflow {workflow.workflow_id!r} holds records of the data "
                            f"source {source!r}, which this executor or client does not register")
            written = await sysdb.import_workflows(targeted)
            imported, unchanged = imported + written, unchanged + len(targeted) - written
            for workflow in batch:
                for source, found in workflow.transactions.items():
                    await peer.application_databases[source].import_outputs(
                        WorkflowAddress(workflow.workflow_id, keys.key_of(workflow)), found)
            batch.clear()

    line_number = 0
    async for item in _each(rows):
        line_number += 1
        if isinstance(item, str):
            if not item.strip():
                continue
            item = ExportedWorkflow.from_json(item, line_number)
        elif not isinstance(item, ExportedWorkflow):
            raise WorkflowImportError(
                f"item {line_number} is a {type(item).__name__}, not an ExportedWorkflow or a "
                "line of JSON")
        batch.append(item)
        if len(batch) >= batch_size:
            await flush()
    await flush()
    return ImportSummary(imported, unchanged)


async def _each(rows: Iterable[ExportedWorkflow | str] | AsyncIterable[ExportedWorkflow | str]
                ) -> AsyncIterator[ExportedWorkflow | str]:
    if isinstance(rows, AsyncIterable):
        async for row in rows:
            yield row
    else:
        for row in rows:
            yield row


def _check_batch_size(batch_size: int) -> None:
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise DBOSError(f"batch_size must be a positive integer, got {batch_size!r}")


class _Keys:
    """The shard keys imported workflows get in the target database, and those their rows
    name: a workflow's parent and the children its steps started."""

    def __init__(self, sharded: bool, shard_key_of: ShardKeyOf | None) -> None:
        self.sharded = sharded
        self.shard_key_of = shard_key_of
        # Keys given so far by shard_key_of, by workflow ID: a parent or child imported
        # in this import call is found under the key it was given.
        self.given: dict[str, str] = {}

    def target(self, batch: Sequence[ExportedWorkflow]) -> list[WorkflowRows]:
        """The batch as the target stores it, once each (the same workflow twice with
        other rows is a conflict)."""
        keyed = [(workflow, self.key_of(workflow)) for workflow in batch]
        targeted: dict[tuple[str, str | None], WorkflowRows] = {}
        for workflow, key in keyed:
            rows = WorkflowRows(workflow.workflow_id, key, self._tables(workflow, key))
            seen = targeted.setdefault(rows.ref, rows)
            if seen.tables != rows.tables:
                raise WorkflowImportConflictError(
                    workflow.workflow_id, "the import holds it twice, with different rows")
        return list(targeted.values())

    def key_of(self, workflow: ExportedWorkflow) -> str | None:
        if not self.sharded:
            return None
        if self.shard_key_of is None:
            if workflow.shard_key is None:
                raise WorkflowImportError(
                    f"Workflow {workflow.workflow_id!r} has no shard key, and the target "
                    "system database is sharded: pass shard_key_of to give each workflow "
                    "its key")
            return workflow.shard_key
        key = self.shard_key_of(workflow)
        try:
            if key is None:
                raise DBOSError("None is not a shard key")
            validate_shard_key(key)
        except DBOSError as error:
            raise WorkflowImportError(
                f"shard_key_of gave workflow {workflow.workflow_id!r} an invalid key: "
                f"{error}") from None
        self.given[workflow.workflow_id] = key
        return key

    def _tables(self, workflow: ExportedWorkflow, key: str | None) -> dict[str, list[Any]]:
        tables = {table: [dict(row) for row in rows]
                  for table, rows in workflow.tables.items()}
        for row in tables["workflow_status"]:
            row["parent_shard_key"] = self._reference(
                key, row["parent_workflow_id"], row["parent_shard_key"])
        for row in tables["operation_outputs"]:
            row["child_shard_key"] = self._reference(
                key, row["child_workflow_id"], row["child_shard_key"])
        return tables

    def _reference(self, key: str | None, workflow_id: str | None,
                   exported_key: str | None) -> str | None:
        """The key of a referenced workflow: none unsharded or without a reference; with
        shard_key_of, the key it gave that workflow in this import, else the referring
        workflow's own; else the exported key, or the referring workflow's own."""
        if key is None or workflow_id is None:
            return None
        if self.shard_key_of is not None:
            return self.given.get(workflow_id, key)
        return exported_key if exported_key is not None else key
