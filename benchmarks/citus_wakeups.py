"""Wake-ups across the nodes of a Citus cluster: how long a waiter takes to return after a
write on another node.

    python benchmarks/citus_wakeups.py --url URL [--rounds N]

URL names a Citus database on the coordinator, with at least two worker nodes. In a scratch
schema (sharded, dropped after), an executor on the first worker runs, each round, a new
workflow that waits in ``recv`` and then sets an event to the message. For a client on each
node (the same worker, the other worker, the coordinator), N rounds of each:

- ``recv``: the client sends the message; from the send's call to the workflow's result
  (its ``recv`` woken by the client's notification, sent on the client's node);
- ``get_event``: the client waits for the event while the executor sends the message;
  from that send's call to the client's ``get_event`` returning (the workflow woken on its
  own node, its ``set_event``, then the client woken by the executor's notification, sent
  on the first worker);
- ``enqueue``: the client enqueues a workflow on a queue of the executor, whose claim loop
  waits; from the enqueue's call to the workflow's start (the claim loop woken by the
  client's notification). Without one, the claim loop waits for the queue watcher's poll,
  every second after work, backing off to ``idle_poll_max_interval`` (30 s) while idle.

Each write is made only once its waiter is registered (so every round is a wake-up, never a
first read that finds the write), and both poll intervals are 30 s: a round that no
notification wakes takes up to that long. Prints the median, 90th percentile and maximum.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Callable
from typing import Any

import asyncpg

from dbos_async import DBOS, DBOSClient, SetShardKey, SetWorkflowID, WorkflowHandle
from dbos_async._database_url import Host, parse_database_url
from dbos_async._sysdb.notifications import (
    NOTIFICATIONS_CHANNEL,
    WORKFLOW_EVENTS_CHANNEL,
    NotificationDispatcher,
    payload_key,
)

SCHEMA = "dbos_bench_wakeups"
KEY = "tenant"
POLL = 30.0


async def node_urls(url: str) -> tuple[str, str]:
    """The URLs of ``url``'s database on the first two worker nodes."""
    conn = await asyncpg.connect(url)
    try:
        rows = await conn.fetch("SELECT nodename, nodeport FROM pg_dist_node "
                                "WHERE groupid <> 0 AND noderole = 'primary' ORDER BY groupid")
    finally:
        await conn.close()
    if len(rows) < 2:
        raise SystemExit("the cluster needs two worker nodes")
    parsed = parse_database_url(url)
    first, second = (parsed.with_server(Host(r["nodename"], r["nodeport"])) for r in rows[:2])
    return first, second


async def drop_scratch_schema(url: str) -> None:
    conn = await asyncpg.connect(url)
    try:
        await conn.execute(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE")
    finally:
        await conn.close()


def dispatcher_of(peer: DBOS | DBOSClient) -> NotificationDispatcher:
    dispatcher = peer._peer().system_database.notifications
    assert dispatcher is not None
    return dispatcher


async def until(holds: Callable[[], bool]) -> None:
    """Return once ``holds()`` (checked every 5 ms)."""
    while True:
        if holds():
            return
        await asyncio.sleep(0.005)


async def listening(*peers: DBOS | DBOSClient) -> None:
    """Until each of ``peers`` listens on every node."""
    await until(lambda: all(dispatcher_of(peer).listening for peer in peers))


async def registered(peer: DBOS | DBOSClient, channel: str, target: str) -> None:
    dispatcher = dispatcher_of(peer)
    await until(lambda: dispatcher.waiters_on(channel, target) > 0)


def summary(times: list[float]) -> str:
    ms = sorted(t * 1000 for t in times)
    p90 = ms[max(0, round(0.9 * len(ms)) - 1)]
    return f"median {statistics.median(ms):8.1f} ms, p90 {p90:8.1f} ms, max {ms[-1]:8.1f} ms"


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    first, second = await node_urls(args.url)
    settings: dict[str, Any] = {"schema_name": SCHEMA, "sharding": True,
                                "listening_poll_interval": POLL,
                                "notification_poll_interval": POLL}
    dbos = DBOS(system_database_url=first, executor_id="bench-wakeups", **settings)

    queue = dbos.queue("bench_wakeups")
    began: dict[int, asyncio.Future[float]] = {}

    @dbos.workflow(name="job")
    async def job(i: int) -> None:
        began[i].set_result(time.monotonic())

    @dbos.workflow(name="receiver")
    async def receiver() -> Any:
        message = await dbos.recv("go", timeout=3 * POLL)
        await dbos.set_event("seen", message)
        return message

    started_workflows = 0

    async def waiting_workflow() -> tuple[str, WorkflowHandle[Any]]:
        """A new workflow, once it waits in ``recv``."""
        nonlocal started_workflows
        started_workflows += 1
        workflow_id = f"receiver-{started_workflows}"
        with SetShardKey(KEY), SetWorkflowID(workflow_id):
            handle = await dbos.start_workflow(receiver)
        await registered(dbos, NOTIFICATIONS_CHANNEL, payload_key(workflow_id, "go", KEY))
        return workflow_id, handle

    await drop_scratch_schema(args.url)  # what an interrupted run left
    try:
        async with dbos:
            for where, url in (("the same worker", first), ("the other worker", second),
                               ("the coordinator", args.url)):
                async with DBOSClient(system_database_url=url, **settings) as client:
                    await listening(client, dbos)
                    recv_times = []
                    for i in range(args.rounds):
                        workflow_id, handle = await waiting_workflow()
                        started = time.monotonic()
                        await client.send(workflow_id, i, "go", shard_key=KEY)
                        assert await handle.get_result() == i
                        recv_times.append(time.monotonic() - started)
                    event_times = []
                    for i in range(args.rounds):
                        workflow_id, handle = await waiting_workflow()
                        seen = asyncio.ensure_future(client.get_event(
                            workflow_id, "seen", timeout=3 * POLL, shard_key=KEY))
                        await registered(client, WORKFLOW_EVENTS_CHANNEL,
                                         payload_key(workflow_id, "seen", KEY))
                        started = time.monotonic()
                        await dbos.send(workflow_id, i, "go", shard_key=KEY)
                        assert await seen == i
                        event_times.append(time.monotonic() - started)
                        await handle.get_result()
                    enqueue_times = []
                    for i in range(args.rounds):
                        began[i] = asyncio.get_running_loop().create_future()
                        started = time.monotonic()
                        await client.enqueue(queue.name, "job", i, shard_key=KEY)
                        enqueue_times.append(await began[i] - started)
                        del began[i]
                    print(f"client on {where}:")
                    print(f"  recv      ({len(recv_times)} rounds): {summary(recv_times)}")
                    print(f"  get_event ({len(event_times)} rounds): {summary(event_times)}")
                    print(f"  enqueue   ({len(enqueue_times)} rounds): {summary(enqueue_times)}")
    finally:
        await drop_scratch_schema(args.url)


if __name__ == "__main__":
    asyncio.run(main())
