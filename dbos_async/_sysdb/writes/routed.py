"""A workflow's multi-table writes as single-table statements, for a database that routes a
statement to one shard only when it writes one table (Citus; the statements are in
:mod:`dbos_async._sysdb.statements.routed`).

On PostgreSQL each of these writes is one statement, one round trip. On Citus that statement
would run as a task per table gathered by the node that plans it; here its parts are
statements of their own, each of which Citus sends whole to the node holding the key. They
run together in one round trip: the caller sends them as a :data:`Program`, which the
database function ``run_routed`` runs in one transaction, stopping at the first gate that
does not pass (see sql/sharded/0125_03_functions.sql). A group-commit batch of a node's
starts, checkpoints or outcomes goes as one statement for the node (see
:meth:`RoutedWrites._batch_on_shards`); where that cannot serve, as one statement of several
programs.

Each program is sent to the node holding its key's shard, naming that shard's tables rather
than the distributed ones: there they run as plain PostgreSQL statements, a fraction of the
cost of Citus's distributed planning and execution, under the same shard lock a distributed
write takes. A program sent by a stale map to a node that no longer holds the shard writes
nothing and fails (:data:`SHARD_MOVED`); the map is read again and the program sent again.

The semantics are the one statement's: the fence (this execution owns the PENDING workflow)
is checked first, under the status row's lock held to commit; a workflow's own write lands
only with its checkpoint, so a retry after a lost reply or a replay writes nothing twice and
finds the record; and each returns the verdict the statement returns (``status``,
``owned``, ``inserted``), which the callers in :mod:`dbos_async._sysdb.database` read alike.
A stream write and recv read a value before they write (an offset, the message): on a
shard's own tables each is the one statement plain PostgreSQL runs, and only where the
distributed tables must be written are they transactions of several round trips.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import logging
import re
from collections.abc import Awaitable, Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias, TypeVar

import asyncpg

from dbos_async._database_url import Host
from dbos_async._sysdb.citus_shards import NodePools, ShardInterval, ShardMap
from dbos_async._sysdb.core import DatabaseCore, PooledConnection
from dbos_async._sysdb.records import StartResult, workflow_row
from dbos_async._sysdb.shard_keys import WorkflowAddress, shard_key_scope
from dbos_async._sysdb.statements import (
    SEND_BULK,
    Checkpoint,
    FinalOutcome,
    NewWorkflow,
    OutgoingMessage,
    Params,
    Payload,
    Query,
    StatementParts,
)
from dbos_async.errors import DatabaseUnavailableError

T = TypeVar("T")

logger = logging.getLogger("dbos_async")

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
    a fence, a checkpoint that must land); or whether it returns any number of rows
    (``many``: a batch's rows of several keys, on a shard's own tables)."""

    query: Query
    rows: bool = False
    gate: bool = False
    many: bool = False


Program: TypeAlias = Sequence[Step]
"""The statements of one workflow's write, on one key, run in order in one transaction."""

NodeStatement: TypeAlias = Callable[[list[int], Params, str], StatementParts]
"""A batch statement of the rows given (their indexes in the batch), built with the
parameters given, its parts' names prefixed as given (see :class:`StatementParts`)."""

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
                        "rows": step.rows, "gate": step.gate, "many": step.many}
                       for step in program])


@functools.lru_cache(maxsize=4096)
def _shard_sql(sql: str, schema: str, colocated: tuple[tuple[str, int], ...]) -> str:
    """``sql`` naming, for each of ``schema``'s distributed tables, its shard of
    ``colocated`` (``<table>_<shard>``, as Citus names a shard's table)."""
    tables = "|".join(re.escape(table) for table, _ in colocated)
    shards = dict(colocated)
    return re.sub(rf"{re.escape(schema)}\.({tables})\b",
                  lambda m: f"{schema}.{m[1]}_{shards[m[1]]}", sql)


def _on_shard(program: Program, schema: str, shard: ShardInterval) -> Program:
    """``program``'s statements on ``shard``'s tables (see :func:`_shard_sql`)."""
    return [dataclasses.replace(step, query=Query(_shard_sql(step.query.sql, schema,
                                                             shard.colocated),
                                                  step.query.params))
            for step in program]


