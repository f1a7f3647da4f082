"""The sharded migration track on a Citus cluster (``DBOS_TEST_CITUS_URL``): what it
distributes, and that the SQL functions' notifications reach listeners on the coordinator
while workers hold the rows."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Sequence
from typing import Any

import asyncpg
import pytest
from helpers import new_dbos

from dbos_async import EnqueueRequest, SendMessage, SetShardKey, SetWorkflowID
from dbos_async._sysdb.database import SystemDatabase
from dbos_async._sysdb.migrations import LATEST_VERSION, migrate, verify
from dbos_async.errors import ConfigurationError
from dbos_async.testing import create_citus_database
from tests.helpers.citus_cluster import CitusCluster

pytestmark = pytest.mark.citus

PER_WORKFLOW_TABLES = {
    "workflow_status",
    "workflow_input",
    "workflow_output",
    "operation_outputs",
    "notifications",
    "workflow_events",
    "workflow_events_history",
    "streams",
}
SHARD_TABLE = re.compile(r'("dbos"\.[a-z_]+?)_(\d+)\b')
"""A shard's table in a statement: the distributed table's name and the shard's ID."""

GLOBAL_TABLES = {"queues", "application_versions", "workflow_schedules", "event_dispatch_kv"}


async def citus_tables(conn: asyncpg.Connection) -> dict[str, tuple[str, str, int]]:
    """The schema's Citus tables: name -> (type, distribution column, co-location group)."""
    rows = await conn.fetch(
        "SELECT table_name::text AS name, citus_table_type, distribution_column, colocation_id "
        "FROM citus_tables"
    )
    return {
        r["name"]: (r["citus_table_type"], r["distribution_column"], r["colocation_id"])
        for r in rows
    }


async def node_of(conn: asyncpg.Connection, key: str) -> tuple[str, int]:
    """The node holding workflow_status's shard of ``key``."""
    row = await conn.fetchrow(
        "SELECT nodename, nodeport FROM citus_shards WHERE shardid = "
        "get_shard_id_for_distribution_column('dbos.workflow_status', $1::text)",
        key,
    )
    assert row is not None
    return row["nodename"], row["nodeport"]


async def test_sharded_migrate_distributes_by_shard_key(citus_url: str) -> None:
    conn = await asyncpg.connect(citus_url)
    try:
        assert await migrate(conn, sharded=True) == LATEST_VERSION
        tables = await citus_tables(conn)
        assert set(tables) == {f"dbos.{t}" for t in PER_WORKFLOW_TABLES | GLOBAL_TABLES}
        distributed = {tables[f"dbos.{t}"] for t in PER_WORKFLOW_TABLES}
        assert len(distributed) == 1  # one co-location group
        kind, column, _ = distributed.pop()
        assert (kind, column) == ("distributed", "shard_key")
        for table in GLOBAL_TABLES:
            assert tables[f"dbos.{table}"][0] == "reference", table
        # The bookkeeping table stays a plain table of the coordinator.
        assert "dbos.dbos_migrations" not in tables
        assert await conn.fetchval("SELECT array_agg(version) FROM dbos.dbos_migrations") == [
            LATEST_VERSION
        ]

        shards = "SELECT shardid, nodename, nodeport FROM citus_shards ORDER BY 1"
        before = [tuple(r) for r in await conn.fetch(shards)]
        row_version = await conn.fetchval("SELECT xmin::text FROM dbos.dbos_migrations")
        assert await migrate(conn, sharded=True) == LATEST_VERSION
        assert await verify(conn, sharded=True) == LATEST_VERSION
        assert [tuple(r) for r in await conn.fetch(shards)] == before
        assert await conn.fetchval("SELECT xmin::text FROM dbos.dbos_migrations") == row_version
    finally:
        await conn.close()


SHARDS_PER_NODE = ("SELECT nodeport, count(*) AS shards FROM citus_shards "
                   "WHERE table_name = 'dbos.workflow_status'::regclass GROUP BY nodeport")
WORKERS = ("SELECT nodeport FROM pg_dist_node "
           "WHERE groupid <> 0 AND isactive AND noderole = 'primary'")


