"""Statements of recovery: an executor takes back the workflows it left PENDING, and a live
executor takes over those of a dead one (failover).

See dbos_async/_executor/recovery.py and failover.py. Each one touches only the named
executor's rows of this application version (and application), and skips those already
running here (``exclude``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from dbos_async._sysdb.statements.base import (
    ENQUEUED,
    MAX_RECOVERY_ATTEMPTS_EXCEEDED,
    PENDING,
    Params,
    Query,
    StatementBase,
    WorkflowAddress,
)


class RecoveryStatements(StatementBase):
    @staticmethod
    def _of_version(application_version: str | None, p: Params) -> str:
        return (f"application_version = {p(application_version)}"
                if application_version is not None else "application_version IS NULL")

    def _recovered(self, executor_id: str, application_version: str | None,
                   exclude: Sequence[WorkflowAddress], p: Params) -> str:
        """This executor's PENDING rows of this version that nothing here runs."""
        version = self._of_version(application_version, p)
        return f"""{self.scoped('ws', p)} AND status = {p(PENDING)}
                  AND executor_id = {p(executor_id)} AND {version}
                  -- executor_id defaults to "local", so it collides across applications.
                  AND {self.own_scope('ws', p)}
                  -- Executions already running here keep their ownership.
                  AND NOT {self.among('ws', exclude, p)}"""

    def claim_pending(
        self,
        executor_id: str,
        application_version: str | None,
        now_ms: int,
        exclude: Sequence[WorkflowAddress] = (),
        to_executor_id: str | None = None,
    ) -> Query:
        """Take ownership of ``executor_id``'s PENDING workflows that no queue started, each
        under a fresh owner token, for ``to_executor_id`` (a live executor taking over a dead
        one's work; default: the same executor recovering its own).

        The new ``owner_xid`` fences off any execution still running from before (in this
        process or a zombie elsewhere): its next durable write fails the ownership check.
        Queued workflows are left alone: recovery has just put them back on their queues
        (``requeue_pending``), and one PENDING on a queue now was claimed by a claim loop of
        this process that has not launched it yet; claiming it again would run it twice.
        """
        p = Params()
        return Query(
            f"""UPDATE {self.table('workflow_status')} ws
                SET owner_xid = {self.fresh_owner(p)},
                    executor_id = {p(to_executor_id or executor_id)},
                    recovery_attempts = recovery_attempts + 1,
                    updated_at = {p(now_ms, 'bigint')}
                WHERE {self._recovered(executor_id, application_version, exclude, p)}
                  AND queue_name IS NULL
                -- The attributes as text however the rows come back (as JSON from a
                -- Citus shard's own tables, see routed).
                RETURNING workflow_uuid, status, name, class_name, config_name, owner_xid,
                          serialization, workflow_deadline_epoch_ms,
                          attributes::text AS attributes,
                          authenticated_user, assumed_role, authenticated_roles,
                          recovery_attempts{self.key_columns('ws')},
                          (SELECT wi.inputs FROM {self.table('workflow_input')} wi
                           WHERE {self.wf_join('wi', 'ws')}) AS inputs""",
            p.values,
        )

    def requeue_pending(self, executor_id: str, application_version: str | None,
                        now_ms: int, exclude: Sequence[WorkflowAddress] = ()) -> Query:
        """Recovery of queued workflows: this executor's PENDING ones go back to ENQUEUED on
        their queue, so the queue's claim (and its limits) admits exactly one runner.

        Clearing the owner fences any execution still running from before.
        """
        p = Params()
        return Query(
            f"""UPDATE {self.table('workflow_status')} ws
                SET status = {p(ENQUEUED)}, owner_xid = NULL, started_at_epoch_ms = NULL,
                    rate_limited = false, updated_at = {p(now_ms, 'bigint')}
                WHERE {self._recovered(executor_id, application_version, exclude, p)}
                  AND queue_name IS NOT NULL
                RETURNING workflow_uuid, queue_name""",
            p.values,
        )

    def dead_letter_pending(self, executor_id: str, application_version: str | None,
                            max_attempts: int, now_ms: int,
                            exclude: Sequence[WorkflowAddress] = (),
                            limits: Mapping[str, int] | None = None) -> Query:
        """This executor's PENDING workflows that have used up their recovery attempts
        (``limits``' for their workflow name, else ``max_attempts``) become
        MAX_RECOVERY_ATTEMPTS_EXCEEDED (terminal: no owner, no queue slot, no dedup key)."""
        p = Params()
        now = p(now_ms, "bigint")
        allowed = p(max_attempts, "bigint")
        if limits:
            names = p.array(list(limits), "text")
            attempts = p.array(list(limits.values()), "bigint")
            allowed = f"""COALESCE((SELECT l.attempts FROM unnest({names}, {attempts})
                                      AS l(name, attempts) WHERE l.name = ws.name),
                                   {allowed})"""
        return Query(
            f"""UPDATE {self.table('workflow_status')} ws
                SET status = {p(MAX_RECOVERY_ATTEMPTS_EXCEEDED)}, owner_xid = NULL,
                    deduplication_id = NULL, started_at_epoch_ms = NULL, queue_name = NULL,
                    updated_at = {now}, completed_at = {now}
                WHERE {self._recovered(executor_id, application_version, exclude, p)}
                  AND recovery_attempts > {allowed}
                RETURNING workflow_uuid{self.key_columns()}""",
            p.values,
        )

    def _pending_on_shards(self, column: str, where: str, shard_ids: Sequence[int]) -> str:
        """The distinct ``column`` of PENDING rows meeting ``where`` over the given shards
        of ``workflow_status`` on a Citus node, named as that node's own tables (as
        ``dequeue_scopes_on_shards`` reads them): a plain statement on that node alone, so
        one node out of reach does not hide the rows of the others."""
        return " UNION ".join(
            f"SELECT DISTINCT {column} FROM {self.table('workflow_status')}_{shard_id} ws "
            f"WHERE {where}" for shard_id in shard_ids)

    def executors_with_pending_on_shards(self, application_version: str | None,
                                         own_executor_id: str, shard_ids: Sequence[int]
                                         ) -> Query:
        """:meth:`executors_with_pending` over the given shards of a Citus node (see
        :meth:`_pending_on_shards`): failover goes on while another node is down."""
        p = Params()
        where = (f"status = {p(PENDING)} AND {self._of_version(application_version, p)} "
                 f"AND {self.own_scope('ws', p)} AND executor_id IS NOT NULL "
                 f"AND executor_id <> {p(own_executor_id)}")
        return Query(self._pending_on_shards("executor_id", where, shard_ids), p.values)

    def pending_keys_on_shards(self, executor_id: str, application_version: str | None,
                               shard_ids: Sequence[int]) -> Query:
        """The shard keys of ``executor_id``'s PENDING workflows of this version over the
        given shards of a Citus node (see :meth:`_pending_on_shards`): recovery there
        claims key by key, each claim a statement on the key's node alone."""
        p = Params()
        where = (f"status = {p(PENDING)} AND executor_id = {p(executor_id)} "
                 f"AND {self._of_version(application_version, p)} "
                 f"AND {self.own_scope('ws', p)}")
        return Query(self._pending_on_shards("shard_key", where, shard_ids), p.values)

    def executors_with_pending(self, application_version: str | None,
                               own_executor_id: str) -> Query:
        """The other executors that have PENDING workflows of this version: the candidates
        of failover, each checked for life by its lock. The partial index on PENDING rows
        keeps this cheap: it reads only in-flight workflows."""
        p = Params()
        version = self._of_version(application_version, p)
        return Query(
            f"""SELECT DISTINCT executor_id FROM {self.table('workflow_status')} ws
                WHERE {self.scoped('ws', p)} AND status = {p(PENDING)} AND {version}
                  AND {self.own_scope('ws', p)}
                  AND executor_id IS NOT NULL AND executor_id <> {p(own_executor_id)}""",
            p.values,
        )
