"""The keys a sharded queue's claim rounds visit: the database time of reading them.

    python benchmarks/queue_keys.py [--url URL] [--rows N] [--keys K] [--repeat R]

Builds the sharded schema in a scratch schema of the database at URL (plain PostgreSQL, or a
Citus database with its worker nodes, where the tables are distributed), fills it with N
ENQUEUED workflows of one queue over K keys (200,000 over 100 by default), plus as many
finished ones and a tenth on another queue, then prints, for the statement the claim loop
runs and for a plain ``SELECT DISTINCT`` (what it ran before, a sequential scan), the plan
(EXPLAIN ANALYZE) and the median execution time over R runs. The scratch schema is dropped
after.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import asyncpg
from common import DEFAULT_URL

from dbos_async import DBOSClient, migrate
from dbos_async._sysdb.statements import Query

SCHEMA = "dbos_bench_queue_keys"
QUEUE = "jobs"

FILL = """
INSERT INTO {schema}.workflow_status (shard_key, workflow_uuid, status, name, queue_name,
                                      inputs)
SELECT 'tenant-' || lpad((i % $2::int)::text, 4, '0'), 'wf-' || i,
       CASE WHEN i > $1::int AND i <= 2 * $1::int THEN 'SUCCESS' ELSE 'ENQUEUED' END, 'work',
       CASE WHEN i > 2 * $1::int THEN 'elsewhere' ELSE $3::text END, repeat('x', 200)
FROM generate_series(1, 2 * $1::int + $1::int / 10) AS i
"""

PLAIN_DISTINCT = """SELECT DISTINCT shard_key FROM {schema}.workflow_status
WHERE queue_name = $1 AND status = 'ENQUEUED'"""


async def measure(conn: asyncpg.Connection, query: Query, repeat: int) -> tuple[str, float]:
    """The plan of ``query`` and the median execution time PostgreSQL reports (ms)."""
    times = []
    plan = ""
    for _ in range(repeat):
        rows = await conn.fetch(f"EXPLAIN (ANALYZE, VERBOSE) {query.sql}", *query.params)
        plan = "\n".join(r[0] for r in rows)
        times.append(float(plan.rsplit("Execution Time: ", 1)[1].split()[0]))
    return plan, statistics.median(times)


def report(title: str, plan: str, db_ms: float, repeat: int) -> None:
    print(f"\n== {title}: {db_ms:.2f} ms (median of {repeat})")
    print(plan)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default=DEFAULT_URL)
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--keys", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=15)
    args = parser.parse_args()

    await migrate(args.url, schema_name=SCHEMA, sharding=True)
    conn = await asyncpg.connect(args.url)
    try:
        started = time.perf_counter()
        await conn.execute(FILL.format(schema=SCHEMA), args.rows, args.keys, QUEUE)
        await conn.execute(f"VACUUM ANALYZE {SCHEMA}.workflow_status")
        enqueued = await conn.fetchval(
            f"SELECT count(*) FROM {SCHEMA}.workflow_status "
            "WHERE queue_name = $1 AND status = 'ENQUEUED'", QUEUE)
        print(f"{enqueued:,} ENQUEUED workflows on {QUEUE!r} written in "
              f"{time.perf_counter() - started:.1f} s")
        async with DBOSClient(system_database_url=args.url, schema_name=SCHEMA,
                              sharding=True) as client:
            sysdb = client._peer().system_database
            keys = await sysdb.dequeue_scopes(QUEUE)
            print(f"{len(keys)} keys; on Citus: {sysdb.routes_single_tables}")
            after = sysdb.sql.dequeue_scopes(QUEUE, distributed=sysdb.routes_single_tables)
            before = Query(PLAIN_DISTINCT.format(schema=SCHEMA), (QUEUE,))
            # Before: the DISTINCT the claim loop ran, on the schema without the index it
            # reads now (dropped in a transaction rolled back after).
            undo = conn.transaction()
            await undo.start()
            await conn.execute(f"DROP INDEX {SCHEMA}.idx_workflow_status_queue_keys")
            report("before: a plain SELECT DISTINCT, without the index",
                   *await measure(conn, before, args.repeat), args.repeat)
            await undo.rollback()
            report("after: the claim loop's statement",
                   *await measure(conn, after, args.repeat), args.repeat)
    finally:
        await conn.execute(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE")
        await conn.close()


if __name__ == "__main__":
    asyncio.run(main())
