"""A workflow's multi-table writes as single-table statements, for a database that routes a
statement to one shard only when it writes one table (Citus; the statements are in
:mod:`dbos_async.sysdb.statements.routed`).

On PostgreSQL each of these writes is one statement, one round trip. On Citus that statement
would run as a task per table gathered by the node that plans it; here its parts are
statements of their own, each of which Citus sends whole to the node holding the key. They
run together in one round trip: the caller sends them as a :data:`Program`, which the
database function ``run_routed`` runs in one transaction, stopping at the first gate that
does not pass (see sql/sharded/0125_03_functions.sql). The writes of several workflows go
as one statement of several programs (group commit).

The semantics are the one statement's: the fence (this execution owns the PENDING workflow)
is checked first, under the status row's lock held to commit; a workflow's own write lands
only with its checkpoint, so a retry after a lost reply or a replay writes nothing twice and
finds the record; and each returns the verdict the statement returns (``status``,
``owned``, ``inserted``), which the callers in :mod:`dbos_async.sysdb.database` read alike.
A stream write and recv read a value before they write (an offset, the message) and stay
transactions of several round trips.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

import asyncpg

from dbos_async.sysdb.citus_shards import NodePools, ShardMap
from dbos_async.sysdb.core import DatabaseCore, PooledConnection
from dbos_async.sysdb.records import StartResult, workflow_row
from dbos_async.sysdb.shard_keys import WorkflowAddress, shard_key_scope
from dbos_async.sysdb.statements import (
    SEND_BULK,
    Checkpoint,
    FinalOutcome,
    NewWorkflow,
    OutgoingMessage,
    Payload,
    Query,
    WorkflowRef,
)

Row: TypeAlias = "asyncpg.Record | Mapping[str, Any]"
"""A row as the one statement returns it, or as a transaction of single-table statements
composes the same columns (a fenced write's verdict: the workflow's status, whether this
execution owns it, whether the write or its checkpoint landed)."""

BATCH_ROWS = 500
"""Rows per statement of a batch written as rows of VALUES: one parameter per column, and a
statement takes at most 32,767."""

@dataclass(frozen=True)
class Step:
    """One statement of a routed write: whether it returns a row (``rows``), and whether
    the write stops unless it returned one whose ``go`` column, if any, is true (``gate``:
    a fence, a checkpoint that must land)."""

    query: Query
    rows: bool = False
    gate: bool = False


Program: TypeAlias = Sequence[Step]
"""The statements of one workflow's write, on one key, run in order in one transaction."""

Results: TypeAlias = list[dict[str, Any] | None]
"""What a program's steps returned, one element per step run (None: no row)."""

MAX_PARAMETERS = 48
"""The parameters ``run_routed`` passes a statement (as many as its widest, a start)."""


def _array_literal(values: Sequence[Any]) -> str:
    items = ("NULL" if v is None
             else '"' + str(v).replace("\\", "\\\\").replace('"', '\\"') + '"'
             for v in values)
    return "{" + ",".join(items) + "}"


