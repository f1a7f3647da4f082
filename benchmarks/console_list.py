"""The console's list page on a large system database: the database time of its query.

    python benchmarks/console_list.py [--url URL] [--workflows N] [--repeat R]

Fills a scratch database with N workflow rows (100,000 by default; statuses, names and
queues mixed, one created per second up to now: 3,600 within the queue page's hour), then,
for what the console reads most (the newest page; a page filtered by status; the live
status refresh of one page's IDs; the queue page's per-minute activity and oldest waiting
workflows), prints the plan PostgreSQL chooses (EXPLAIN ANALYZE), the median execution
time PostgreSQL reports over R runs, and the median time of the whole call through a
client (pool, transaction, parameters, decoding). The statements are the ones the console
runs, built by the system database's statement builders.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from typing import Any

import asyncpg
from common import DEFAULT_URL, drop_database, recreate_database

from dbos_async import DBOSClient, migrate
from dbos_async._sysdb.statements import Query, WorkflowFilter
from dbos_async.console.app import PAGE_SIZE

DATABASE = "dbos_async_bench_console"

FILL = """
INSERT INTO dbos.workflow_status (workflow_uuid, status, name, queue_name, executor_id,
    created_at, updated_at, started_at_epoch_ms, completed_at, recovery_attempts,
    application_version, serialization)
SELECT 'wf-' || lpad(i::text, 7, '0'), status,
       (ARRAY['checkout','refund','nightly_report','ship_item'])[1 + i % 4],
       CASE WHEN i % 3 = 0 THEN 'jobs' END, 'bench', $1::bigint + i * 1000, $1::bigint + i * 1000,
       CASE WHEN status <> 'ENQUEUED' THEN $1::bigint + i * 1000 END,
       CASE WHEN status NOT IN ('ENQUEUED', 'PENDING') THEN $1::bigint + i * 1000 + 5 END, 0,
       'v1', 'portable_json'
FROM generate_series(1, $2::int) AS i,
     LATERAL (SELECT (ARRAY['SUCCESS','SUCCESS','SUCCESS','SUCCESS','ERROR','PENDING',
                            'ENQUEUED','CANCELLED'])[1 + i % 8] AS status) s
"""


async def explain(conn: asyncpg.Connection, query: Query, repeat: int) -> tuple[str, float]:
    """The plan of ``query`` and the median execution time PostgreSQL reports (ms)."""
    times = []
    plan = ""
    for _ in range(repeat):
        rows = await conn.fetch(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {query.sql}",
                                *query.params)
        document = json.loads(rows[0][0])[0]
        times.append(document["Execution Time"])
    rows = await conn.fetch(f"EXPLAIN (ANALYZE, BUFFERS) {query.sql}", *query.params)
    plan = "\n".join(r[0] for r in rows)
    return plan, statistics.median(times)


async def timed_call(call: Any, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        await call()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default=DEFAULT_URL)
    parser.add_argument("--workflows", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()

    url = await recreate_database(args.url, DATABASE)
    try:
        await migrate(url)
        conn = await asyncpg.connect(url)
        try:
            started = time.perf_counter()
            base_ms = int(time.time() * 1000) - args.workflows * 1000
            await conn.execute(FILL, base_ms, args.workflows)
            await conn.execute("ANALYZE dbos.workflow_status")
            print(f"{args.workflows:,} workflows written in "
                  f"{time.perf_counter() - started:.1f} s")
            async with DBOSClient(url) as client:
                sql = client._peer().system_database.sql
                page = {"limit": PAGE_SIZE + 1, "offset": 0, "sort_desc": True,
                        "load_input": False, "load_output": False}
                newest = await client.list_workflows(**page)
                ids = [w.workflow_id for w in newest[:PAGE_SIZE]]
                cases: list[tuple[str, WorkflowFilter | Query, Any]] = [
                    ("newest page", WorkflowFilter(**page),
                     lambda: client.list_workflows(**page)),
                    ("page of ERROR workflows", WorkflowFilter(statuses=["ERROR"], **page),
                     lambda: client.list_workflows(status="ERROR", **page)),
                    ("live refresh of a page's statuses",
                     WorkflowFilter(workflow_ids=ids, load_input=False, load_output=False),
                     lambda: client.list_workflows(workflow_ids=ids, load_input=False,
                                                   load_output=False)),
                ]
                since = int(time.time() * 1000) - 3_600_000
                cases += [
                    ("queue page: starts and completions per minute",
                     sql.queue_activity(since), lambda: client.queue_activity(60)),
                    ("queue page: oldest waiting workflows", sql.oldest_waiting(),
                     client.oldest_waiting_workflows),
                ]
                for title, statement, call in cases:
                    query = (sql.list_workflows(statement)
                             if isinstance(statement, WorkflowFilter) else statement)
                    plan, db_ms = await explain(conn, query, args.repeat)
                    call_ms = await timed_call(call, args.repeat)
                    uses_index = "Index" in plan
                    print(f"\n== {title}: database {db_ms:.2f} ms (median of "
                          f"{args.repeat}), whole call {call_ms:.2f} ms; "
                          f"index used: {uses_index}")
                    print(plan)
                    if not uses_index:
                        raise SystemExit(f"{title}: the plan uses no index")
        finally:
            await conn.close()
    finally:
        await drop_database(args.url, DATABASE)


if __name__ == "__main__":
    asyncio.run(main())
