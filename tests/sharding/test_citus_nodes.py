"""Executors and clients on any node of a Citus cluster (``DBOS_TEST_CITUS_URL``): the schema
is migrated or verified through the coordinator, everything else runs on the node given."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import asyncpg
import pytest
from helpers import new_dbos, unique_name, worker_urls

from dbos_async import DBOSClient, SetShardKey, SetWorkflowID
from dbos_async._database_url import Host, parse_database_url
from dbos_async._sysdb.citus_nodes import node_url
from dbos_async._sysdb.migrations import LATEST_VERSION
from dbos_async.errors import ConfigurationError, MigrationError

KEYS = ("acme", "globex", "initech", "umbrella")


def test_node_url_keeps_all_but_the_servers() -> None:
    coordinator = Host("10.0.0.1", 5499)
    listed = node_url(
        "postgresql://app:s%40cret@w1:5500,w2:5501/orders?sslmode=disable&statement_timeout=5s",
        coordinator)
    in_query = node_url(
        "postgresql://app@/orders?host=w1,w2&port=5500,5501&password=s%40cret&sslmode=disable"
        "&statement_timeout=5s", coordinator)
    for url in (listed, in_query):
        parsed = parse_database_url(url)
        assert parsed.hosts == (coordinator,)
        assert (parsed.user, parsed.password, parsed.database) == ("app", "s@cret", "orders")
        assert parsed.options == {"sslmode": "disable", "statement_timeout": "5s"}
    v6 = parse_database_url(node_url("postgresql://app@/orders?host=w1&port=5500",
                                            Host("::1", 5499)))
    assert v6.hosts == (Host("::1", 5499),)


async def migration_tables(url: str) -> int:
    """How many dbos_migrations tables the node of ``url`` holds itself (0 or 1)."""
    conn = await asyncpg.connect(url)
    try:
        return int(await conn.fetchval(
            "SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = 'dbos' AND c.relname = 'dbos_migrations'"))
    finally:
        await conn.close()


class App:
    """Workflows with steps, a queue, messages and events, on one executor."""

    def __init__(self, url: str, **settings: Any) -> None:
        self.dbos = new_dbos(url, sharding=True, **settings)
        self.steps: Counter[str] = Counter()
        self.queue = self.dbos.queue(unique_name("jobs"), concurrency=2)

        @self.dbos.step(name="double")
        async def double(value: int) -> int:
            self.steps[str(value)] += 1
            return value * 2

        @self.dbos.workflow(name="work")
        async def work(value: int) -> int:
            await self.dbos.set_event("started", value)
            doubled = await double(value)
            reply = await self.dbos.recv("go", timeout=60)
            return doubled + int(reply)

        @self.dbos.workflow(name="quick")
        async def quick(value: int) -> int:
            return await double(value)

        self.work = work
        self.quick = quick


@pytest.mark.citus
async def test_executor_on_a_worker_migrates_through_the_coordinator(citus_url: str) -> None:
    first, second = await worker_urls(citus_url)
    app = App(first)
    async with app.dbos as dbos:
        assert await migration_tables(citus_url) == 1
        assert await migration_tables(first) == 0  # nothing was created on the worker
        conn = await asyncpg.connect(citus_url)
        try:
            assert await conn.fetchval("SELECT version FROM dbos.dbos_migrations") == \
                LATEST_VERSION
        finally:
            await conn.close()
        handles = []
        for value, key in enumerate(KEYS):
            with SetShardKey(key), SetWorkflowID(f"work-{key}"):
                handles.append(await dbos.start_workflow(app.work, value))
        for value, key in enumerate(KEYS):
            assert await dbos.get_event(f"work-{key}", "started", timeout=30,
                                        shard_key=key) == value
            await dbos.send(f"work-{key}", 100, "go", shard_key=key)
        assert [await h.get_result() for h in handles] == [100, 102, 104, 106]
        queued = []
        for value, key in enumerate(KEYS):
            with SetShardKey(key):
                queued.append(await app.queue.enqueue(app.quick, 10 + value))
        assert [await h.get_result() for h in queued] == [20, 22, 24, 26]
        listed = {(w.workflow_id, w.shard_key) for w in await dbos.list_workflows(name="work")}
        assert listed == {(f"work-{key}", key) for key in KEYS}

        # A client on the other worker node verifies the schema through the coordinator.
        async with DBOSClient(system_database_url=second, sharding=True,
                              application_name=unique_name("client")) as client:
            for value, key in enumerate(KEYS):
                status = await client.get_workflow_status(f"work-{key}", shard_key=key)
                assert status is not None and status.status == "SUCCESS"
                handle = await client.retrieve_workflow(f"work-{key}", shard_key=key)
                assert await handle.get_result() == 100 + 2 * value
    assert app.steps == Counter({str(v): 1 for v in (0, 1, 2, 3, 10, 11, 12, 13)})

    # Entering again on the migrated database, on the other worker, migrates nothing.
    again = App(second, executor_id=unique_name("again"))
    async with again.dbos as dbos:
        with SetShardKey("acme"):
            assert await (await dbos.start_workflow(again.quick, 7)).get_result() == 14
    assert await migration_tables(second) == 0


@pytest.mark.citus
async def test_worker_of_an_unmigrated_database_is_verified_on_the_coordinator(
        citus_url: str) -> None:
    [first, _] = await worker_urls(citus_url)
    for opener in (lambda: DBOSClient(system_database_url=first, sharding=True),
                   lambda: new_dbos(first, sharding=True, run_migrations=False)):
        with pytest.raises(MigrationError, match="does not exist"):
            async with opener():
                pass
    assert await migration_tables(citus_url) == 0
    assert await migration_tables(first) == 0


@pytest.mark.citus
async def test_worker_without_metadata_is_refused(citus_url: str) -> None:
    [_, second] = await worker_urls(citus_url)
    async with new_dbos(citus_url, sharding=True):
        pass  # migrated: the worker holds shards of every table
    node = parse_database_url(second).hosts[0]
    conn = await asyncpg.connect(citus_url)
    try:
        await conn.execute("SELECT stop_metadata_sync_to_node($1, $2)", node.address, node.port)
    finally:
        await conn.close()
    with pytest.raises(ConfigurationError, match=r"without its cluster's metadata.*metadata "
                                                 r"sync.*or connect to the coordinator"):
        async with new_dbos(second, sharding=True):
            pass
    assert await migration_tables(second) == 0


@pytest.mark.citus
async def test_executors_on_coordinator_and_worker_see_each_others_workflows(
        citus_url: str) -> None:
    [first, _] = await worker_urls(citus_url)
    on_coordinator = App(citus_url, executor_id=unique_name("coordinator"))
    on_worker = App(first, executor_id=unique_name("worker"))
    async with on_coordinator.dbos as coordinator, on_worker.dbos as worker:
        with SetShardKey("acme"), SetWorkflowID("from-coordinator"):
            await coordinator.start_workflow(on_coordinator.quick, 1)
        with SetShardKey("globex"), SetWorkflowID("from-worker"):
            await worker.start_workflow(on_worker.quick, 2)
        seen_by_worker = await worker.retrieve_workflow("from-coordinator", shard_key="acme")
        seen_by_coordinator = await coordinator.retrieve_workflow("from-worker",
                                                                  shard_key="globex")
        assert (await seen_by_worker.get_result(), await seen_by_coordinator.get_result()) \
            == (2, 4)
        for dbos in (coordinator, worker):
            listed = {(w.workflow_id, w.shard_key) for w in await dbos.list_workflows()}
            assert listed == {("from-coordinator", "acme"), ("from-worker", "globex")}


@pytest.mark.citus
async def test_a_url_listing_several_nodes_is_not_taken_for_two_primaries(
        citus_url: str) -> None:
    """Each Citus node is a writable server with a timeline of its own: the check that
    refuses two writable primaries of one database does not apply to them."""
    first, second = await worker_urls(citus_url)
    hosts = [*parse_database_url(first).hosts, *parse_database_url(second).hosts]
    listed = parse_database_url(citus_url)
    servers = ",".join(str(host) for host in hosts)
    url = f"postgresql://{listed.user or 'postgres'}@{servers}/{listed.database_name}"
    app = App(url)
    async with app.dbos:
        with SetShardKey("acme"):
            assert await app.quick(21) == 42
        assert await migration_tables(first) == 0
    async with DBOSClient(system_database_url=url, sharding=True) as client:
        assert len(await client.list_workflows(name="quick")) == 1


@pytest.mark.citus
async def test_a_message_written_without_a_notification_is_read_by_the_poll(
        citus_url: str) -> None:
    """On Citus every wait also reads again every ``listening_poll_interval``: a message
    whose notification was lost (here, a raw insert on another node, which sends none) is
    still received, never left to the recv's timeout."""
    first, second = await worker_urls(citus_url)
    app = App(first, listening_poll_interval=0.2)
    async with app.dbos as dbos, DBOSClient(system_database_url=second, sharding=True) as client:
        with SetShardKey("acme"), SetWorkflowID("waits"):
            handle = await dbos.start_workflow(app.work, 1)
        assert await client.get_event("waits", "started", timeout=30, shard_key="acme") == 1
        conn = await asyncpg.connect(second)
        try:
            await conn.execute(
                "INSERT INTO dbos.notifications (shard_key, destination_uuid, topic, message, "
                "serialization) VALUES ('acme', 'waits', 'go', '100', 'portable_json')")
        finally:
            await conn.close()
        # The recv's timeout is 60 s: the guard here only stops a hang.
        assert await asyncio.wait_for(handle.get_result(), 20) == 102