async def shards_per_node(conn: asyncpg.Connection) -> dict[int, int]:
    """How many shards of the per-workflow tables each node holds, after checking that every
    one of them is co-located with workflow_status (as many shards)."""
    placed = {r["nodeport"]: r["shards"] for r in await conn.fetch(SHARDS_PER_NODE)}
    counts = await conn.fetch(
        "SELECT logicalrelid::text AS name, count(*) AS shards FROM pg_dist_shard GROUP BY 1")
    assert {r["name"]: r["shards"] for r in counts
            if r["name"].split(".")[-1] in PER_WORKFLOW_TABLES} == {
        f"dbos.{t}": sum(placed.values()) for t in PER_WORKFLOW_TABLES}
    return placed


async def test_tables_get_one_shard_per_worker_node_by_default(
        citus_cluster: CitusCluster) -> None:
    """A batch costs a node about the same for each of its shards it writes, so where the
    operator has not set ``citus.shard_count``, each worker node holds one shard."""
    url = await create_citus_database(citus_cluster.url(), "fresh")
    conn = await asyncpg.connect(url)
    try:
        assert await conn.fetchval(
            "SELECT source FROM pg_settings WHERE name = 'citus.shard_count'") == "default"
        await migrate(conn, sharded=True)
        workers = {r["nodeport"] for r in await conn.fetch(WORKERS)}
        assert len(workers) == 2
        assert await shards_per_node(conn) == dict.fromkeys(workers, 1)
    finally:
        await conn.close()


async def test_tables_get_the_shard_count_the_operator_set(citus_url: str) -> None:
    conn = await asyncpg.connect(citus_url, server_settings={"citus.shard_count": "6"})
    try:
        await migrate(conn, sharded=True)
        workers = {r["nodeport"] for r in await conn.fetch(WORKERS)}
        placed = await shards_per_node(conn)
        assert sum(placed.values()) == 6
        assert set(placed) == workers
    finally:
        await conn.close()


async def test_unsharded_handle_refuses_distributed_schema(citus_url: str) -> None:
    conn = await asyncpg.connect(citus_url)
    try:
        await migrate(conn, sharded=True)
        sysdb = SystemDatabase(citus_url)
        with pytest.raises(ConfigurationError, match=r"^The DBOS system schema dbos is sharded\."):
            await sysdb.open()
        await sysdb.close()
    finally:
        await conn.close()


async def test_functions_notify_the_coordinator(citus_url: str) -> None:
    conn = await asyncpg.connect(citus_url)
    listener = await asyncpg.connect(citus_url)
    received: asyncio.Queue[tuple[str, str]] = asyncio.Queue()

    def collect(_conn: object, _pid: int, channel: str, payload: str) -> None:
        received.put_nowait((channel, payload))

    try:
        await migrate(conn, sharded=True)
        key = "tenant-1"
        coordinator = await conn.fetchrow(
            "SELECT nodename, nodeport FROM pg_dist_node WHERE groupid = 0"
        )
        if coordinator is not None and await node_of(conn, key) == tuple(coordinator):
            pytest.skip("the coordinator holds the shards: start the cluster with a worker")
        for channel in ("dbos_notifications_channel", "dbos_enqueue_channel"):
            await listener.add_listener(channel, collect)

        wf = await conn.fetchval("SELECT dbos.enqueue_workflow('wf', 'q', shard_key => $1)", key)
        assert await asyncio.wait_for(received.get(), 10) == ("dbos_enqueue_channel", "q")
        async with conn.transaction():
            await conn.execute("SELECT dbos.send_message($1, '1'::json, 't', NULL, $2)", wf, key)
        assert await asyncio.wait_for(received.get(), 10) == (
            "dbos_notifications_channel",
            f"{len(key)}:{key}:{wf}::t",
        )
        assert await conn.fetchval(
            "SELECT count(*) FROM dbos.notifications WHERE shard_key = $1", key
        ) == 1

        # The constraints hold on the worker, and their errors come back as on one node.
        with pytest.raises(asyncpg.ForeignKeyViolationError, match="DBOS non-existent workflow"):
            await conn.execute("SELECT dbos.send_message($1, '1'::json, shard_key => 'other')", wf)
        await conn.execute(
            "SELECT dbos.enqueue_workflow('wf', 'q', deduplication_id => 'd', shard_key => $1)", key
        )
        with pytest.raises(asyncpg.UniqueViolationError, match="DBOS queue duplicated"):
            await conn.execute(
                "SELECT dbos.enqueue_workflow('wf', 'q', deduplication_id => 'd', "
                "shard_key => $1)",
                key,
            )
    finally:
        await listener.close()
        await conn.close()


