"""Queues stored in the database, operated from an executor and from a client alike (one
implementation: see test_operator.py):
``list_queues``, ``get_queue_definition``, ``update_queue`` and ``delete_queue``, on the
unsharded and the sharded schema (the queues table is global there). A change that is
refused writes nothing."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from helpers import fetch, new_dbos

from dbos_async import (
    DBOS,
    ApplicationOwnershipError,
    ConfigurationError,
    DBOSClient,
    QueueNotFoundError,
    RateLimit,
)


@pytest.fixture(params=[False, True], ids=["unsharded", "sharded"])
async def dbos(request: pytest.FixtureRequest, database_url: str) -> AsyncIterator[DBOS]:
    executor = new_dbos(database_url, sharding=request.param, application_name="shop")
    executor.queue("declared", concurrency=4)
    async with executor:
        yield executor


async def stored(url: str, name: str) -> dict[str, object] | None:
    rows = await fetch(url, "SELECT * FROM dbos.queues WHERE name = $1", name)
    return dict(rows[0]) if rows else None


async def test_get_update_and_delete_a_stored_queue(dbos: DBOS, database_url: str) -> None:
    client = DBOSClient(system_database_url=database_url, application_name="shop",
                        sharding=dbos.config.sharding, pool_size=2)
    async with client:
        await client.register_queue("emails", concurrency=5, limiter=(10, 60.0))
        for operator in (dbos, client):
            queue = await operator.get_queue_definition("emails")
            assert queue is not None
            assert (queue.concurrency, queue.limiter) == (5, RateLimit(10, 60.0))
            assert await operator.get_queue_definition("nope") is None
        assert sorted(q.name for q in await dbos.list_queues()) == ["declared", "emails"]

        # Only the settings given change; None removes a limit.
        updated = await dbos.update_queue("emails", worker_concurrency=2, limiter=None)
        assert (updated.concurrency, updated.worker_concurrency, updated.limiter) == (5, 2,
                                                                                     None)
        row = await stored(database_url, "emails")
        assert row is not None
        assert (row["concurrency"], row["worker_concurrency"], row["rate_limit_max"],
                row["application_name"]) == (5, 2, None, "shop")
        await client.update_queue("emails", partition_queue=True, partition_concurrency=1,
                                  polling_interval=0.5)
        queue = await dbos.get_queue_definition("emails")
        assert queue is not None
        assert (queue.partition_queue, queue.partition_concurrency, queue.polling_interval,
                queue.worker_concurrency) == (True, 1, 0.5, 2)

        await client.delete_queue("emails")
        assert await stored(database_url, "emails") is None
        assert await dbos.get_queue_definition("emails") is None
        with pytest.raises(QueueNotFoundError, match="'emails'"):
            await dbos.delete_queue("emails")
        with pytest.raises(QueueNotFoundError):
            await client.update_queue("emails", concurrency=1)


async def test_invalid_updates_write_nothing(dbos: DBOS, database_url: str) -> None:
    await dbos.update_queue("declared", worker_concurrency=2)
    before = await stored(database_url, "declared")
    refused: list[tuple[dict[str, object], str]] = [
        ({"worker_concurrency": 10}, "exceeds concurrency"),
        ({"concurrency": 0}, "concurrency must be an integer >= 1"),
        ({"limiter": (5, -1.0)}, "limiter period of queue 'declared': must be positive"),
        ({"partition_concurrency": 2}, "partition limits need partition_queue=True"),
        ({"polling_interval": 0}, "polling_interval of queue 'declared': must be positive"),
    ]
    for changes, message in refused:
        with pytest.raises(ConfigurationError, match=message):
            await dbos.update_queue("declared", **changes)  # type: ignore[arg-type]
    assert await stored(database_url, "declared") == before


async def test_another_applications_queue_is_not_changed(dbos: DBOS,
                                                         database_url: str) -> None:
    other = DBOSClient(system_database_url=database_url, application_name="billing",
                       sharding=dbos.config.sharding, pool_size=2)
    nameless = DBOSClient(system_database_url=database_url, sharding=dbos.config.sharding,
                          pool_size=2)
    async with other, nameless:
        await other.register_queue("invoices", concurrency=3)
        before = await stored(database_url, "invoices")
        with pytest.raises(ApplicationOwnershipError, match="'billing'"):
            await dbos.update_queue("invoices", concurrency=1)
        with pytest.raises(ApplicationOwnershipError):
            await dbos.delete_queue("invoices")
        assert await stored(database_url, "invoices") == before
        # Listed by its owner, not by another application; read by name by anyone.
        assert "invoices" not in {q.name for q in await dbos.list_queues()}
        assert "invoices" in {q.name for q in await other.list_queues()}
        assert await dbos.get_queue_definition("invoices") is not None
        # A client acting for no application may change any queue, and leaves its owner.
        await nameless.update_queue("invoices", concurrency=6)
        row = await stored(database_url, "invoices")
        assert row is not None and (row["concurrency"], row["application_name"]) == (
            6, "billing")
        await nameless.delete_queue("invoices")
        assert await stored(database_url, "invoices") is None
