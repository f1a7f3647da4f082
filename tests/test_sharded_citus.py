"""The sharded migration track on a Citus cluster (``DBOS_TEST_CITUS_URL``): what it
distributes, and that the SQL functions' notifications reach listeners on the coordinator
while workers hold the rows."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest

from dbos_async.errors import ConfigurationError
from dbos_async.sysdb.database import SystemDatabase
from dbos_async.sysdb.migrations import LATEST_VERSION, migrate, verify

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