# ---- Every per-key statement stays on its key's shard ----

def sql_literal(value: Any) -> str:
    """``value`` as a SQL literal. Citus cannot EXPLAIN an INSERT ... SELECT with bound
    parameters, so the captured statements are explained with their values spliced in."""
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, list | tuple):
        items = ",".join('"' + str(v).replace("\\", "\\\\").replace('"', '\\"') + '"'
                         for v in value)
        return sql_literal("{" + items + "}")
    return "'" + str(value).replace("'", "''") + "'"


def with_literals(sql: str, args: Sequence[Any]) -> str:
    return re.sub(r"\$(\d+)", lambda m: sql_literal(args[int(m.group(1)) - 1]), sql)


SHARD_ID = re.compile(r"_(\d{6,})\b")
INSERT = re.compile(r"^\s*INSERT\b", re.I)
TRANSACTION_CONTROL = re.compile(r"^\s*(BEGIN|COMMIT|ROLLBACK|LISTEN|UNLISTEN)\b", re.I)


async def representative_workload(url: str) -> tuple[list[tuple[str, tuple[Any, ...]]],
                                                      list[tuple[int, set[int], int]],
                                                      list[tuple[set[int], set[int], int]],
                                                      set[str]]:
    """Run workflows under keys through every family of operations, recording each distinct
    statement the executor's pools send on the distributed tables, with its first
    arguments; each program sent to name a shard's tables: that shard, the shards its
    statements name, and the port of the node it was sent to; each node's batch statement:
    the shards it locks, those it names, and that port; and those programs' and
    statements' statements as on the distributed tables (whitespace collapsed)."""
    dbos = new_dbos(url, sharding=True)
    queue = dbos.queue("jobs", concurrency=2, worker_concurrency=2)
    statements: dict[str, tuple[Any, ...]] = {}
    on_shards: list[tuple[int, set[int], int]] = []
    on_nodes: list[tuple[set[int], set[int], int]] = []
    shard_statements: set[str] = set()


    @dbos.step(name="note")
    async def note(text: str) -> str:
        return text

    @dbos.step(name="aside")
    async def aside(text: str) -> None:
        # A step's fenced writes: an event, a stream value, a send, a batch send.
        await dbos.set_event("aside", text)
        await dbos.write_stream("aside", text)
        await dbos.send("peer", text, "aside", shard_key="acme")
        await dbos.send_bulk([SendMessage("peer", text, "aside", shard_key="acme")])

    @dbos.workflow(name="child")
    async def child(text: str) -> str:
        return await note(text)

    @dbos.workflow(name="peer")
    async def peer() -> Any:
        return await dbos.recv("hello", timeout=30)

    @dbos.workflow(name="work")
    async def work(text: str) -> str:
        first = await note(text)
        await aside(text)
        await dbos.send_bulk([SendMessage("peer", first, "bulk", shard_key="acme")])
        [batched] = await dbos.enqueue_many(queue, [EnqueueRequest(child, (text,),
                                                                   shard_key="acme")])
        await dbos.set_event("progress", first)
        await dbos.write_stream("out", first)
        await dbos.close_stream("out")
        with SetShardKey("acme"):
            same = await dbos.start_workflow(child, text)
        with SetShardKey("globex"):
            other = await dbos.start_workflow(child, text)
        await dbos.sleep(0.01)
        await dbos.send("peer", "hi", "hello", shard_key="acme")
        reply = await dbos.recv("go", timeout=30)
        return (f"{first}{await same.get_result()}{await other.get_result()}"
                f"{await batched.handle.get_result()}{reply}")

    def record(query: str, args: tuple[Any, ...], port: int) -> None:
        # A node's group-commit batch is one statement naming the tables of each of the
        # node's shards (of its one shard, if one), after locking and checking the batch's
        # (its last parameter):
        # recorded apart, the shards it locks, those it names and the node it went to,
        # and its statement as on the distributed tables.
        if "lock_shards_here(" in query:
            named = {int(m[2]) for m in SHARD_TABLE.finditer(query)}
            on_nodes.append(({int(shard) for shard in args[-1]}, named, port))
            shard_statements.add(" ".join(SHARD_TABLE.sub(r"\1", query).split()))
            return
        # A routed write is a program of statements run by run_routed on the key's node:
        # what plans there are its statements. A program naming a shard's own tables (plain
        # tables on that node) is recorded apart: its shard, the shards its statements
        # name, the node it went to, and its statements as on the distributed tables. A
        # batch on several shards (shards => ...) has a statement per shard, in order.
        if "run_routed(" in query:
            many = isinstance(args[1], list)
            programs, shards = (args[1], args[2]) if many else ([args[1]], [args[2]])
            if "shards =>" in query:
                programs = [json.dumps([step]) for step in json.loads(args[1])]
                shards = args[2]
            for program, shard in zip(programs, shards, strict=True):
                steps = json.loads(program)
                if shard is None:
                    for step in steps:
                        statements.setdefault(step["sql"], tuple(step["args"]))
                    continue
                named = {int(m[2]) for step in steps for m in SHARD_TABLE.finditer(step["sql"])}
                on_shards.append((int(shard), named, port))
                shard_statements.update(" ".join(SHARD_TABLE.sub(r"\1", step["sql"]).split())
                                        for step in steps)
            return
        if SHARD_TABLE.search(query):
            return  # a read of each node's own shards, over every key by design
        statements.setdefault(query, args)

    async with dbos:
        sysdb = dbos._system_database
        # The pools of the nodes holding the workload's keys (opened on first use).
        pools = [sysdb.pool, *{await sysdb._node_pool(key, on_shards)
                               for key in ("acme", "globex") for on_shards in (False, True)}]
        for pool in pools:
            connections = [await pool.acquire() for _ in range(pool.get_max_size())]
            for connection in connections:
                connection.add_query_logger(
                    lambda q: record(q.query, tuple(q.args or ()), q.conn_addr[1]))
            for connection in connections:
                await pool.release(connection)
        with SetShardKey("acme"), SetWorkflowID("peer"):
            peer_handle = await dbos.start_workflow(peer)
        with SetShardKey("acme"), SetWorkflowID("w"):
            handle = await dbos.start_workflow(work, "x")
        assert await dbos.get_event("w", "progress", timeout=30, shard_key="acme") == "x"
        assert [v async for v in dbos.read_stream("w", "out", shard_key="acme")] == ["x"]
        await dbos.send("w", 1, "go", shard_key="acme")
        assert await handle.get_result() == "xxxx1"
        assert await peer_handle.get_result() == "hi"
        with SetShardKey("acme"):
            queued = await queue.enqueue(child, "q")
        assert await queued.get_result() == "q"
        batch = await dbos.enqueue_many(queue, [
            EnqueueRequest(child, ("m",), shard_key="acme", deduplication_id="once"),
            EnqueueRequest(child, ("n",), shard_key="acme")])
        assert sorted([await r.handle.get_result() for r in batch]) == ["m", "n"]
        with SetShardKey("acme"), SetWorkflowID("blocked"):
            await dbos.start_workflow(peer)
        await dbos.cancel_workflow("blocked", shard_key="acme")
        blocked = await dbos.resume_workflow("blocked", shard_key="acme")
        await dbos.send("blocked", "again", "hello", shard_key="acme")
        assert await blocked.get_result() == "again"
        fork = await dbos.fork_workflow("w", 1, shard_key="acme", new_workflow_id="w-fork")
        await fork.get_status()
        await dbos.list_workflows(shard_key="acme")
        await dbos.list_workflow_steps("w", shard_key="acme")
        await dbos.get_all_events("w", shard_key="acme")
        await dbos.delete_workflow("blocked", shard_key="acme")
    return list(statements.items()), on_shards, on_nodes, shard_statements


