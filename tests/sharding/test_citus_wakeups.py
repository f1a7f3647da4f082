"""Wake-ups across the nodes of a Citus cluster (``DBOS_TEST_CITUS_URL``): a notification is
sent on the writer's node, and reaches a waiter connected to any other node, because every
process also listens on every other node of the cluster.

Both poll intervals are long here (:data:`POLL`), so that no wait may end by reading again:
a waiter that returns within :data:`PROMPT` was woken by a notification.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import asyncpg
import pytest
from helpers import (
    connections_named,
    execute,
    fetch,
    new_dbos,
    unique_name,
    wait_until,
    worker_urls,
)

from dbos_async import DBOS, DBOSClient, SetShardKey, SetWorkflowID
from dbos_async._database_url import parse_database_url
from dbos_async._sysdb.notifications import (
    NOTIFICATIONS_CHANNEL,
    WORKFLOW_EVENTS_CHANNEL,
    payload_key,
)

POLL = 30.0
"""``listening_poll_interval`` and ``notification_poll_interval`` of every process here."""
PROMPT = 5.0
"""The longest a wake-up across nodes may take here: far below :data:`POLL`."""


def executor(url: str) -> tuple[DBOS, Any]:
    """An executor on ``url``'s node, with a workflow that waits for a message, then sets
    event ``done`` to it; and that workflow."""
    dbos = new_dbos(url, sharding=True, listening_poll_interval=POLL,
                    notification_poll_interval=POLL)

    @dbos.workflow(name="waits")
    async def waits() -> Any:
        reply = await dbos.recv("go", timeout=60)
        await dbos.set_event("done", reply)
        return reply

    return dbos, waits


def client(url: str, name: str | None = None) -> DBOSClient:
    """A client on ``url``'s node; ``name`` names its connections (and its application)."""
    return DBOSClient(system_database_url=url, sharding=True,
                      application_name=name or unique_name("client"),
                      listening_poll_interval=POLL, notification_poll_interval=POLL)


async def listening_everywhere(dbos: DBOS) -> None:
    """Until the executor's listener is connected to every node (its health says so)."""

    async def connected() -> bool:
        return dbos.health().listener is None

    await wait_until(connected, what="the listener on every node")


async def waiting(peer: DBOS | DBOSClient, channel: str, workflow_id: str, name: str,
                  key: str = "acme") -> None:
    """Until ``peer`` waits for a notification about ``name`` (a topic or an event's key) of
    workflow ``workflow_id`` under ``key``: a write after this must wake it."""
    dispatcher = peer._peer().system_database.notifications
    assert dispatcher is not None
    target = payload_key(workflow_id, name, key)

    async def registered() -> bool:
        return dispatcher.waiters_on(channel, target) > 0

    await wait_until(registered, what=f"a waiter on {channel} {target}")


async def key_on(url: str, node_url: str) -> str:
    """A shard key whose rows live on ``node_url``'s node (the schema is distributed)."""
    node = parse_database_url(node_url).hosts[0]
    for key in (f"tenant-{i}" for i in range(1000)):
        [row] = await fetch(url, "SELECT nodename, nodeport FROM citus_shards WHERE shardid = "
                            "get_shard_id_for_distribution_column('dbos.workflow_status', "
                            "$1::text)", key)
        if (row["nodename"], row["nodeport"]) == (node.address, node.port):
            return key
    raise AssertionError(f"no key of the first thousand lives on {node}")


async def listener_pids(node_url: str, name: str) -> set[int]:
    """The server processes of the listener connections named ``name`` on ``node_url``'s
    node: those whose last statement is a listener's (LISTEN, or its health check), as a
    process may also have a pool there (reads over every node, such as a queue's keys)."""
    rows = await fetch(node_url, "SELECT pid FROM pg_stat_activity WHERE application_name = $1"
                       " AND (query LIKE 'LISTEN %' OR query = 'SELECT 1')", name)
    return {row["pid"] for row in rows}


async def terminate(node_url: str, pid: int) -> None:
    """End server process ``pid`` on ``node_url``'s node (as a node's restart would)."""
    conn = await asyncpg.connect(node_url)
    try:
        assert await conn.fetchval("SELECT pg_terminate_backend($1::int)", pid)
    finally:
        await conn.close()


async def timed(awaitable: Any) -> tuple[Any, float]:
    """What ``awaitable`` returned, and how long it took (a guard stops a hang)."""
    started = time.monotonic()
    result = await asyncio.wait_for(awaitable, 2 * POLL)
    return result, time.monotonic() - started


@pytest.mark.citus
async def test_a_message_sent_on_another_worker_wakes_recv_at_once(citus_url: str) -> None:
    first, second = await worker_urls(citus_url)
    dbos, waits = executor(first)
    async with dbos, client(second) as sender:
        await listening_everywhere(dbos)
        with SetShardKey("acme"), SetWorkflowID("waits"):
            handle = await dbos.start_workflow(waits)
        await waiting(dbos, NOTIFICATIONS_CHANNEL, "waits", "go")
        await sender.send("waits", "from the other worker", "go", shard_key="acme")
        reply, took = await timed(handle.get_result())
        assert reply == "from the other worker"
        assert took < PROMPT, f"the recv took {took:.2f}s"


