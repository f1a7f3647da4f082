"""dbos_async latencies: the operations of ``latency.py``, measured two ways.

- **same executor**: the waiter (the sender, ``get_event``, ``read_stream``) uses the DBOS
  instance that runs the workflows. dbos_async wakes this process's own waiters directly,
  without a round trip through PostgreSQL's NOTIFY.
- **other executor**: a second DBOS instance on the same system database in the same process
  (another executor ID, its own pool and LISTEN connection) sends, waits in ``get_event`` and
  reads the stream, so every wake-up travels through LISTEN/NOTIFY (the trigger on
  ``notifications`` for messages; the coalescing notifier, ``notification_coalesce_ms``, for
  events and streams), as between two processes. ``start_workflow -> get_result`` is not
  measured this way (the starting instance runs the workflow).

Then the round trips of a workflow alone: L one-step workflows, one at a time (start, then
its result), with the query logger of ``bench_dbos_async`` on every connection of the
runner's pool; statements per workflow and per step as in the throughput section.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import latency
from bench_dbos_async import QueryCounter, all_connections, settle_loggers, statement_figures

from dbos_async import DBOS


class Adapter:
    def __init__(self, runner: DBOS, client: DBOS, workflows: dict[str, Any],
                 rows: latency.RowInserter) -> None:
        self.runner = runner
        self.client = client
        self.workflows = workflows
        self.rows = rows

    async def start(self, workflow: str, *args: Any) -> latency.Started:
        handle = await self.runner.start_workflow(self.workflows[workflow], *args)
        return handle.workflow_id, handle.get_result

    async def send(self, destination_id: str, message: Any, topic: str) -> None:
        await self.client.send(destination_id, message, topic)

    async def get_event(self, workflow_id: str, key: str, wait_s: float) -> Any:
        return await self.client.get_event(workflow_id, key, timeout=wait_s)

    def read_stream(self, workflow_id: str, key: str) -> AsyncIterator[Any]:
        return self.client.read_stream(workflow_id, key)

    async def insert_row(self, i: int) -> None:
        await self.rows.insert(i)


def _workflows(dbos: DBOS) -> dict[str, Any]:
    @dbos.workflow()
    async def receiver(topic: str, wait_s: float) -> list[Any]:
        before = time.perf_counter_ns()
        message = await dbos.recv(topic, timeout=wait_s)
        return [before, time.perf_counter_ns(), message]

    @dbos.workflow()
    async def publisher(key: str, delay: float) -> int:
        await asyncio.sleep(delay)
        at = time.perf_counter_ns()
        await dbos.set_event(key, at)
        return at

    @dbos.workflow()
    async def writer(key: str, count: int, gap: float) -> int:
        for _ in range(count):
            await asyncio.sleep(gap)
            await dbos.write_stream(key, time.perf_counter_ns())
        await dbos.close_stream(key)
        return count

    @dbos.step()
    async def add_one(x: int) -> int:
        return x + 1

    @dbos.workflow()
    async def one_step(x: int) -> int:
        return await add_one(x)

    return {"receiver": receiver, "publisher": publisher, "writer": writer,
            "one_step": one_step}


async def run(url: str, *, samples: int, other_samples: int, warmup: int,
              pool_size: int) -> dict[str, Any]:
    runner = DBOS(system_database_url=url, pool_size=pool_size, name="bench_latency",
                  executor_id="bench-latency-runner", application_version="bench")
    client = DBOS(system_database_url=url, pool_size=pool_size, name="bench_latency",
                  executor_id="bench-latency-client", application_version="bench")
    workflows = _workflows(runner)
    config = runner.config
    result: dict[str, Any] = {
        "samples": samples,
        "other_executor_samples": other_samples,
        "warmup": warmup,
        "settle_s": latency.SETTLE,
        "notification_coalesce_ms": config.notification_coalesce_ms,
        "use_listen_notify": config.use_listen_notify,
    }
    rows = latency.RowInserter(url)
    async with runner, client:
        try:
            result["same_executor"] = await latency.measure(
                Adapter(runner, runner, workflows, rows), samples, warmup)
            result["other_executor"] = await latency.measure(
                Adapter(runner, client, workflows, rows), other_samples, warmup,
                operations=("send_recv", "event", "stream"))
        finally:
            await rows.close()
        result["alone"] = await alone(runner, workflows["one_step"], LONE_WORKFLOWS)
    return result


LONE_WORKFLOWS = 50


async def alone(runner: DBOS, one_step: Any, count: int) -> dict[str, Any]:
    """Statements of ``count`` one-step workflows run one at a time."""
    counter = QueryCounter(phase="run")
    pool = runner._system_database.pool
    conns = await all_connections(pool)
    for conn in conns:
        conn.add_query_logger(counter)
        await pool.release(conn)
    for i in range(count):
        handle = await runner.start_workflow(one_step, i)
        if await handle.get_result() != i + 1:
            raise RuntimeError(f"lone workflow {i}: wrong result")
    await settle_loggers()
    conns = await all_connections(pool)
    for conn in conns:
        conn.remove_query_logger(counter)
        await pool.release(conn)
    return {"workflows": count, "steps_per_workflow": 1,
            "statements": statement_figures(counter.by_kind("run"), count, count)}
