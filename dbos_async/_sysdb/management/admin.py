"""Changes of a workflow or an application in place: a queued workflow's priority and
delay, a workflow's attributes, and renaming an application (see
:mod:`dbos_async._sysdb.statements.management.admin`)."""

from __future__ import annotations

from dbos_async._sysdb.core import DatabaseCore
from dbos_async._sysdb.statements import APPLICATION_TABLES, DELAYED, ENQUEUED, Query
from dbos_async.errors import NonExistentWorkflowError, WorkflowStateError

QUEUED_STATUSES = (ENQUEUED, DELAYED)
"""The statuses of a workflow waiting on its queue: the only ones whose priority or delay
may change (a started workflow has been claimed by these settings already)."""


class AdminOperations(DatabaseCore):
    async def _change_queued(self, workflow_id: str, operation: str, change: Query) -> None:
        """Run ``change`` on a workflow still waiting on its queue, in one transaction with
        the check of its status. An unknown ID raises
        :class:`NonExistentWorkflowError`, a started or finished workflow
        :class:`WorkflowStateError`, and nothing is written."""
        lock = self.sql.lock_queued(workflow_id)

        async def run() -> None:
            async with self.locking_transaction() as conn:
                row = await conn.fetchrow(lock.sql, *lock.params)
                if row is None:
                    raise NonExistentWorkflowError(workflow_id)
                if row["status"] not in QUEUED_STATUSES:
                    raise WorkflowStateError(workflow_id, row["status"], operation,
                                             " or ".join(QUEUED_STATUSES))
                await conn.execute(change.sql, *change.params)

        # Safe to retry: the same change again.
        await self._retried(f"changing workflow {workflow_id}", run)

    async def set_priority(self, workflow_id: str, priority: int) -> None:
        """Give a waiting workflow a new priority."""
        await self._change_queued(
            workflow_id, "change the priority of",
            self.sql.set_priority(workflow_id, priority, self.clock.now_ms()))

    async def set_delay(self, workflow_id: str, until_ms: int) -> None:
        """Make a waiting workflow wait until ``until_ms``."""
        await self._change_queued(
            workflow_id, "delay", self.sql.set_delay(workflow_id, until_ms, self.clock.now_ms()))

    async def update_attributes(self, workflow_id: str, attributes: str | None,
                                merge: bool) -> None:
        row = await self._fetchrow(
            self.sql.set_attributes(workflow_id, attributes, merge, self.clock.now_ms()),
            f"updating the attributes of workflow {workflow_id}")
        if row is None:
            raise NonExistentWorkflowError(workflow_id)

    async def rename_application(self, old_name: str | None, new_name: str,
                                 adopt_unclaimed: bool) -> dict[str, int]:
        """Give ``new_name`` every row ``old_name`` owns (and, with ``adopt_unclaimed``,
        every unclaimed row) in every table that records an owner, in one transaction:
        no reader sees an application half renamed. Returns the rows moved per table."""
        queries = [(table, self.sql.rename_rows(table, old_name, new_name, adopt_unclaimed))
                   for table in APPLICATION_TABLES]

        async def run() -> dict[str, int]:
            moved: dict[str, int] = {}
            async with self.locking_transaction() as conn:
                # Never a merge: queue, schedule and version names are unique whatever
                # their owner, so no moved row can collide with one the new name owns.
                for table, q in queries:
                    status = await conn.execute(q.sql, *q.params)
                    moved[table] = int(status.split()[-1])
            return moved

        # Idempotent: a second run finds nothing left under the old name.
        return await self._retried(f"renaming application {old_name!r}", run)
