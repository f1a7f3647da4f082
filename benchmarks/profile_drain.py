"""Where the client's CPU goes in a queue drain: a cProfile of one executor draining a
backlog.

The workload is ``bench_queues``'s drain in one process: an executor declares the queue
(worker concurrency C, polling interval 0.1 s) and registers ``zero_step`` (no step) and
``one_step`` (one trivial step); a separate connection enqueues N workflows through the
schema's SQL function ``dbos.enqueue_workflow`` in one transaction (a non-notifying
writer, as in the benchmark), and the drain runs under cProfile until all N are SUCCESS.
The report is ``profile_steps``'s: own time per claimed workflow by where the code lives,
then the top entries.

    .venv/bin/python benchmarks/profile_drain.py --workflow zero_step \\
        --out benchmarks/profiles/drain_zero_step.txt
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import asyncpg
from common import (
    DEFAULT_URL,
    UNFINISHED_SQL,
    CollectorTime,
    drop_database,
    recreate_database,
)
from profile_steps import add_report_options, publish, report
from queue_child import ENQUEUE_SQL, WORKFLOW, ZERO_STEP, dbos_async_workflows

import dbos_async
from dbos_async import DBOS

QUEUE = "profile_queue"


def _process_cpu() -> float:
    """CPU seconds of this process, every thread's (the enqueuing connection's share is
    the same before and after a change)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def profile(url: str, *, workflows: int, workflow: str, worker_concurrency: int,
                  pool_size: int) -> tuple[cProfile.Profile, float, float, CollectorTime]:
    """The profile of the drain, its wall seconds, the process's CPU seconds and the
    garbage collector's share of them (without cProfile: a second, unprofiled drain of the
    same size)."""
    dbos = DBOS(system_database_url=url, pool_size=pool_size, name="profile_drain",
                application_version="bench")
    dbos.queue(QUEUE, worker_concurrency=worker_concurrency, polling_interval=0.1)
    dbos_async_workflows(dbos, {})  # those of the queue benchmark's executors

    async def drain(conn: asyncpg.Connection, profiler: cProfile.Profile | None
                    ) -> tuple[float, float]:
        rows = [(workflow, QUEUE, json.dumps(i)) for i in range(workflows)]
        cpu, wall = _process_cpu(), time.perf_counter()
        if profiler is not None:
            profiler.enable()
        async with conn.transaction():
            await conn.executemany(ENQUEUE_SQL, rows)
        # Polled: the workflows were enqueued by SQL, no handle waits on them.
        while True:
            if not await conn.fetchval(UNFINISHED_SQL, QUEUE):
                break
            await asyncio.sleep(0.05)
        if profiler is not None:
            profiler.disable()
        return time.perf_counter() - wall, _process_cpu() - cpu

    profiler = cProfile.Profile(time.thread_time_ns, 1e-9)
    async with dbos:
        conn = await asyncpg.connect(url)
        try:
            await drain(conn, None)  # warm-up: connections, statement caches
            with CollectorTime() as collector:
                wall, cpu = await drain(conn, None)
            await drain(conn, profiler)
        finally:
            await conn.close()
    return profiler, wall, cpu, collector


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default=DEFAULT_URL)
    parser.add_argument("--workflows", "-n", type=int, default=10000)
    parser.add_argument("--workflow", choices=(ZERO_STEP, WORKFLOW), default=ZERO_STEP)
    parser.add_argument("--worker-concurrency", type=int, default=100)
    parser.add_argument("--pool-size", type=int, default=10)
    add_report_options(parser, "bench_profile_drain")
    args = parser.parse_args()
    url = await recreate_database(args.url, args.database)
    try:
        profiler, wall, cpu, collector = await profile(
            url, workflows=args.workflows, workflow=args.workflow,
            worker_concurrency=args.worker_concurrency, pool_size=args.pool_size)
    finally:
        await drop_database(args.url, args.database)
    publish(f"Unprofiled drain of {args.workflows} {args.workflow} workflows: "
            f"{args.workflows / wall:,.0f} wf/s wall, {cpu / args.workflows * 1e6:.0f} µs "
            f"of the process's CPU per workflow (the enqueue's included), of which "
            f"{collector.per(args.workflows)}\n"
            + report(profiler, args.workflows, args.limit,
                     f"claimed {args.workflow} workflows"), args.out)


if __name__ == "__main__":
    dbos_async.run(main())
