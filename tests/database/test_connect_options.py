"""``check_connection`` (the ``dbos`` package's client call) and ``connect_options`` (asyncpg
connect arguments for every system-database connection, e.g. a statement cache of 0 behind
a transaction-mode pooler), on an executor and a client, unsharded and sharded."""

from __future__ import annotations

import asyncio
import contextlib

import pytest
from helpers import new_dbos

from dbos_async import (
    ConfigurationError,
    DatabaseUnavailableError,
    DBOSClient,
    SetShardKey,
    SetWorkflowID,
)
from tests.helpers.cluster import Cluster

PATIENCE = 15.0


async def prepared_in_pool(peer: DBOSClient | object) -> list[str]:
    """The named prepared statements of the sessions of the (two-connection) pool."""
    pool = peer._peer().system_database.pool  # type: ignore[attr-defined]
    query = "SELECT name FROM pg_prepared_statements"
    async with pool.acquire() as one, pool.acquire() as two:
        return [r["name"] for r in [*await one.fetch(query), *await two.fetch(query)]]


@pytest.mark.parametrize("sharding", [False, True], ids=["unsharded", "sharded"])
async def test_statement_cache_off_prepares_no_named_statements(
        database_url: str, sharding: bool) -> None:
    async def run(**settings: object) -> list[str]:
        dbos = new_dbos(database_url, sharding=sharding, pool_size=2, **settings)

        @dbos.step(name="add")
        async def add(x: int) -> int:
            return x + 1

        @dbos.workflow(name="twice")
        async def twice(x: int) -> int:
            return await add(await add(x))

        async with dbos:
            with SetShardKey("acme") if sharding else contextlib.nullcontext(), SetWorkflowID(
                    f"w-{len(settings)}"):
                assert await asyncio.wait_for(twice(1), PATIENCE) == 3
            await dbos.check_connection()
            names = await prepared_in_pool(dbos)
        async with DBOSClient(system_database_url=database_url, sharding=sharding,
                              pool_size=2, **settings) as client:
            await client.check_connection()
            await client.list_workflows()
            names += await prepared_in_pool(client)
        return names

    # asyncpg's default: statements prepared under names, cached per connection.
    assert await run() != []
    # A pooler in transaction mode hands each transaction another server session: off.
    assert await run(connect_options={"statement_cache_size": 0}) == []


async def test_check_connection_says_when_the_database_is_gone(cluster: Cluster) -> None:
    url = cluster.url("checked")
    async with new_dbos(url):
        pass
    async with DBOSClient(system_database_url=url, connect_timeout=2.0) as client:
        await client.check_connection()
        await asyncio.to_thread(cluster.stop)
        try:
            with pytest.raises(DatabaseUnavailableError,
                               match="unavailable while checking the connection"):
                await client.check_connection()
        finally:
            await asyncio.to_thread(cluster.start)
        # The pool connects afresh once the server is back.
        await client.check_connection()


def test_bad_connect_options_are_refused() -> None:
    with pytest.raises(ConfigurationError, match="connect_options may not set timeout"):
        DBOSClient(system_database_url="postgresql://localhost/x",
                   connect_options={"timeout": 3})
    with pytest.raises(ConfigurationError, match="connect_options may not set no_such"):
        DBOSClient(system_database_url="postgresql://localhost/x",
                   connect_options={"no_such": 1})
    with pytest.raises(ConfigurationError, match="connect_options must be a JSON object"):
        DBOSClient(system_database_url="postgresql://localhost/x", connect_options="{oops")
