"""Exporting and importing whole workflows: every row each one owns, as plain JSON values.

An export is one read-only transaction (one snapshot, no row locks) walking the selected
status rows with a cursor and reading the other tables' rows batch by batch. An import
writes a batch in one transaction, one statement per table: all of it or, on any error,
nothing. The executor turns these rows into the export's lines and back.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

import asyncpg

from dbos_async._sysdb import connection
from dbos_async._sysdb.core import DatabaseCore
from dbos_async._sysdb.management.operations import JobConnection
from dbos_async._sysdb.statements import EXPORT_COLUMNS, WorkflowAddress, WorkflowFilter
from dbos_async._sysdb.statements.transfer import WORKFLOW_COLUMN
from dbos_async.errors import (
    QueryTimeoutError,
    StatementCanceledError,
    WorkflowImportConflictError,
    WorkflowImportError,
)

JsonRow = dict[str, Any]
"""A row of one table as plain JSON values, by column: what an export line holds."""


@dataclass(frozen=True)
class WorkflowRows:
    """One workflow's rows: for each table of :data:`EXPORT_COLUMNS`, its rows holding
    exactly that table's exported columns; ``shard_key`` is the workflow's own key (None
    unsharded)."""

    workflow_id: str
    shard_key: str | None
    tables: dict[str, list[JsonRow]]

    @property
    def ref(self) -> WorkflowAddress:
        return WorkflowAddress(self.workflow_id, self.shard_key)


def _row(record: asyncpg.Record, table: str) -> JsonRow:
    """A record's exported columns as JSON values (the attributes jsonb as its object)."""
    row = {column: record[column] for column in EXPORT_COLUMNS[table]}
    if row.get("attributes") is not None:
        row["attributes"] = json.loads(row["attributes"])
    return row


class TransferOperations(DatabaseCore):
    async def export_workflows(self, f: WorkflowFilter, batch_size: int
                               ) -> AsyncIterator[WorkflowRows]:
        """The workflows ``f`` selects, in its order, each with every row it owns.

        One REPEATABLE READ, READ ONLY transaction: every batch comes from the snapshot
        the export started with, so a workflow finishing meanwhile is exported whole as it
        was, and no row is locked (writers never wait on an export). Each statement is
        bounded by ``observability_query_timeout``."""
        query = self.sql.export_status(f)
        timeout_ms = self.observability_query_timeout_ms
        async with connection.pooled_transaction(self.pool, isolation="repeatable_read",
                                                 readonly=True) as conn:
            if timeout_ms > 0:
                limit = self.sql.statement_timeout(timeout_ms)
                await conn.execute(limit.sql, *limit.params)
            try:
                cursor = await conn.cursor(query.sql, *query.params)
                while batch := await cursor.fetch(batch_size):
                    for workflow in await self._rows_of(conn, batch):
                        yield workflow
            except asyncpg.QueryCanceledError as error:
                if "statement timeout" not in str(error):
                    raise StatementCanceledError("exporting workflows", str(error)) from error
                raise QueryTimeoutError("exporting workflows", timeout_ms / 1000) from None

    async def _rows_of(self, conn: JobConnection, status_records: Sequence[asyncpg.Record]
                       ) -> list[WorkflowRows]:
        """These status rows' workflows with the rows of every other table they own."""
        workflows = [
            WorkflowRows(r["workflow_uuid"], r.get("shard_key"),
                         {table: [] for table in EXPORT_COLUMNS})
            for r in status_records
        ]
        by_ref = {w.ref: w for w in workflows}
        for workflow, record in zip(workflows, status_records, strict=True):
            workflow.tables["workflow_status"].append(_row(record, "workflow_status"))
        refs = list(by_ref)
        for table in EXPORT_COLUMNS:
            if table == "workflow_status" or not refs:
                continue
            q = self.sql.export_rows(table, refs)
            owner = WORKFLOW_COLUMN.get(table, "workflow_uuid")
            for record in await conn.fetch(q.sql, *q.params):
                address = WorkflowAddress(record[owner], record.get("shard_key"))
                by_ref[address].tables[table].append(_row(record, table))
        return workflows

    async def import_workflows(self, workflows: Sequence[WorkflowRows]) -> int:
        """Write these workflows, each with every row it owns, in one transaction; how many
        were written. A workflow already stored with the same rows is left as it is (an
        import repeated changes nothing); one stored with other rows raises
        :class:`WorkflowImportConflictError`, and then nothing of the batch is written."""

        async def run() -> int:
            async with self.locking_transaction() as conn:
                q = self.sql.existing_among([w.ref for w in workflows])
                present = {WorkflowAddress(r["workflow_uuid"], r.get("shard_key"))
                           for r in await conn.fetch(q.sql, *q.params)}
                if present:
                    stored = {w.ref: w for w in await self._stored(conn, list(present))}
                    for workflow in workflows:
                        _require_same(workflow, stored.get(workflow.ref))
                new = [w for w in workflows if w.ref not in present]
                for table in EXPORT_COLUMNS:
                    rows = [self._stored_row(table, row, w) for w in new
                            for row in w.tables[table]]
                    if rows:
                        q = self.sql.import_rows(table, json.dumps(rows))
                        await conn.execute(q.sql, *q.params)
                return len(new)

        try:
            return await self._retried("importing workflows", run)
        except asyncpg.UniqueViolationError as error:
            # Not a workflow ID (those were compared): a deduplication ID or message ID
            # another workflow holds in this database.
            raise WorkflowImportError(
                f"Cannot import the batch: {error.detail or error} (constraint "
                f"{error.constraint_name}); nothing of it was written") from None
        except (asyncpg.DataError, asyncpg.IntegrityConstraintViolationError) as error:
            raise WorkflowImportError(
                f"Cannot import the batch: {error}; nothing of it was written") from None

    async def _stored(self, conn: JobConnection, refs: Sequence[WorkflowAddress]
                      ) -> list[WorkflowRows]:
        q = self.sql.export_status(WorkflowFilter(workflow_ids=[i for i, _ in refs]))
        wanted = set(refs)
        records = [r for r in await conn.fetch(q.sql, *q.params)
                   if (r["workflow_uuid"], r.get("shard_key")) in wanted]
        return await self._rows_of(conn, records)

    def _stored_row(self, table: str, row: JsonRow, workflow: WorkflowRows) -> JsonRow:
        """``row`` as the target schema stores it: its key first when sharded."""
        stored = {c: row[c] for c in self.sql.stored_columns(table)}
        if self.sharded:
            stored["shard_key"] = workflow.shard_key
        return stored


def _require_same(workflow: WorkflowRows, stored: WorkflowRows | None) -> None:
    if stored is None or stored.tables == workflow.tables:
        return
    differing = [t for t in EXPORT_COLUMNS if stored.tables[t] != workflow.tables[t]]
    raise WorkflowImportConflictError(
        workflow.workflow_id,
        "this database already holds a workflow with that ID whose rows differ (in "
        f"{', '.join(differing)})")
