"""Which shard keys a sharded queue's claim rounds visit: exactly the keys with ENQUEUED
work of this application on that queue, read through an index (never a sequential scan of
workflow_status), on plain PostgreSQL and on Citus."""

from __future__ import annotations

import asyncpg
import pytest
from helpers import unique_name

from dbos_async import DBOSClient, migrate

QUEUE = "jobs"


@pytest.fixture(params=["postgres", pytest.param("citus", marks=pytest.mark.citus)])
def database_url(request: pytest.FixtureRequest) -> str:
    """A fresh database for a sharded system schema: on the test PostgreSQL server, and on
    the Citus cluster of ``DBOS_TEST_CITUS_URL`` (skipped when it is not set)."""
    fixture = "citus_url" if request.param == "citus" else "plain_database_url"
    url: str = request.getfixturevalue(fixture)
    return url


@pytest.fixture(autouse=True)
async def sharded_schema(database_url: str) -> None:
    await migrate(database_url, sharding=True)


def client_of(url: str, application_name: str = "keys-app") -> DBOSClient:
    return DBOSClient(system_database_url=url, sharding=True,
                      application_name=application_name)


async def queue_keys(client: DBOSClient, queue_name: str = QUEUE) -> list[str]:
    keys = await client._peer().system_database.dequeue_scopes(queue_name)
    assert len(keys) == len(set(keys)), keys
    return keys


async def test_keys_with_enqueued_work_on_the_queue(database_url: str) -> None:
    async with client_of(database_url) as client, \
            client_of(database_url, unique_name("other-app")) as other_app:
        assert await queue_keys(client) == []

        await client.enqueue(QUEUE, "work", shard_key="acme", workflow_id="a1")
        assert await queue_keys(client) == ["acme"]

        # A second workflow under the same key is one key still.
        await client.enqueue(QUEUE, "work", shard_key="acme", workflow_id="a2")
        for key in ("globex", "initech", "umbrella"):
            await client.enqueue(QUEUE, "work", shard_key=key, workflow_id=f"{key}-1")
        # Excluded: a key whose only work on the queue is no longer ENQUEUED, a key with
        # work on another queue only, and a key with only another application's work.
        await client.cancel_workflow("umbrella-1", shard_key="umbrella")
        await client.enqueue("elsewhere", "work", shard_key="hooli", workflow_id="h1")
        await other_app.enqueue(QUEUE, "work", shard_key="stark", workflow_id="s1")

        keys = await queue_keys(client)
        assert sorted(keys) == ["acme", "globex", "initech"]
        assert await queue_keys(client, "elsewhere") == ["hooli"]
        assert await queue_keys(client, "no-such-queue") == []
        assert await queue_keys(other_app) == ["stark"]

        # A key leaves once its last ENQUEUED workflow does.
        await client.cancel_workflow("a1", shard_key="acme")
        assert sorted(await queue_keys(client)) == ["acme", "globex", "initech"]
        await client.cancel_workflow("a2", shard_key="acme")
        assert sorted(await queue_keys(client)) == ["globex", "initech"]


FILL = """
INSERT INTO dbos.workflow_status (shard_key, workflow_uuid, status, name, queue_name,
                                  inputs, application_name)
SELECT 'tenant-' || (i % $2::int), 'wf-' || i,
       CASE WHEN i % 2 = 0 THEN 'ENQUEUED' ELSE 'SUCCESS' END, 'work',
       CASE WHEN i % 10 = 1 THEN 'elsewhere' ELSE $3::text END, repeat('x', 200), $4::text
FROM generate_series(1, $1::int) AS i
"""


async def test_the_keys_are_read_through_an_index(database_url: str) -> None:
    async with client_of(database_url) as client:
        sysdb = client._peer().system_database
        conn = await asyncpg.connect(database_url)
        try:
            # Enough keys that every Citus shard holds some (an empty shard's part is a
            # sequential scan of nothing).
            await conn.execute(FILL, 40_000, 320, QUEUE, "keys-app")
            await conn.execute("VACUUM ANALYZE dbos.workflow_status")
            assert len(await queue_keys(client)) == 160  # the even tenants
            query = sysdb.sql.dequeue_scopes(QUEUE, distributed=sysdb.routes_single_tables)
            if sysdb.routes_single_tables:
                await conn.execute("SET citus.explain_all_tasks = on")
            # ANALYZE: a subquery in a target list (the loose scan's step) shows only when
            # it is run.
            plan = "\n".join(row[0] for row in await conn.fetch(
                f"EXPLAIN (ANALYZE) {query.sql}", *query.params))
        finally:
            await conn.close()
    assert "idx_workflow_status_queue_keys" in plan, plan
    assert "Seq Scan" not in plan, plan
    if sysdb.routes_single_tables:
        # Every shard's part reads the index (the plan shows each task's).
        tasks = plan.count("->  Task")
        assert tasks > 1, plan
        assert plan.count("Index Only Scan using idx_workflow_status_queue_keys") == tasks, plan
    else:
        # A loose scan: the first key, then a seek past each key to the next.
        assert plan.count("Index Only Scan using idx_workflow_status_queue_keys") == 2, plan
        assert "Recursive Union" in plan, plan
