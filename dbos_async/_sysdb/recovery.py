"""Recovery in the system database: claiming an executor's PENDING workflows for it (or for
the executor taking a dead one's work over), re-enqueuing its queued ones and dead-lettering
those past their attempts (see :mod:`dbos_async._executor.recovery`).

On Citus each statement runs per shard key of the executor's pending workflows, on the key's
shard's own tables (:class:`~dbos_async._sysdb.writes.routed.RoutedWrites`), so a node out of
reach stops only its keys' recovery.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Mapping, Sequence

from dbos_async._sysdb.records import WorkflowRow, workflow_row
from dbos_async._sysdb.shard_keys import WorkflowAddress, shard_key_scope
from dbos_async._sysdb.statements import Query
from dbos_async._sysdb.writes.routed import RoutedWrites, Row

logger = logging.getLogger("dbos_async")


class RecoveryOperations(RoutedWrites):
    """The statements of recovery and failover, over every shard key."""

    async def _each_pending_key(self, executor_id: str, application_version: str | None,
                                exclude: Sequence[WorkflowAddress], failover: bool, what: str,
                                statement: Callable[[Sequence[WorkflowAddress]], Query],
                                retried: bool = True) -> list[Row]:
        """The rows of ``statement`` (a recovery statement, built under the current
        shard-key scope), run once over every key; or on Citus once per key of
        ``executor_id``'s PENDING workflows (read from each node's own shards), each on the
        key's shard's own tables (see ``_rows_on_shard``), so a node out of reach stops only
        its keys' recovery. There,
        in ``failover`` (another, dead executor's workflows), a key whose statement fails
        is left with a warning: its rows stay the dead executor's, and the next scan finds
        them again. Recovering its own, an executor raises the first such error once every
        key was tried: what it claimed stays its own and a retry claims it again. Without
        ``retried``, a statement is sent once (see :meth:`claim_pending`)."""
        if not self.routes_single_tables:
            query = statement(exclude)
            send = functools.partial(self.pool.fetch, query.sql, *query.params)
            return list(await (self._retried(what, send) if retried
                               else self._once(what, send)))
        keys = await self._read_each_node(
            lambda shard_ids: self.sql.pending_keys_on_shards(executor_id,
                                                              application_version, shard_ids),
            f"listing the keys of executor {executor_id}'s pending workflows")
        found: list[Row] = []
        failed: Exception | None = None
        for key in sorted({row["shard_key"] for row in keys}):
            with shard_key_scope(key):
                query = statement([ref for ref in exclude if ref[1] == key])
            try:
                found += await self._rows_on_shard(key, query, what, retried)
            except Exception as error:
                if not failover:
                    failed = failed or error
                    continue
                logger.warning("%s under shard key %r failed; left for the next failover "
                               "scan: %s", what, key, error)
        if failed is not None:
            raise failed
        return found

    async def claim_pending(
        self, executor_id: str, application_version: str | None,
        exclude: Sequence[WorkflowAddress] = (), to_executor_id: str | None = None,
    ) -> list[WorkflowRow]:
        now_ms = self.clock.now_ms()
        # Not retried: a lost reply would leave rows claimed under tokens we never learned;
        # a recovery run again (start-up retries it) claims them afresh.
        rows = await self._each_pending_key(
            executor_id, application_version, exclude,
            to_executor_id not in (None, executor_id), "claiming pending workflows",
            lambda excluded: self.sql.claim_pending(executor_id, application_version, now_ms,
                                                    excluded, to_executor_id),
            retried=False)
        return [workflow_row(row) for row in rows]

    async def executors_with_pending(self, application_version: str | None,
                                     own_executor_id: str) -> list[str]:
        """The other executors with PENDING workflows of this version (failover's
        candidates). On Citus, read from each node's own shards: a node out of reach hides
        only its keys' executors."""
        what = "listing executors with pending workflows"
        if self.routes_single_tables:
            rows = await self._read_each_node(
                lambda shard_ids: self.sql.executors_with_pending_on_shards(
                    application_version, own_executor_id, shard_ids), what)
            return sorted({row["executor_id"] for row in rows})
        query = self.sql.executors_with_pending(application_version, own_executor_id)
        return [row["executor_id"] for row in await self._fetch(query, what)]

    async def requeue_pending(self, executor_id: str, application_version: str | None,
                              exclude: Sequence[WorkflowAddress] = (), *, failover: bool = False
                              ) -> list[tuple[str, str]]:
        """Re-enqueue this executor's PENDING queued workflows: [(workflow, queue)]."""
        now_ms = self.clock.now_ms()
        rows = await self._each_pending_key(
            executor_id, application_version, exclude, failover,
            "re-enqueuing pending workflows",
            lambda excluded: self.sql.requeue_pending(executor_id, application_version,
                                                      now_ms, excluded))
        return [(row["workflow_uuid"], row["queue_name"]) for row in rows]

    async def dead_letter_pending(self, executor_id: str, application_version: str | None,
                                  max_attempts: int, exclude: Sequence[WorkflowAddress] = (),
                                  limits: Mapping[str, int] | None = None, *,
                                  failover: bool = False) -> list[tuple[str, str | None]]:
        """Dead-letter this executor's workflows past ``max_attempts`` (or their name's
        limit in ``limits``): [(workflow, key)]."""
        now_ms = self.clock.now_ms()
        rows = await self._each_pending_key(
            executor_id, application_version, exclude, failover, "dead-lettering workflows",
            lambda excluded: self.sql.dead_letter_pending(executor_id, application_version,
                                                          max_attempts, now_ms, excluded,
                                                          limits))
        return [(row["workflow_uuid"], row.get("shard_key")) for row in rows]