@pytest.mark.citus
async def test_an_event_set_on_a_worker_wakes_get_event_on_the_coordinator(
        citus_url: str) -> None:
    [first, _] = await worker_urls(citus_url)
    dbos, waits = executor(first)
    name = unique_name("client")
    async with dbos, client(citus_url, name) as waiter:
        # The client on the coordinator listens on the worker too.
        async def heard() -> bool:
            return await connections_named(first, name) == 1

        await wait_until(heard, what="the client's listener on the worker")
        with SetShardKey("acme"), SetWorkflowID("waits"):
            await dbos.start_workflow(waits)
        done = asyncio.ensure_future(waiter.get_event("waits", "done", timeout=60,
                                                      shard_key="acme"))
        await waiting(waiter, WORKFLOW_EVENTS_CHANNEL, "waits", "done")
        # The event is set on the worker once the message arrives there.
        await dbos.send("waits", "sent on the worker", "go", shard_key="acme")
        value, took = await timed(done)
        assert value == "sent on the worker"
        assert took < PROMPT, f"the get_event took {took:.2f}s"


@pytest.mark.citus
async def test_a_lost_listener_connection_to_a_node_comes_back(citus_url: str) -> None:
    first, second = await worker_urls(citus_url)
    dbos, waits = executor(first)
    name = dbos.config.connection_name
    async with dbos, client(second) as sender:
        await listening_everywhere(dbos)
        [lost] = await listener_pids(second, name)
        await terminate(second, lost)

        async def back() -> bool:
            pids = await listener_pids(second, name)
            return len(pids) == 1 and lost not in pids and dbos.health().listener is None

        await wait_until(back, what="the listener on the other worker to reconnect")
        with SetShardKey("acme"), SetWorkflowID("waits"):
            handle = await dbos.start_workflow(waits)
        await waiting(dbos, NOTIFICATIONS_CHANNEL, "waits", "go")
        await sender.send("waits", "after the reconnect", "go", shard_key="acme")
        reply, took = await timed(handle.get_result())
        assert reply == "after the reconnect"
        assert took < PROMPT, f"the recv took {took:.2f}s"


@pytest.mark.citus
async def test_a_node_added_later_is_listened_on(citus_url: str) -> None:
    """A node joining the cluster is read at the listener's next read of the nodes (every
    health check, and when its own connection comes back: the one forced here)."""
    first, second = await worker_urls(citus_url)
    node = parse_database_url(second).hosts[0]
    admin = await asyncpg.connect(citus_url)
    try:
        # Not yet in the cluster when the executor enters (nothing is distributed yet).
        await admin.execute("SELECT citus_remove_node($1, $2)", node.address, node.port)
        dbos, waits = executor(first)
        name = dbos.config.connection_name
        async with dbos:
            await listening_everywhere(dbos)
            assert await listener_pids(second, name) == set()
            await admin.execute("SELECT citus_add_node($1, $2)", node.address, node.port)
            # The listener's connection to its own node: the one that reads the nodes.
            [home] = [row["pid"] for row in await fetch(
                first, "SELECT pid FROM pg_stat_activity WHERE application_name = $1 "
                "AND query ~ 'pg_dist_node'", name)]
            await terminate(first, home)

            async def joined() -> bool:
                return len(await listener_pids(second, name)) == 1 \
                    and dbos.health().listener is None

            await wait_until(joined, what="the listener on the added node")
            async with client(second) as sender:
                with SetShardKey("acme"), SetWorkflowID("waits"):
                    handle = await dbos.start_workflow(waits)
                await waiting(dbos, NOTIFICATIONS_CHANNEL, "waits", "go")
                await sender.send("waits", "from the added node", "go", shard_key="acme")
                reply, took = await timed(handle.get_result())
        assert reply == "from the added node"
        assert took < PROMPT, f"the recv took {took:.2f}s"
    finally:
        await admin.close()


@pytest.mark.citus
async def test_a_node_out_of_reach_leaves_the_others_listening(citus_url: str) -> None:
    """While the listener cannot reach one node, health names that node, and notifications
    sent on the others still wake waiters; once the node is back, so is its listener."""
    first, second = await worker_urls(citus_url)
    node = parse_database_url(second)
    quoted = '"' + node.database_name.replace('"', '""') + '"'
    dbos, waits = executor(first)
    name = dbos.config.connection_name
    async with dbos, client(citus_url) as sender:
        await listening_everywhere(dbos)
        # The workflow's rows on the first worker: its statements need no new connection to
        # the node out of reach.
        key = await key_on(citus_url, first)
        [lost] = await listener_pids(second, name)
        # New connections to the database on that node are refused; those open stay.
        on_server = node.with_database("postgres")
        await execute(on_server, f"ALTER DATABASE {quoted} ALLOW_CONNECTIONS false")
        try:
            await terminate(on_server, lost)

            async def reported() -> bool:
                listener = dbos.health().listener
                return listener is not None and f"Citus node {node.hosts[0]} (" in listener

            await wait_until(reported, what="the node out of reach in the health report")
            with SetShardKey(key), SetWorkflowID("waits"):
                handle = await dbos.start_workflow(waits)
            await waiting(dbos, NOTIFICATIONS_CHANNEL, "waits", "go", key)
            await sender.send("waits", "from the coordinator", "go", shard_key=key)
            reply, took = await timed(handle.get_result())
            assert reply == "from the coordinator"
            assert took < PROMPT, f"the recv took {took:.2f}s"
            assert dbos.health().listener is not None  # still out of reach
        finally:
            await execute(on_server, f"ALTER DATABASE {quoted} ALLOW_CONNECTIONS true")
        await listening_everywhere(dbos)
        assert len(await listener_pids(second, name)) == 1