SHARD_MOVED = "DBS01"
"""The SQLSTATE with which ``run_routed`` refuses to write a shard whose only placement is
not on the node it runs on: the shard moved or split since the map was read."""

SHARD_ATTEMPTS = 3
"""How many times a program follows its shard to a node that turns out not to hold it any
more (each time after reading the map again) before it is sent as statements on the
distributed tables, which Citus routes itself."""


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


SHARD_SESSION_SETTINGS = {"plan_cache_mode": "force_generic_plan", "enable_seqscan": "off"}
"""The sessions that run statements on a shard's own tables: each statement is planned
once, its prepared statement's generic plan serving every call (a node's group-commit
statement has a part for each of the node's shards, most without rows in a batch, and
PostgreSQL would plan it anew for each batch, its custom plans looking cheaper, at several
times the cost of running it); and the rows are found through indexes, never by reading a
shard's table whole (every statement here locates its rows by key, but on a table as small
as a shard's a plan fixed at its first call would scan it, a cost growing with the table
while the batch's does not). Statements on the distributed tables go through the other
pools: Citus cannot plan all of them generically."""

SHARD_MAP_MAX_AGE = 10.0
"""How old (seconds) the map of which node holds which key may grow before a write reads it
again: a shard moved meanwhile is still written correctly through its old node (Citus
forwards the statements), only less cheaply, until then."""

MAP_DUE: Hashable = object()
"""What :meth:`RoutedWrites.known_node_of` returns where the shard map is to be read first."""


