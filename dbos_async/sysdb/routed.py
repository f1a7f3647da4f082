"""A workflow's multi-table writes as transactions of single-table statements, for a database
that routes a statement to one shard only when it writes one table (Citus; the statements
are in :mod:`dbos_async.sysdb.statements.routed`).

On PostgreSQL each of these writes is one statement, one round trip. On Citus that statement
would run as a task per table gathered by the coordinator; here it is a transaction whose
every statement Citus sends whole to the worker holding the key. The semantics are the
statement's: the fence (this execution owns the PENDING workflow) is checked first, under
the status row's lock held to commit; a workflow's own write lands only with its checkpoint,
so a retry after a lost reply or a replay writes nothing twice and finds the record; and each
returns the verdict the statement returns (``status``, ``owned``, ``inserted``), which the
callers in :mod:`dbos_async.sysdb.database` read alike.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeAlias

import asyncpg

from dbos_async.sysdb.core import DatabaseCore, PooledConnection
from dbos_async.sysdb.shard_keys import WorkflowAddress, shard_key_scope
from dbos_async.sysdb.statements import (
    PENDING,
    SEND_BULK,
    NewWorkflow,
    OutgoingMessage,
    Payload,
    Query,
)

Row: TypeAlias = "asyncpg.Record | Mapping[str, Any]"
"""A row as the one statement returns it, or as a transaction of single-table statements
composes the same columns (a fenced write's verdict: the workflow's status, whether this
execution owns it, whether the write or its checkpoint landed)."""

BATCH_ROWS = 500
"""Rows per statement of a batch written as rows of VALUES: one parameter per column, and a
statement takes at most 32,767."""

Write = Callable[[PooledConnection], Awaitable[None]]
"""The writes of a fenced transaction, run once the fence (and checkpoint) let them."""


async def _run(conn: PooledConnection, query: Query) -> None:
    await conn.execute(query.sql, *query.params)


async def _fence(conn: PooledConnection, fence: Query, checkpoint: Query | None
                 ) -> dict[str, Any] | None:
    """The first statements of a fenced transaction: lock the status row and check the
    owner, then record ``checkpoint`` if given. None if there is no such workflow;
    ``inserted`` is whether the writes may follow (owned, and the checkpoint landed: one
    already recorded, by a retry whose reply was lost or a replay, leaves them undone)."""
    owner = await conn.fetchrow(fence.sql, *fence.params)
    if owner is None:
        return None
    owned = owner["status"] == PENDING and owner["owned"]
    landed = owned and (checkpoint is None
                        or await conn.fetchrow(checkpoint.sql, *checkpoint.params) is not None)
    return {"status": owner["status"], "owned": owner["owned"], "inserted": landed}


class RoutedWrites(DatabaseCore):
    """The transactions, each with the retry policy of a statement."""

    async def _fenced_routed(self, what: str, workflow_id: str, owner_xid: str,
                             write: Write, checkpoint: Query | None = None
                             ) -> Row | None:
        """:func:`_fence`, then ``write`` if it may follow, in one transaction."""
        fence = self.sql.lock_owner(workflow_id, owner_xid)

        async def attempt() -> Row | None:
            async with self.locking_transaction() as conn:
                verdict = await _fence(conn, fence, checkpoint)
                if verdict is not None and verdict["inserted"]:
                    await write(conn)
                return verdict

        return await self._retried(what, attempt)

    async def _set_event_routed(self, workflow_id: str, owner_xid: str, key: str,
                                value: Payload, function_id: int | None, now_ms: int
                                ) -> Row | None:
        """set_event: from the workflow (``function_id``) its checkpoint, the latest value
        and the history row; from a step, the latest value alone."""
        latest = self.sql.set_event_value(workflow_id, key, value)
        history = (self.sql.record_event_history(workflow_id, function_id, key, value)
                   if function_id is not None else None)
        checkpoint = (self.sql.insert_checkpoint(workflow_id, function_id, "DBOS.setEvent",
                                                 now_ms)
                      if function_id is not None else None)

        async def write(conn: PooledConnection) -> None:
            await _run(conn, latest)
            if history is not None:
                await _run(conn, history)

        return await self._fenced_routed(f"setting event {key!r} of {workflow_id}",
                                         workflow_id, owner_xid, write, checkpoint)

    async def _write_stream_routed(self, workflow_id: str, owner_xid: str, key: str,
                                   value: Payload, function_id: int,
                                   function_name: str | None, now_ms: int
                                   ) -> Row | None:
        """A stream write: its offset read first (Citus refuses the subquery in VALUES),
        free while the status row lock is held, which every writer of the workflow's
        streams takes first. With ``function_name``, the workflow's own write, recorded."""
        offset = self.sql.next_stream_offset(workflow_id, key)
        checkpoint = (self.sql.insert_checkpoint(workflow_id, function_id, function_name,
                                                 now_ms)
                      if function_name is not None else None)

        async def write(conn: PooledConnection) -> None:
            at = await conn.fetchval(offset.sql, *offset.params)
            await _run(conn, self.sql.append_stream(workflow_id, key, value, function_id, at))

        return await self._fenced_routed(f"writing stream {key!r} of {workflow_id}",
                                         workflow_id, owner_xid, write, checkpoint)

    async def _send_fenced_routed(self, workflow_id: str, owner_xid: str, message: Query
                                  ) -> Row | None:
        """A message from a step of ``workflow_id``: only while the caller owns it."""

        async def write(conn: PooledConnection) -> None:
            await _run(conn, message)

        return await self._fenced_routed(f"sending from {workflow_id}", workflow_id,
                                         owner_xid, write)

    async def _consume_message_routed(self, workflow_id: str, function_id: int,
                                      owner_xid: str, topic: str, now_ms: int
                                      ) -> Row | None:
        """recv's consuming write: the oldest message, its checkpoint (carrying it), then
        the message marked consumed; nothing consumed if the step is recorded already
        (``recorded``: a retry whose first reply was lost)."""
        fence = self.sql.lock_owner(workflow_id, owner_xid)
        oldest = self.sql.oldest_message(workflow_id, topic)
        recorded = self.sql.get_checkpoint(workflow_id, function_id)

        async def attempt() -> Row | None:
            async with self.locking_transaction() as conn:
                fenced = await _fence(conn, fence, None)
                if fenced is None or not fenced["inserted"]:
                    return fenced
                verdict = {**fenced, "inserted": False, "recorded": False, "message": None,
                           "serialization": None}
                message = await conn.fetchrow(oldest.sql, *oldest.params)
                if message is not None:
                    step = self.sql.insert_checkpoint(
                        workflow_id, function_id, "DBOS.recv", now_ms, message["message"],
                        message["serialization"])
                    if await conn.fetchrow(step.sql, *step.params) is not None:
                        await _run(conn, self.sql.mark_consumed(
                            workflow_id, message["message_uuid"], function_id))
                        return {**verdict, "inserted": True, "message": message["message"],
                                "serialization": message["serialization"]}
                found = await conn.fetchrow(recorded.sql, *recorded.params)
                return {**verdict, "recorded": found is not None}

        return await self._retried(f"receiving for {workflow_id}", attempt)

    async def _record_outcome_routed(self, workflow_id: str, status: str, owner_xid: str,
                                     output: str | None, error: str | None, now_ms: int
                                     ) -> bool:
        """The outcome: the status UPDATE (its row lock and owner check are the fence),
        then the output, only if the UPDATE applied."""
        finish = self.sql.finish_workflow(workflow_id, status, owner_xid, now_ms)
        store = self.sql.store_output(workflow_id, output, error)

        async def attempt() -> bool:
            async with self.locking_transaction() as conn:
                if await conn.fetchrow(finish.sql, *finish.params) is None:
                    return False
                await _run(conn, store)
                return True

        return await self._retried(f"recording the outcome of {workflow_id}", attempt)

    def _message_batches(self, groups: Mapping[str | None, Sequence[OutgoingMessage]]
                         ) -> list[Query]:
        """A batch send's statements: each key's messages as rows of VALUES, at most
        :data:`BATCH_ROWS` a statement."""
        return [self.sql.send_messages_values(batch[start:start + BATCH_ROWS], key)
                for key, batch in groups.items() for start in range(0, len(batch), BATCH_ROWS)]

    def _send_many_routed(self, groups: dict[str | None, list[OutgoingMessage]],
                          sender: WorkflowAddress | None, owner_xid: str | None,
                          function_id: int | None, now_ms: int
                          ) -> Callable[[], Awaitable[Row | None]]:
        """A batch send's attempt: one multi-row VALUES per key; from a workflow or a step
        (``sender``) fenced by the sender's row lock first, and from a workflow
        (``function_id``) only with the batch's checkpoint."""
        fence = checkpoint = None
        if sender is not None:
            assert owner_xid is not None
            with sender.routed():
                fence = self.sql.lock_owner(sender.workflow_id, owner_xid)
                if function_id is not None:
                    checkpoint = self.sql.insert_checkpoint(sender.workflow_id, function_id,
                                                            SEND_BULK, now_ms)
        batches = self._message_batches(groups)

        async def attempt() -> Row | None:
            if fence is None and len(batches) == 1:  # one key: one autocommit statement
                await self.pool.execute(batches[0].sql, *batches[0].params)
                return None
            async with self.locking_transaction() as conn:
                verdict = await _fence(conn, fence, checkpoint) if fence is not None else None
                if fence is not None and (verdict is None or not verdict["inserted"]):
                    return verdict
                for batch in batches:
                    await _run(conn, batch)
                return verdict

        return attempt

    async def _insert_workflows_routed(self, conn: PooledConnection,
                                       rows: Sequence[tuple[NewWorkflow, str]],
                                       key: str | None) -> list[Row]:
        """A batch of one key (see :meth:`~dbos_async.sysdb.statements.WorkflowStatements.
        insert_workflows`) in the caller's transaction: the rows it meets read first, then
        the status rows and the inputs of those inserted, a statement per table (and per
        :data:`BATCH_ROWS` rows); nothing if an ID belongs to another workflow name. One
        row per row given, as that statement returns them."""
        ids = [wf.workflow_id for wf, _ in rows]
        with shard_key_scope(key):
            met = self.sql.batch_conflicts(ids, [wf.deduplication_id for wf, _ in rows
                                                 if wf.deduplication_id is not None])
        found = await conn.fetch(met.sql, *met.params)
        existing = {r["workflow_uuid"]: r for r in found if r["workflow_uuid"] in set(ids)}
        holders = {(r["queue_name"], r["deduplication_id"]): r for r in found
                   if r["deduplication_id"] is not None}
        inserted: set[str] = set()
        if all(existing[i]["name"] == wf.name for i, (wf, _) in zip(ids, rows, strict=True)
               if i in existing):
            for start in range(0, len(rows), BATCH_ROWS):
                q = self.sql.insert_statuses(rows[start:start + BATCH_ROWS])
                inserted |= {r["workflow_uuid"] for r in await conn.fetch(q.sql, *q.params)}
            new = [wf for wf, _ in rows if wf.workflow_id in inserted]
            for start in range(0, len(new), BATCH_ROWS):
                await _run(conn, self.sql.insert_batch_inputs(new[start:start + BATCH_ROWS]))
        results: list[Row] = []
        for wf, creator_xid in rows:
            ex = existing.get(wf.workflow_id)
            holder = holders.get((wf.queue_name, wf.deduplication_id))
            results.append({
                "workflow_uuid": wf.workflow_id, "inserted": wf.workflow_id in inserted,
                "existing_name": ex["name"] if ex is not None else None,
                "ours": ex["creator_xid"] == creator_xid if ex is not None else None,
                "holder_id": holder["workflow_uuid"] if holder is not None else None,
                "holder_name": holder["name"] if holder is not None else None,
            })
        return results
