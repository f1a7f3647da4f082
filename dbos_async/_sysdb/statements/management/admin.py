"""Statements that change a workflow or an application in place: a queued workflow's
priority and delay, a workflow's attributes, and the rename of an application.

Like the other families they locate rows through the shard-key seam, so they run on the
sharded schema too.
"""

from __future__ import annotations

from dbos_async._sysdb.statements.base import DELAYED, Params, Query, StatementBase

APPLICATION_TABLES = ("queues", "workflow_schedules", "application_versions",
                      "workflow_status", "operation_outputs")
"""Every table whose rows carry an owning ``application_name``: what a rename moves. The
first three are global tables (one row per name); the last two hold workflows' rows."""

GLOBAL_APPLICATION_TABLES = APPLICATION_TABLES[:3]


class AdminStatements(StatementBase):
    def lock_queued(self, workflow_id: str) -> Query:
        """A workflow's status, its row locked. FOR NO KEY UPDATE: no claim,
        promotion or cancel changes the status between this check and the change that
        follows in the same transaction (claims skip the locked row and take it later)."""
        p = Params()
        return Query(
            f"""SELECT status FROM {self.table('workflow_status')}
                WHERE {self.wf(None, workflow_id, p)}
                FOR NO KEY UPDATE""",
            p.values,
        )

    def set_priority(self, workflow_id: str, priority: int, now_ms: int) -> Query:
        p = Params()
        return Query(
            f"""UPDATE {self.table('workflow_status')}
                SET priority = {p(priority, 'integer')}, updated_at = {p(now_ms, 'bigint')}
                WHERE {self.wf(None, workflow_id, p)}""",
            p.values,
        )

    def set_delay(self, workflow_id: str, until_ms: int, now_ms: int) -> Query:
        """The workflow waits (DELAYED) until ``until_ms``: an ENQUEUED one goes back to
        waiting, and the queue watcher makes it ENQUEUED when due, as for any delayed enqueue
        (so a debounced workflow releases its key there, in one place)."""
        p = Params()
        return Query(
            f"""UPDATE {self.table('workflow_status')}
                SET status = {p(DELAYED)}, delay_until_epoch_ms = {p(until_ms, 'bigint')},
                    updated_at = {p(now_ms, 'bigint')}
                WHERE {self.wf(None, workflow_id, p)}""",
            p.values,
        )

    def set_attributes(self, workflow_id: str, attributes: str | None, merge: bool,
                       now_ms: int) -> Query:
        """Replace the workflow's attributes (None clears them), or with ``merge`` add the
        given top-level keys to them, in one statement (no lost update between a read and
        a write). Returns a row only if the workflow exists."""
        p = Params()
        given = p(attributes, "jsonb")
        value = (f"""CASE WHEN jsonb_typeof(attributes) = 'object' THEN attributes
                          ELSE '{{}}'::jsonb END || {given}""" if merge else given)
        return Query(
            f"""UPDATE {self.table('workflow_status')}
                SET attributes = {value}, updated_at = {p(now_ms, 'bigint')}
                WHERE {self.wf(None, workflow_id, p)}
                RETURNING 1""",
            p.values,
        )

    def rename_rows(self, table: str, old_name: str | None, new_name: str,
                    adopt_unclaimed: bool) -> Query:
        """Give ``new_name`` the rows of ``table`` that ``old_name`` owns and, with
        ``adopt_unclaimed``, the unclaimed (NULL) ones; every key's rows on a sharded
        database."""
        p = Params()
        sources = []
        if old_name is not None:
            sources.append(f"application_name = {p(old_name)}")
        if adopt_unclaimed:
            sources.append("application_name IS NULL")
        where = (self.global_(None, p) if table in GLOBAL_APPLICATION_TABLES
                 else self.scoped(None, p))
        return Query(
            f"""UPDATE {self.table(table)} SET application_name = {p(new_name)}
                WHERE {where} AND ({' OR '.join(sources)})""",
            p.values,
        )