class RoutedWrites(DatabaseCore):
    """The routed writes, each with the retry policy of a statement, sent to the node that
    holds the key's shard, so the node the URL names (a coordinator) is off their path."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._shard_map: ShardMap | None = None
        self._node_pools: NodePools | None = None
        # Pools per node for statements naming a shard's own tables (see
        # SHARD_SESSION_SETTINGS).
        self._shard_pools: NodePools | None = None
        self._shard_map_lock = asyncio.Lock()
        # Whether writes name a shard's own tables (see run_routed); off for a role that
        # may not take a shard's lock.
        self._writes_on_shards = True
        # The nodes a read of every node could not reach, each warned about once.
        self._unreached_nodes: set[Host] = set()

    async def close(self) -> None:
        for pools in (self._node_pools, self._shard_pools):
            if pools is not None:
                await pools.aclose()
        await super().close()

    def _fresh(self, stale: ShardMap | None) -> bool:
        """Whether the current map may serve: read, not older than :data:`SHARD_MAP_MAX_AGE`,
        and not the map ``stale`` that a program found wrong."""
        shards = self._shard_map
        return shards is not None and shards is not stale and shards.age < SHARD_MAP_MAX_AGE

    async def _current_shard_map(self, stale: ShardMap | None = None) -> ShardMap | None:
        """The map of which node holds which key, read again once older than
        :data:`SHARD_MAP_MAX_AGE` or found wrong (``stale``); None where the tables are not
        distributed."""
        if not self.routes_single_tables:
            return None
        if self._fresh(stale):
            return self._shard_map
        async with self._shard_map_lock:
            if not self._fresh(stale):
                async with self.pool.acquire() as conn:
                    self._shard_map = await ShardMap.load(conn, self.schema)
                if self._node_pools is None:
                    self._node_pools = NodePools(
                        self.url, size=self._pool_size, connect_timeout=self._connect_timeout,
                        name=self._connection_name)
                    self._shard_pools = NodePools(
                        self.url, size=self._pool_size, connect_timeout=self._connect_timeout,
                        name=self._connection_name, settings=SHARD_SESSION_SETTINGS)
        return self._shard_map

    async def _node_pool(self, shard_key: str | None, on_shards: bool = False
                         ) -> asyncpg.Pool:
        """The pool whose server holds ``shard_key``'s shard (the URL's own without one);
        ``on_shards``: for statements naming a shard's own tables."""
        shards = await self._current_shard_map()
        pools = self._shard_pools if on_shards else self._node_pools
        if shards is None or shard_key is None or pools is None:
            return self.pool
        return await pools.pool_for(shards.node_of(shard_key))

    async def node_of(self, shard_key: str | None) -> Hashable:
        """Which node runs ``shard_key``'s writes: one group-commit lane per node."""
        node = self.known_node_of(shard_key)
        if node is not MAP_DUE:
            return node
        shards = await self._current_shard_map()
        return None if shards is None or shard_key is None else shards.node_of(shard_key)

    def known_node_of(self, shard_key: str | None) -> Hashable:
        """:meth:`node_of` without a read: :data:`MAP_DUE` where the shard map is to be
        read (again) first."""
        if not self.routes_single_tables:
            return None
        if not self._fresh(None):
            return MAP_DUE
        assert self._shard_map is not None
        return None if shard_key is None else self._shard_map.node_of(shard_key)

    async def _on_node(self, shard_key: str | None, what: str) -> str:
        """``what``, naming the Citus node that runs ``shard_key``'s writes (what a caller
        needs to know when that node is out of reach)."""
        node = await self.node_of(shard_key)
        return what if node is None else f"{what} on the Citus node {node}"

    async def _read_each_node(self, statement: Callable[[Sequence[int]], Query], what: str
                              ) -> list[asyncpg.Record]:
        """The rows of ``statement`` over each node's own shards of ``workflow_status``
        (given their IDs), run on every node at once, each read once. A node out of reach
        is left out, with a warning: its keys cannot be worked on meanwhile, and the
        others' can. When a node no longer holds a shard of the map (moved), the map is
        read again and every node read again."""
        stale: ShardMap | None = None
        for attempt in range(1, SHARD_ATTEMPTS + 1):
            shards = await self._current_shard_map(stale)
            assert shards is not None
            by_node: dict[Host, list[int]] = {}
            for shard in shards.shards:
                by_node.setdefault(shard.node, []).append(shard.shard_id)
            found = await asyncio.gather(*(self._read_node(node, statement(ids), what)
                                           for node, ids in by_node.items()))
            errors = [error for error in found if isinstance(error, Exception)]
            moved = [error for error in errors if isinstance(error, asyncpg.UndefinedTableError)]
            if moved and len(moved) == len(errors) and attempt < SHARD_ATTEMPTS:
                stale = shards
                continue
            if errors:
                raise errors[0]
            return [row for rows in found if not isinstance(rows, Exception) for row in rows]
        raise AssertionError("unreachable: the last attempt returns or raises")

    async def _read_node(self, node: Host, query: Query, what: str
                         ) -> list[asyncpg.Record] | Exception:
        """``query`` run once on ``node``: its rows, none if the node is out of reach, or
        the error that ended it (returned, so every node's read ends before one raises)."""
        assert self._node_pools is not None
        on_node = f"{what} on the Citus node {node}"
        try:
            pool = await self._node_pools.pool_for(node)
            rows = await self._once(on_node, lambda: pool.fetch(query.sql, *query.params))
        except DatabaseUnavailableError as error:
            if node not in self._unreached_nodes:  # once until it answers again
                self._unreached_nodes.add(node)
                logger.warning("%s failed; its keys are left out until it answers: %s",
                               on_node, error)
            return []
        except Exception as error:
            return error
        if node in self._unreached_nodes:
            self._unreached_nodes.discard(node)
            logger.info("The Citus node %s answers again", node)
        return rows

    async def _placed(self, shard_key: str | None, stale: ShardMap | None = None
                      ) -> tuple[ShardMap | None, ShardInterval | None]:
        """The current map and ``shard_key``'s shard in it (None: not Citus, no key)."""
        shards = await self._current_shard_map(stale)
        if shards is None or shard_key is None:
            return shards, None
        return shards, shards.shard_of(shard_key)

    async def _on_shards(self, shard_keys: Sequence[str | None],
                         send: Callable[[asyncpg.Pool, list[ShardInterval | None]],
                                        Awaitable[T]]) -> T:
        """``send`` to the node of the first key, given each key's shard to name; again
        with a map read anew when the node no longer holds one of them (see
        :data:`SHARD_ATTEMPTS`), and last with no shards, on the distributed tables. A
        role that may not take a shard's lock (not the tables' owner) writes on the
        distributed tables from then on."""
        stale: ShardMap | None = None
        for _ in range(SHARD_ATTEMPTS if self._writes_on_shards else 0):
            placed = [await self._placed(key, stale) for key in shard_keys]
            shards = placed[0][0]
            try:
                return await send(await self._node_pool(shard_keys[0], on_shards=True),
                                  [shard for _, shard in placed])
            except asyncpg.InsufficientPrivilegeError as error:
                logger.warning("Writing on the Citus shards' own tables is refused (%s); "
                               "writing on the distributed tables instead", error)
                self._writes_on_shards = False
                break
            except asyncpg.PostgresError as error:
                # A shard's table gone from the node: moved, its old copy dropped since.
                if error.sqlstate not in (SHARD_MOVED, asyncpg.UndefinedTableError.sqlstate):
                    raise
                stale = shards
        return await send(await self._node_pool(shard_keys[0]), [None] * len(shard_keys))

    def _program_on(self, program: Program, shard: ShardInterval | None) -> str:
        """``program`` as ``run_routed`` reads it, naming ``shard``'s tables if given."""
        return encode(program if shard is None else _on_shard(program, self.sql.schema, shard))

    async def _routed(self, shard_key: str | None, program: Program, what: str) -> Results:
        """Run one program in one round trip; what its steps returned."""
        what = await self._on_node(shard_key, what)

        async def send(pool: asyncpg.Pool, shards: list[ShardInterval | None]) -> str:
            shard = shards[0]
            q = self.sql.run_routed(shard_key, self._program_on(program, shard),
                                    None if shard is None else shard.shard_id)
            found: str = await pool.fetchval(q.sql, *q.params)
            return found

        found = await self._retried(what, lambda: self._on_shards([shard_key], send))
        results: Results = json.loads(found)
        return results

    async def _routed_many(self, writes: Sequence[tuple[WorkflowAddress, Program]], what: str
                           ) -> list[Results | Exception]:
        """Run the programs of several workflows (group commit) in one round trip and one
        transaction, in the order of their shards, keys and workflows, so two such
        transactions lock shards and status rows in one order and cannot deadlock. A
        transaction the database refuses is run again program by program, so one bad write
        fails alone. What each program's steps returned, or the error that ended it."""
        if len(writes) == 1:
            (_, key), program = writes[0]
            try:
                return [await self._routed(key, program, what)]
            except Exception as error:
                return [error]
        shards = await self._current_shard_map()

        def position(i: int) -> tuple[int, str, str]:
            (workflow_id, key), _ = writes[i]
            shard = -1 if shards is None or key is None else shards.shard_of(key).shard_id
            return shard, key or "", workflow_id

        order = sorted(range(len(writes)), key=position)
        keys = [writes[i][0][1] for i in order]

        async def send(pool: asyncpg.Pool, placed: list[ShardInterval | None]
                       ) -> list[asyncpg.Record]:
            q = self.sql.run_routed_many(
                keys, [self._program_on(writes[i][1], shard)
                       for i, shard in zip(order, placed, strict=True)],
                [None if shard is None else shard.shard_id for shard in placed])
            return await pool.fetch(q.sql, *q.params)

        what = await self._on_node(keys[0], what)
        try:
            rows = await self._retried(what, lambda: self._on_shards(keys, send))
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

    async def _rows_on_shard(self, shard_key: str, query: Query, what: str,
                             retried: bool = True) -> list[Row]:
        """The rows of ``query``, a statement of ``shard_key``'s rows written for the
        distributed tables, run on the key's shard's own tables in ``run_routed`` under
        the shard's lock and placement check (see :meth:`_batch_on_shards`): it never
        needs another node, so it runs while one is down. Where no shard can be named,
        on the distributed tables at the key's node. Without ``retried``, sent once."""
        async def send(pool: asyncpg.Pool, placed: list[ShardInterval | None]) -> list[Row]:
            shard = placed[0]
            if shard is None:
                return list(await pool.fetch(query.sql, *query.params))
            program = _on_shard([Step(query, many=True)], self.sql.schema, shard)
            q = self.sql.run_routed_on_shards(shard_key, encode(program), [shard.shard_id])
            [rows] = json.loads(await pool.fetchval(q.sql, *q.params))
            return rows  # type: ignore[no-any-return]

        def attempt() -> Awaitable[list[Row]]:
            return self._on_shards([shard_key], send)

        return await (self._retried(what, attempt) if retried else self._once(what, attempt))

    async def _batch_on_shards(self, keys: Sequence[str], statement: NodeStatement, what: str
                               ) -> Mapping[str | None, Sequence[Row] | Exception] | None:
        """A group-commit batch of one node (row ``i`` under ``keys[i]``) as one statement
        whatever its keys: ``statement`` of each shard's rows, for every shard of the node
        (none for most), on the shard's own tables, where a statement may write the rows of
        every key of the shard, as the statement of one key does on PostgreSQL (see
        ``record_steps``). The text is one per node (or per shard, see
        :meth:`_node_statement`), so one prepared statement and plan serve every batch. It
        takes the lock and placement check of the batch's shards
        first (see :meth:`~dbos_async._sysdb.statements.RoutedStatements.on_node`), so it
        is as strict as the statements it replaces. By key, the rows the statement
        returned, or the error that ended the batch; None where no shard can be named (the
        caller then sends a program per write)."""
        distinct = sorted(set(keys))

        async def send(pool: asyncpg.Pool, placed: list[ShardInterval | None]
                       ) -> dict[str | None, Sequence[Row] | Exception] | None:
            shard_of: dict[str, ShardInterval] = {}
            for key, shard in zip(distinct, placed, strict=True):
                if shard is None:
                    return None
                shard_of[key] = shard
            groups: dict[int, list[int]] = {}
            for i, key in enumerate(keys):
                groups.setdefault(shard_of[key].shard_id, []).append(i)
            q = self._node_statement(shard_of[distinct[0]].node,
                                     [shard_of[key] for key in distinct], groups, statement)
            found: dict[str | None, list[Row]] = {key: [] for key in distinct}
            for r in await pool.fetch(q.sql, *q.params):
                found[r["shard_key"]].append(r)
            return {**found}

        what = await self._on_node(distinct[0], what)
        try:
            return await self._retried(what, lambda: self._on_shards(distinct, send))
        except asyncpg.PostgresError:
            return None  # refused whole: a program per write, so a bad one fails alone
        except Exception as error:
            return dict.fromkeys(distinct, error)

    def _node_statement(self, node: Host, batch: Sequence[ShardInterval],
                        groups: Mapping[int, list[int]], statement: NodeStatement) -> Query:
        """:meth:`_batch_on_shards`' statement on ``node``: ``statement`` of the rows of each
        of the node's shards (``groups``: by shard, its rows' indexes), in shard order,
        each naming its shard's tables, with the lock and check of the batch's shards.

        A batch of one shard (a lone write, most batches at low load) has that shard's
        part alone: one text per shard, each prepared once per connection, and a part
        instead of one per shard of the node, each of which costs the server to set up
        even without rows. A batch of several shards has the part of every shard of the
        node: a text per set of shards would be prepared anew nearly every batch (measured:
        twice the node's CPU)."""
        shards = {shard.shard_id: shard for shard in batch}
        if len(shards) > 1 and self._shard_map is not None:
            shards |= {shard.shard_id: shard for shard in self._shard_map.shards
                       if shard.node == node and shard.shard_id not in shards}
        p = Params()
        parts = []
        for n, shard_id in enumerate(sorted(shards)):
            part = statement(groups.get(shard_id, []), p, f"s{n}_")
            named = functools.partial(_shard_sql, schema=self.sql.schema,
                                      colocated=shards[shard_id].colocated)
            parts.append(StatementParts(tuple(map(named, part.ctes)), named(part.rows)))
        return self.sql.on_node(sorted(groups), parts, p)

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

    async def _whole_on_shard(self, workflow_id: str, whole: Query, what: str,
                              transaction: Callable[[], Awaitable[Row | None]]
                              ) -> Row | None:
        """A write that reads before it writes, in one round trip on the key's shard:
        ``whole``, the one statement plain PostgreSQL runs for it, which a shard's own
        tables take as they are. Where no shard can be named, ``transaction``: the same
        write on the distributed tables, as single-table statements, in several."""
        shard_key = self.sql.key_hint(workflow_id)

        async def send(pool: asyncpg.Pool, shards: list[ShardInterval | None]) -> Row | None:
            shard = shards[0]
            if shard is None:
                return await transaction()
            q = self.sql.run_routed(shard_key, self._program_on([Step(whole, rows=True)], shard),
                                    shard.shard_id)
            [row] = json.loads(await pool.fetchval(q.sql, *q.params))
            return row  # type: ignore[no-any-return]

        what = await self._on_node(shard_key, what)
        return await self._retried(what, lambda: self._on_shards([shard_key], send))

    async def _write_stream_routed(self, workflow_id: str, owner_xid: str, key: str,
                                   value: Payload, function_id: int,
                                   function_name: str | None, now_ms: int
                                   ) -> Row | None:
        """A stream write (see :meth:`_whole_on_shard`); with ``function_name``, the
        workflow's own write, recorded. On the distributed tables its offset is read
        first (Citus refuses the subquery in VALUES), free while the status row lock is
        held, which every writer of the workflow's streams takes first."""
        fence = self.sql.lock_owner(workflow_id, owner_xid)
        offset = self.sql.next_stream_offset(workflow_id, key)
        checkpoint = whole = None
        if function_name is not None:
            checkpoint = self.sql.insert_checkpoint(workflow_id, function_id, function_name,
                                                    now_ms)
            whole = self.sql.write_stream_recorded(workflow_id, function_id, function_name,
                                                   owner_xid, key, value, now_ms)
        else:
            whole = self.sql.write_stream_fenced(workflow_id, owner_xid, key, value,
                                                 function_id)

        async def transaction() -> Row | None:
            async with self.locking_transaction() as conn:
                verdict = await _fence(conn, fence, checkpoint)
                if verdict is not None and verdict["inserted"]:
                    at = await conn.fetchval(offset.sql, *offset.params)
                    await _run(conn, self.sql.append_stream(workflow_id, key, value,
                                                            function_id, at))
                return verdict

        return await self._whole_on_shard(
            workflow_id, whole, f"writing stream {key!r} of {workflow_id}", transaction)

    async def _send_fenced_routed(self, workflow_id: str, owner_xid: str, message: Query
                                  ) -> Row | None:
        """A message from a step of ``workflow_id``: only while the caller owns it."""
        return await self._fenced_routed(f"sending from {workflow_id}", workflow_id,
                                         owner_xid, [message])

    async def _consume_message_routed(self, workflow_id: str, function_id: int,
                                      owner_xid: str, topic: str, now_ms: int
                                      ) -> Row | None:
        """recv's consuming write (see :meth:`_whole_on_shard`). On the distributed tables:
        the oldest message, its checkpoint (carrying it), then the message marked consumed;
        nothing consumed if the step is recorded already (``recorded``: a retry whose first
        reply was lost)."""
        fence = self.sql.lock_owner(workflow_id, owner_xid)
        oldest = self.sql.oldest_message(workflow_id, topic)
        recorded = self.sql.get_checkpoint(workflow_id, function_id)
        whole = self.sql.consume_message(workflow_id, function_id, owner_xid, topic, now_ms)

        async def transaction() -> Row | None:
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

        return await self._whole_on_shard(workflow_id, whole, f"receiving for {workflow_id}",
                                          transaction)

    def _message_batches(self, groups: Mapping[str | None, Sequence[OutgoingMessage]]
                         ) -> list[Query]:
        """A batch send's statements: each key's messages as rows of VALUES, at most
        :data:`BATCH_ROWS` a statement."""
        return [self.sql.send_messages_values(batch[start:start + BATCH_ROWS], key)
                for key, batch in groups.items() for start in range(0, len(batch), BATCH_ROWS)]

    def _send_many_routed(self, groups: dict[str | None, list[OutgoingMessage]],
                          sender: WorkflowAddress | None, owner_xid: str | None,
                          function_id: int | None, now_ms: int,
                          function_name: str = SEND_BULK
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
                                                            function_name, now_ms)
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
        """A batch of one key (see :meth:`~dbos_async._sysdb.statements.WorkflowStatements.
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
