"""Transactions: what a transactional step costs beside the same SQL run bare.

    python benchmarks/bench_transactions.py [--url URL] [--transactions N] [--concurrency C]

On two scratch databases (a system database and an application database), N single-row
INSERTs, C in flight, three ways:

1. bare: ``BEGIN; INSERT; COMMIT`` on an asyncpg pool of the application database;
2. a transaction on the system database: N/5 workflows of five ``@dbos.transaction()``
   steps, each running the same INSERT;
3. a transaction on an application database (``data_source=...``): the same.

Every statement each pool sends is counted (asyncpg query loggers): the user's INSERT, the
transaction control (BEGIN, COMMIT), the workflows' starts and finishes, and what is left,
the statements a transactional step adds; printed per transaction beside the throughput.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import asyncpg

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_dbos_async import QueryCounter, all_connections, settle_loggers
from common import DEFAULT_URL, drop_database, recreate_database, table

import dbos_async
from dbos_async import DBOS, transaction_connection
from dbos_async._sysdb.connection import keep_session

TABLE = "CREATE TABLE bench_orders (id bigserial PRIMARY KEY, v int NOT NULL)"
INSERT = "INSERT INTO bench_orders (v) VALUES ($1)"
STEPS = 5
ADDED_TARGET = 2
"""Transactions per workflow: the workflow's own start and finish are shared by them."""

_KINDS = [
    ("user SQL", re.compile(r"^\s*INSERT INTO bench_orders", re.IGNORECASE)),
    ("transaction control", re.compile(r"^\s*(BEGIN|COMMIT|ROLLBACK)\b", re.IGNORECASE)),
    ("workflow start", re.compile(r"INSERT\s+INTO\s+\S*workflow_status\b", re.IGNORECASE)),
    ("workflow finish", re.compile(r"UPDATE\s+\S*workflow_status\b|pg_notify", re.IGNORECASE)),
]


def kind(query: str) -> str:
    for name, pattern in _KINDS:
        if pattern.search(query):
            return name
    return "added by the step"


def kinds(counter: QueryCounter, phase: str) -> Counter[str]:
    found: Counter[str] = Counter()
    for text, n in counter.texts.get(phase, Counter()).items():
        found[kind(text)] += n
    return found


async def _counted(pool: asyncpg.Pool, counter: QueryCounter) -> None:
    held = await all_connections(pool)
    for conn in held:
        conn.add_query_logger(counter)
    for conn in held:
        await pool.release(conn)


async def _rate(count: int, concurrency: int, one: Any) -> float:
    gate = asyncio.Semaphore(concurrency)

    async def limited(i: int) -> None:
        async with gate:
            await one(i)

    started = time.perf_counter()
    await asyncio.gather(*(limited(i) for i in range(count)))
    return count / (time.perf_counter() - started)


async def bare(app_url: str, count: int, concurrency: int) -> dict[str, Any]:
    counter = QueryCounter()
    pool = await asyncpg.create_pool(app_url, min_size=concurrency, max_size=concurrency,
                                     reset=keep_session)
    try:
        await _counted(pool, counter)

        async def one(i: int) -> None:
            async with pool.acquire() as conn, conn.transaction(isolation="serializable"):
                await conn.execute(INSERT, i)

        await _rate(concurrency, concurrency, one)  # warm-up
        counter.phase = "measured"
        rate = await _rate(count, concurrency, one)
        await settle_loggers()
    finally:
        await pool.close()
    return {"rate": rate, "kinds": kinds(counter, "measured")}


async def transactional(system_url: str, app_url: str, on: str, count: int,
                        concurrency: int) -> dict[str, Any]:
    dbos = DBOS(system_database_url=system_url, pool_size=concurrency,
                application_version="bench", executor_id="bench")
    source = None if on == "system" else "app"
    if source is not None:
        dbos.data_source("app", app_url, pool_size=concurrency)

    @dbos.transaction(data_source=source, name="insert_order")
    async def insert_order(v: int) -> None:
        await transaction_connection().execute(INSERT, v)

    @dbos.workflow(name="orders")
    async def orders(v: int) -> None:
        for i in range(STEPS):
            await insert_order(v * STEPS + i)

    counter = QueryCounter()
    async with dbos:
        runtime = dbos._current_runtime
        pools = [runtime.system_database.pool]
        pools += [d.pool for d in runtime.application_databases.values()]
        for pool in pools:
            await _counted(pool, counter)
        await _rate(concurrency, concurrency, orders)  # warm-up
        counter.phase = "measured"
        rate = await _rate(count // STEPS, concurrency, orders) * STEPS
        await settle_loggers()
        counter.phase = "after"
    return {"rate": rate, "kinds": kinds(counter, "measured")}


async def run(url: str, prefix: str, count: int, concurrency: int) -> dict[str, Any]:
    system_url = await recreate_database(url, f"{prefix}_system")
    app_url = await recreate_database(url, f"{prefix}_app")
    conn = await asyncpg.connect(app_url)
    await conn.execute(TABLE)
    await conn.close()
    conn = await asyncpg.connect(system_url)
    await conn.execute(TABLE)
    await conn.close()
    try:
        return {
            "bare": await bare(app_url, count, concurrency),
            "system database": await transactional(system_url, app_url, "system", count,
                                                   concurrency),
            "application database": await transactional(system_url, app_url, "application",
                                                        count, concurrency),
            "transactions": count,
        }
    finally:
        await drop_database(url, f"{prefix}_system")
        await drop_database(url, f"{prefix}_app")


def added_per_transaction(results: dict[str, Any]) -> float:
    """The statements a transactional step adds beyond the user's SQL and the transaction
    control, per transaction, on whichever database adds more."""
    return max(results[n]["kinds"]["added by the step"] / results["transactions"]
               for n in ("system database", "application database"))


def report(results: dict[str, Any]) -> list[str]:
    """One line per way: throughput, its ratio to bare, statements per transaction."""
    count = results["transactions"]
    base = results["bare"]["rate"]
    rows = [("", "per second", "vs bare", "user SQL", "BEGIN/COMMIT", "start+finish",
             "added by the step")]
    for name in ("bare", "system database", "application database"):
        r = results[name]
        k = r["kinds"]
        rows.append((name, f"{r['rate']:,.0f}", f"{r['rate'] / base:.2f}",
                     f"{k['user SQL'] / count:.2f}", f"{k['transaction control'] / count:.2f}",
                     f"{(k['workflow start'] + k['workflow finish']) / count:.2f}",
                     f"{k['added by the step'] / count:.2f}"))
    lines = [f"Transactions: {count} single-row INSERTs, statements per transaction"]
    lines += table(rows, "lrrrrrr")
    added = added_per_transaction(results)
    lines.append(f"  statements a transactional step adds beyond the user's SQL (target <= "
                 f"{ADDED_TARGET}): {added:.2f} "
                 f"{'PASS' if round(added, 2) <= ADDED_TARGET else 'FAIL'}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default=DEFAULT_URL)
    parser.add_argument("--transactions", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--db-prefix", default="bench_txn")
    args = parser.parse_args()
    results = dbos_async.run(run(args.url, args.db_prefix, args.transactions,
                                 args.concurrency))
    print("\n".join(report(results)))


if __name__ == "__main__":
    main()