def _as_text(value: Any) -> str | None:
    """A parameter as the text PostgreSQL reads back to the same value."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list | tuple):
        return _array_literal(value)
    return str(value)


def encode(program: Program) -> str:
    """A program as the JSON ``run_routed`` reads."""
    for step in program:
        assert len(step.query.params) <= MAX_PARAMETERS, step.query.sql
    return json.dumps([{"sql": step.query.sql,
                        "args": [_as_text(v) for v in step.query.params],
                        "rows": step.rows, "gate": step.gate} for step in program])


def _passed(row: Mapping[str, Any] | None) -> bool:
    return row is not None and row.get("go", True) is not False


def ran_whole(program: Program, results: Results) -> bool:
    """Whether every step of ``program`` ran and its last gate passed."""
    if len(results) < len(program):
        return False
    return not program[-1].gate or _passed(results[-1])


def _fenced(program: Program, results: Results) -> dict[str, Any] | None:
    """The verdict of a program that starts with the fence: None if there is no such
    workflow, else its status, whether this execution owns it, and whether the writes
    after the fence (and checkpoint) landed."""
    owner = results[0]
    if owner is None:
        return None
    return {"status": owner["status"], "owned": owner["owned"],
            "inserted": ran_whole(program, results)}


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
    landed = owner["go"] and (checkpoint is None
                              or await conn.fetchrow(checkpoint.sql, *checkpoint.params)
                              is not None)
    return {"status": owner["status"], "owned": owner["owned"], "inserted": landed}


SHARD_MAP_MAX_AGE = 10.0
"""How old (seconds) the map of which node holds which key may grow before a write reads it
again: a shard moved meanwhile is still written correctly through its old node (Citus
forwards the statements), only less cheaply, until then."""


class RoutedWrites(DatabaseCore):
    """The routed writes, each with the retry policy of a statement, sent to the node that
    holds the key's shard, so the node the URL names (a coordinator) is off their path."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._shard_map: ShardMap | None = None
        self._node_pools: NodePools | None = None
        self._shard_map_lock = asyncio.Lock()

    async def close(self) -> None:
        if self._node_pools is not None:
            await self._node_pools.aclose()
        await super().close()

    async def _current_shard_map(self) -> ShardMap | None:
        """The map of which node holds which key, read again once older than
        :data:`SHARD_MAP_MAX_AGE` (None where the tables are not distributed)."""
        if not self.routes_single_tables:
            return None
        if self._shard_map is not None and self._shard_map.age < SHARD_MAP_MAX_AGE:
            return self._shard_map
        async with self._shard_map_lock:
            if self._shard_map is None or self._shard_map.age >= SHARD_MAP_MAX_AGE:
                async with self.pool.acquire() as conn:
                    self._shard_map = await ShardMap.load(conn, self.schema)
                if self._node_pools is None:
                    self._node_pools = NodePools(
                        self.url, size=self._pool_size, connect_timeout=self._connect_timeout,
                        name=self._connection_name)
        return self._shard_map

    async def _node_pool(self, shard_key: str | None) -> asyncpg.Pool:
        """The pool whose server holds ``shard_key``'s shard (the URL's own without one)."""
        shards = await self._current_shard_map()
        if shards is None or shard_key is None or self._node_pools is None:
            return self.pool
        return await self._node_pools.pool_for(shards.node_of(shard_key))

    async def node_of(self, shard_key: str | None) -> Hashable:
        """Which node runs ``shard_key``'s writes: one group-commit lane per node."""
        shards = await self._current_shard_map()
        return None if shards is None or shard_key is None else shards.node_of(shard_key)

    async def _on_node(self, shard_key: str | None, what: str) -> str:
        """``what``, naming the Citus node that runs ``shard_key``'s writes (what a caller
        needs to know when that node is out of reach)."""
        node = await self.node_of(shard_key)
        return what if node is None else f"{what} on the Citus node {node}"

    async def _routed(self, shard_key: str | None, program: Program, what: str) -> Results:
        """Run one program in one round trip; what its steps returned."""
        q = self.sql.run_routed(shard_key, encode(program))
        what = await self._on_node(shard_key, what)

        async def attempt() -> str:
            pool = await self._node_pool(shard_key)
            found: str = await pool.fetchval(q.sql, *q.params)
            return found

        found = await self._retried(what, attempt)
        results: Results = json.loads(found)
        return results

    async def _routed_many(self, writes: Sequence[tuple[WorkflowRef, Program]], what: str
                           ) -> list[Results | Exception]:
        """Run the programs of several workflows (group commit) in one round trip and one
        transaction, in the order of their workflows, so two such transactions lock status
        rows in one order and cannot deadlock. A transaction the database refuses is run
        again program by program, so one bad write fails alone. What each program's steps
        returned, or the error that ended it."""
        if len(writes) == 1:
            (_, key), program = writes[0]
            try:
                return [await self._routed(key, program, what)]
            except Exception as error:
                return [error]
        order = sorted(range(len(writes)), key=lambda i: (writes[i][0][1] or "",
                                                          writes[i][0][0]))
        q = self.sql.run_routed_many([writes[i][0][1] for i in order],
                                     [encode(writes[i][1]) for i in order])

        async def attempt() -> list[asyncpg.Record]:
            pool = await self._node_pool(writes[order[0]][0][1])
            return await pool.fetch(q.sql, *q.params)

        what = await self._on_node(writes[order[0]][0][1], what)
        try:
            rows = await self._retried(what, attempt)
        except asyncpg.PostgresError:
            alone: list[Results | Exception] = []
            for write in writes:
                alone.extend(await self._routed_many([write], what))
            return alone
        except Exception as error:
            return [error] * len(writes)
        by_index: dict[int, Results | Exception] = {
            i: json.loads(row["r"]) for i, row in zip(order, rows, strict=True)}
        return [by_index[i] for i in range(len(writes))]

    def _fenced_program(self, workflow_id: str, owner_xid: str, writes: Sequence[Query],
                        checkpoint: Query | None = None) -> Program:
        """The fence, then ``checkpoint`` if given, then ``writes``."""
        program = [Step(self.sql.lock_owner(workflow_id, owner_xid), rows=True, gate=True)]
        if checkpoint is not None:
            program.append(Step(checkpoint, rows=True, gate=True))
        return program + [Step(write) for write in writes]

    async def _fenced_routed(self, what: str, workflow_id: str, owner_xid: str,
                             writes: Sequence[Query], checkpoint: Query | None = None
                             ) -> Row | None:
        """:meth:`_fenced_program` in one round trip: its verdict (see :func:`_fenced`)."""
        program = self._fenced_program(workflow_id, owner_xid, writes, checkpoint)
        key = self.sql.key_hint(workflow_id)
        return _fenced(program, await self._routed(key, program, what))

    async def _set_event_routed(self, workflow_id: str, owner_xid: str, key: str,
                                value: Payload, function_id: int | None, now_ms: int
                                ) -> Row | None:
        """set_event: from the workflow (``function_id``) its checkpoint, the latest value
        and the history row; from a step, the latest value alone."""
        writes = [self.sql.set_event_value(workflow_id, key, value)]
        checkpoint = None
        if function_id is not None:
            writes.append(self.sql.record_event_history(workflow_id, function_id, key, value))
            checkpoint = self.sql.insert_checkpoint(workflow_id, function_id, "DBOS.setEvent",
                                                    now_ms)
        return await self._fenced_routed(f"setting event {key!r} of {workflow_id}",
                                         workflow_id, owner_xid, writes, checkpoint)

    def _checkpoint_program(self, r: Checkpoint) -> Program:
        """A step's checkpoint: the fence, then the row (RETURNING 1 when it landed)."""
        return self._fenced_program(r.workflow_id, r.owner_xid, [], self.sql.insert_step(r))

    def _outcome_program(self, r: FinalOutcome, now_ms: int) -> Program:
        """The outcome: the status UPDATE (its row lock and owner check are the fence),
        then the output, only if the UPDATE applied."""
        return [Step(self.sql.finish_workflow(r.workflow_id, r.status, r.owner_xid, now_ms),
                     rows=True, gate=True),
                Step(self.sql.store_output(r.workflow_id, r.output, r.error))]

    def _start_program(self, wf: NewWorkflow, creator_xid: str,
                       parent_shard_key: str | None = None) -> Program:
        """A start: the status row (or the one already under its ID), then its inputs if
        this start created it (``go``)."""
        return [Step(self.sql.insert_status(wf, creator_xid, parent_shard_key),
                     rows=True, gate=True),
                Step(self.sql.insert_inputs(wf))]

    @staticmethod
    def _started(results: Results, creator_xid: str) -> StartResult:
        row = results[0]
        assert row is not None, "an insert ... on conflict do update returns its row"
        return StartResult(workflow_row(row), row["creator_xid"] == creator_xid)

    async def _write_stream_routed(self, workflow_id: str, owner_xid: str, key: str,
                                   value: Payload, function_id: int,
                                   function_name: str | None, now_ms: int
                                   ) -> Row | None:
        """A stream write, a transaction: its offset is read first (Citus refuses the
        subquery in VALUES), free while the status row lock is held, which every writer of
        the workflow's streams takes first. With ``function_name``, the workflow's own
        write, recorded."""
        fence = self.sql.lock_owner(workflow_id, owner_xid)
        offset = self.sql.next_stream_offset(workflow_id, key)
        checkpoint = (self.sql.insert_checkpoint(workflow_id, function_id, function_name,
                                                 now_ms)
                      if function_name is not None else None)

        async def attempt() -> Row | None:
            async with self.locking_transaction() as conn:
                verdict = await _fence(conn, fence, checkpoint)
                if verdict is not None and verdict["inserted"]:
                    at = await conn.fetchval(offset.sql, *offset.params)
                    await _run(conn, self.sql.append_stream(workflow_id, key, value,
                                                            function_id, at))
                return verdict

        return await self._retried(f"writing stream {key!r} of {workflow_id}", attempt)

    async def _send_fenced_routed(self, workflow_id: str, owner_xid: str, message: Query
                                  ) -> Row | None:
        """A message from a step of ``workflow_id``: only while the caller owns it."""
        return await self._fenced_routed(f"sending from {workflow_id}", workflow_id,
                                         owner_xid, [message])

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
