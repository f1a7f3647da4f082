"""The single-table statements a workflow's multi-table writes are made of on a database
that routes a statement to one shard only when it writes one table (Citus).

On PostgreSQL each of those writes is one statement (modifying CTEs that lock the status
row, check the owner and write every table). Citus plans such a CTE as a task per table
gathered by the coordinator; here each part is a statement of its own, for a transaction
that takes the fence first (:meth:`RoutedStatements.lock_owner`) and then writes one table
per statement, each an ``INSERT ... VALUES`` or a keyed ``UPDATE``/``SELECT`` that Citus
sends whole to the worker holding the key.
"""

from __future__ import annotations

from collections.abc import Sequence

from dbos_async._sysdb.statements.base import (
    PENDING,
    PORTABLE_JSON,
    Checkpoint,
    NewWorkflow,
    Params,
    Payload,
    Query,
    StatementBase,
    StatementParts,
)
from dbos_async._sysdb.statements.messaging import (
    MESSAGE_ORDER,
    MessagingStatements,
    OutgoingMessage,
)
from dbos_async._sysdb.statements.workflows import WorkflowStatements


class RoutedStatements(WorkflowStatements, MessagingStatements, StatementBase):
    def routes_single_tables(self) -> Query:
        """Whether this database is a Citus one (its per-workflow tables distributed by
        key), where the multi-table writes run as transactions of these statements."""
        return Query("SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus')")

    def run_routed(self, shard_key: str | None, steps: str, shard: int | None = None
                   ) -> Query:
        """One write of single-table statements on one key (``steps``, as the JSON
        ``run_routed`` reads), run by that function in one round trip: the rows its steps
        returned, as JSON. With ``shard``, the statements name that shard's tables on the
        node run at (see the function on why that is safe)."""
        p = Params()
        return Query(f"SELECT {self.table('run_routed')}({p(shard_key, 'text')}, "
                     f"{p(steps, 'text')}::jsonb, {p(shard, 'bigint')})", p.values)

    def run_routed_on_shards(self, shard_key: str, steps: str, shards: Sequence[int]
                             ) -> Query:
        """:meth:`run_routed` of statements naming the tables of several shards of the
        node run at (``shards``, ascending): each shard locked and checked as one is."""
        p = Params()
        return Query(f"SELECT {self.table('run_routed')}({p(shard_key, 'text')}, "
                     f"{p(steps, 'text')}::jsonb, shards => {p.array(shards, 'bigint')})",
                     p.values)

    def on_node(self, shards: Sequence[int], parts: Sequence[StatementParts], p: Params
                ) -> Query:
        """Several statements (``parts``, built with ``p``, each naming one shard's own
        tables on the node it runs at) as one, after ``lock_shards_here`` locked and checked
        ``shards`` (ascending), the shards whose rows they write: a group-commit batch of a
        node in one statement whatever its keys. The lock is taken and the placements
        read in a snapshot of their own inside the function, before any row is read (the
        statement's rows are gated on it); a shard found elsewhere fails the statement whole
        with SQLSTATE DBS01, as ``run_routed`` does."""
        here = (f"here AS MATERIALIZED (SELECT {self.table('lock_shards_here')}("
                f"{p.array(shards, 'bigint')}) AS ok)")
        ctes = ", ".join([here, *(cte for part in parts for cte in part.ctes)])
        rows = " UNION ALL ".join(f"({part.rows})" for part in parts)
        return Query(f"WITH {ctes} SELECT * FROM ({rows}) AS found WHERE (SELECT ok FROM here)",
                     p.values)

    def run_routed_many(self, shard_keys: Sequence[str | None], steps: Sequence[str],
                        shards: Sequence[int | None]) -> Query:
        """:meth:`run_routed` for the writes of several workflows (of any keys), in one
        statement, one transaction: each write's results, in order."""
        p = Params()
        # The session's prepared statements are read once for the whole batch (reading
        # them costs as much as a statement) and given to each call.
        return Query(
            rf"""SELECT r FROM unnest({p(list(shard_keys), 'text[]')},
                                     {p(list(steps), 'text[]')},
                                     {p.array(shards, 'bigint')}) WITH ORDINALITY
                                 AS w(k, s, shard, n)
                CROSS JOIN (SELECT coalesce(array_agg(name::text), '{{}}') AS names
                            FROM pg_prepared_statements
                            WHERE name LIKE 'dbos\_routed\_%') AS here
                CROSS JOIN LATERAL {self.table('run_routed')}(w.k, w.s::jsonb, w.shard,
                                                               here.names) AS r
                ORDER BY w.n""",
            p.values,
        )

    def lock_owner(self, workflow_id: str, owner_xid: str) -> Query:
        """The fence of a transaction's writes: the workflow's status, whether this
        execution owns it, and whether the writes may go on (``go``: it owns the PENDING
        workflow). FOR NO KEY UPDATE holds the row until commit, so no hand-off (recovery,
        cancel, resume) commits between this check and the writes after it."""
        p = Params()
        owned = f"owner_xid IS NOT DISTINCT FROM {p(owner_xid, 'text')}"
        return Query(
            f"""SELECT status, {owned} AS owned,
                       status IS NOT DISTINCT FROM {p(PENDING, 'text')} AND {owned} AS go
                FROM {self.table('workflow_status')} WHERE {self.wf(None, workflow_id, p)}
                FOR NO KEY UPDATE""",
            p.values,
        )

    def insert_checkpoint(self, workflow_id: str, function_id: int, function_name: str,
                          now_ms: int, output: str | None = None,
                          serialization: str | None = PORTABLE_JSON) -> Query:
        """A workflow's own write's checkpoint, under a fence already taken; RETURNING 1
        when it landed (the first record of a step stands)."""
        p = Params()
        values = self._checkpoint_values(
            self._key_values(workflow_id, p), workflow_id, function_id, function_name, p,
            output=output, started_at_ms=now_ms, completed_at_ms=now_ms,
            serialization_sql=p(serialization, "text"))
        insert = self._insert_select("operation_outputs", values, None,
                                     self._checkpoint_conflict())
        return Query(f"{insert} RETURNING 1", p.values)

    def insert_step(self, r: Checkpoint) -> Query:
        """A step's checkpoint (:meth:`record_step`'s row), under a fence already taken;
        RETURNING 1 when it landed (the first record of a step stands)."""
        p = Params()
        values = self._checkpoint_values(
            self._key_values(r.workflow_id, p), r.workflow_id, r.function_id,
            r.function_name, p, output=r.output, error=r.error,
            started_at_ms=r.started_at_ms, completed_at_ms=r.completed_at_ms,
            child_workflow_id=r.child_workflow_id, child_shard_key=r.child_shard_key,
            serialization=r.serialization)
        insert = self._insert_select("operation_outputs", values, None,
                                     self._checkpoint_conflict())
        return Query(f"{insert} RETURNING 1", p.values)

    def finish_workflow(self, workflow_id: str, status: str, owner_xid: str,
                        now_ms: int) -> Query:
        """The status part of :meth:`record_outcome`: its row lock (the UPDATE's) fences
        the output written after it in the same transaction."""
        p = Params()
        return Query(self._finish_update(workflow_id, status, owner_xid, now_ms, p), p.values)

    def store_output(self, workflow_id: str, output: str | None, error: str | None) -> Query:
        """The output part of :meth:`record_outcome`, after :meth:`finish_workflow` updated
        the row."""
        p = Params()
        values = self._output_values(workflow_id, output, error, p)
        return Query(self._insert_select("workflow_output", values, None,
                                         self._output_conflict()), p.values)

    def set_event_value(self, workflow_id: str, key: str, value: Payload) -> Query:
        """An event's latest value (see :meth:`set_event_recorded`)."""
        p = Params()
        [(_, insert)] = self._event_writes(workflow_id, key, value, None, None, p)
        return Query(insert, p.values)

    def record_event_history(self, workflow_id: str, function_id: int, key: str,
                             value: Payload) -> Query:
        """The history row of a workflow's own set_event (see :meth:`set_event_recorded`)."""
        p = Params()
        _, (_, insert) = self._event_writes(workflow_id, key, value, function_id, None, p)
        return Query(insert, p.values)

    def append_stream(self, workflow_id: str, key: str, value: Payload, function_id: int,
                      offset: int) -> Query:
        """A stream's value at the offset :meth:`next_stream_offset` read."""
        p = Params()
        [(_, insert)] = self._stream_write(workflow_id, key, value, function_id, None, p,
                                           offset)
        return Query(insert, p.values)

    def oldest_message(self, workflow_id: str, topic: str) -> Query:
        """recv's message: the oldest unconsumed one on ``topic``. FOR UPDATE SKIP LOCKED
        locks it until commit and passes one another consumer holds."""
        p = Params()
        return Query(
            f"""SELECT n.message_uuid, n.message, n.serialization
                FROM {self.table('notifications')} n
                WHERE {self.wf('n', workflow_id, p, 'destination_uuid')}
                  AND n.topic = {p(topic)} AND n.consumed = false
                ORDER BY {MESSAGE_ORDER}
                LIMIT 1
                FOR UPDATE SKIP LOCKED""",
            p.values,
        )

    def mark_consumed(self, workflow_id: str, message_uuid: str, function_id: int) -> Query:
        """Consume the message :meth:`oldest_message` locked, by the step recording it."""
        p = Params()
        return Query(
            f"""UPDATE {self.table('notifications')} n
                SET consumed = true, consumed_by_function_id = {p(function_id, 'integer')}
                WHERE {self.wf('n', workflow_id, p, 'destination_uuid')}
                  AND n.message_uuid = {p(message_uuid)}""",
            p.values,
        )

    def send_messages_values(self, messages: Sequence[OutgoingMessage],
                             shard_key: str | None) -> Query:
        """A batch of messages to workflows of one key as rows of VALUES: Citus routes a
        multi-row VALUES of one key to its shard, but pulls an INSERT ... SELECT of the
        arrays through the coordinator. Repeated message IDs are ignored; a missing
        destination fails the foreign key."""
        p = Params()
        rows = []
        for m in messages:
            values = {col: p(val, "text")
                      for col, val in self.wf_values(m.destination_id, shard_key).items()}
            values.update({
                "message_uuid": p(m.message_uuid, "text"),
                "destination_uuid": p(m.destination_id, "text"),
                "topic": p(m.topic, "text"),
                "message": p(m.message, "text"),
                "serialization": p(m.serialization, "text"),
            })
            rows.append(values)
        return Query(
            f"""INSERT INTO {self.table('notifications')} ({', '.join(rows[0])})
                VALUES {', '.join(f"({', '.join(r.values())})" for r in rows)}
                ON CONFLICT ({self.key_conflict('message_uuid')}) DO NOTHING""",
            p.values,
        )

    def batch_conflicts(self, workflow_ids: Sequence[str],
                        deduplication_ids: Sequence[str]) -> Query:
        """What a batch of the current shard-key scope meets before it inserts: the rows
        already under its IDs (their names and creator tokens) and the holders of its
        deduplication IDs."""
        p = Params()
        return Query(
            f"""SELECT workflow_uuid, name, creator_xid, queue_name, deduplication_id
                FROM {self.table('workflow_status')}
                WHERE {self.scoped(None, p)}
                  AND (workflow_uuid = ANY({p(list(workflow_ids), 'text[]')})
                       OR deduplication_id = ANY({p(list(deduplication_ids), 'text[]')}))""",
            p.values,
        )

    def insert_statuses(self, rows: Sequence[tuple[NewWorkflow, str]]) -> Query:
        """The status rows of a batch of one key (each with its creator token), as rows of
        VALUES (see :meth:`send_messages_values`); a row whose ID or deduplication ID is
        taken is skipped. Returns the IDs inserted."""
        p = Params()
        given = [self._status_columns(wf, xid) for wf, xid in rows]
        columns = list(dict.fromkeys(c for g in given for c in g))
        tuples = ", ".join(
            "(" + ", ".join(p(g.get(c), self.STATUS_CASTS.get(c, "text")) for c in columns) + ")"
            for g in given)
        return Query(
            f"""INSERT INTO {self.table('workflow_status')} ({', '.join(columns)})
                VALUES {tuples}
                ON CONFLICT DO NOTHING
                RETURNING workflow_uuid""",
            p.values,
        )

    def insert_batch_inputs(self, workflows: Sequence[NewWorkflow]) -> Query:
        """The inputs of a batch's workflows of one key that :meth:`insert_statuses`
        inserted."""
        p = Params()
        rows = [{**self.wf_values(wf.workflow_id, wf.shard_key), "workflow_uuid": wf.workflow_id,
                 "inputs": wf.inputs} for wf in workflows]
        tuples = ", ".join("(" + ", ".join(p(v, "text") for v in r.values()) + ")" for r in rows)
        return Query(
            f"""INSERT INTO {self.table('workflow_input')} ({', '.join(rows[0])})
                VALUES {tuples}
                ON CONFLICT ({self.key_conflict('workflow_uuid')}) DO NOTHING""",
            p.values,
        )