async def test_per_key_statements_stay_on_one_shard(citus_url: str) -> None:
    statements, on_shards, on_nodes, shard_statements = await representative_workload(
        citus_url)
    conn = await asyncpg.connect(citus_url)
    try:
        workers = {f"port={r['nodeport']}" for r in await conn.fetch(
            "SELECT nodeport FROM pg_dist_node WHERE groupid <> 0")}
        assert workers, "the cluster needs a worker node"
        # Each shard's hash range: co-located shards of one key share it.
        ranges = {r["shardid"]: r["shardminvalue"] for r in await conn.fetch(
            "SELECT shardid, shardminvalue FROM pg_dist_shard WHERE shardminvalue IS NOT NULL")}
        routed, per_key = [], 0
        for sql, args in statements:
            if TRANSACTION_CONTROL.match(sql):
                continue
            plan = "\n".join(r[0] for r in await conn.fetch(
                "EXPLAIN " + with_literals(sql, args)))
            keyed = re.search(r"\bshard_key = \$\d+", sql) or INSERT.match(sql)
            if "Citus" not in plan or not keyed:
                continue  # no distributed table, or a statement over every key by design
            per_key += 1
            text = " ".join(sql.split())
            tasks = [int(n) for n in re.findall(r"Task Count: (\d+)", plan)]
            nodes = set(re.findall(r"Node: host=\S+ (port=\d+)", plan))
            shards = {ranges[int(i)] for i in SHARD_ID.findall(plan) if int(i) in ranges}
            # One router task on one key's shard: a single task, on one worker, naming the
            # shards of one key (co-located shards share a hash range), with nothing the
            # coordinator gathers (Citus plans a statement writing several tables, or an
            # INSERT ... SELECT it cannot push down, as subplans or a pull to itself).
            assert tasks == [1], ("not one router task", text, plan)
            assert len(nodes & workers) == 1, (text, plan)
            assert len(shards) == 1, ("not the shards of one key", text, plan)
            assert "Distributed Subplan" not in plan, ("not one router task", text, plan)
            assert "pull to coordinator" not in plan, ("not one router task", text, plan)
            routed.append(text)
        assert per_key >= 25, per_key
        # The programs sent to name a shard's tables name only the shards of that shard's
        # interval (one key's, co-located), and went to the node holding it.
        assert len(on_shards) >= 10, on_shards
        for shard, named, port in on_shards:
            assert shard in named and {ranges[i] for i in named} == {ranges[shard]}, named
            placed = await conn.fetchval(
                "SELECT n.nodeport FROM pg_dist_placement p JOIN pg_dist_node n"
                " USING (groupid) WHERE p.shardid = $1", shard)
            assert placed == port, (shard, placed, port)
        # A node's batch statement locks the shards it writes rows of, and names only
        # shards placed on the node it went to; a batch of one shard names that shard's
        # tables alone (its co-located shards: one hash range).
        assert on_nodes, "no batch went as one statement on a node"
        assert any(len(locked) == 1 for locked, _, _ in on_nodes), "no batch of one shard"
        for locked, named, port in on_nodes:
            assert locked and locked <= named, (locked, named)
            if len(locked) == 1:
                assert {ranges[i] for i in named} == {ranges[min(locked)]}, (locked, named)
            placed = {r["shardid"]: r["nodeport"] for r in await conn.fetch(
                "SELECT p.shardid, n.nodeport FROM pg_dist_placement p JOIN pg_dist_node n"
                " USING (groupid) WHERE p.shardid = ANY($1::bigint[])", list(named))}
            assert set(placed.values()) == {port}, (named, placed, port)
        # The hot statements are among them or ran on a shard's own tables: the step
        # checkpoint, the claim, an outside send, the fork's copies, and the parts of the
        # multi-table writes (a start's row and inputs, the outcome, an event with its
        # history, a stream value, recv's consume).
        written = routed + sorted(shard_statements)
        for table in ("operation_outputs", "notifications", "streams", "workflow_status",
                      "workflow_input", "workflow_output", "workflow_events",
                      "workflow_events_history"):
            assert any(f'INSERT INTO "dbos".{table}' in s for s in written), table
        for shape in ('UPDATE "dbos".workflow_status ws', 'UPDATE "dbos".workflow_status SET',
                      'UPDATE "dbos".notifications n SET consumed'):
            assert any(shape in s for s in written), shape
    finally:
        await conn.close()
