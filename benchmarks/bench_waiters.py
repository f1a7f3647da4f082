"""Many workflows waiting at once in one executor process.

W workflows each wait in ``recv`` (timeout 10 minutes) for one message. Measured, per system,
in a child process of its own (so its memory and threads are its own):

- how long starting all W takes (at most C starts in flight), and how long until every one
  has recorded its durable deadline and the pool has gone quiet (first reads done);
- what the process holds while they wait: resident memory above the launched, warmed-up
  baseline (per waiting workflow) and its thread count;
- the statements the executor's pool sends during an idle window while all W wait
  (client-side counts; the notification listener's own connection is not counted);
- from the first of W sends (C in flight, from the same process) to the last result.

``python benchmarks/bench_waiters.py --system dbos_async|dbos --url URL --waiters W`` prints
one line ``BENCH_RESULT {json}``; ``run.py`` runs both systems and prints the ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import asyncpg
from bench_dbos import MARKER, run_child
from common import drive

import dbos_async

SCRIPT = Path(__file__).resolve()
RECV_TIMEOUT = 600.0
DEADLINES_SQL = ("SELECT count(*) FROM dbos.operation_outputs "
                 "WHERE function_name = 'DBOS.sleep' AND workflow_uuid LIKE 'waiter-%'")


async def run_subprocess(system: str, url: str, *, waiters: int, concurrency: int,
                         pool_size: int, idle_seconds: float,
                         time_limit: float = 900.0) -> dict[str, Any]:
    """Run this file as a child process for ``system`` and return the result it prints."""
    return await run_child(SCRIPT, [
        "--system", system, "--url", url, "--waiters", str(waiters),
        "--concurrency", str(concurrency), "--pool-size", str(pool_size),
        "--idle-seconds", str(idle_seconds),
    ], time_limit)


def _process_status() -> dict[str, int]:
    """Resident memory (KiB) and thread count of this process, from /proc (Linux)."""
    fields: dict[str, int] = {}
    with open("/proc/self/status") as status:
        for line in status:
            name, _, value = line.partition(":")
            if name in ("VmRSS", "Threads"):
                fields[name] = int(value.split()[0])
    return {"rss_kib": fields["VmRSS"], "threads": fields["Threads"]}


class Adapter:
    """What the measurement needs from a system; ``statements`` counts pool statements."""

    statements: Callable[[], int]
    start: Callable[[str], Awaitable[Callable[[], Awaitable[Any]]]]
    send: Callable[[str, Any], Awaitable[None]]


async def measure(adapter: Adapter, url: str, waiters: int, concurrency: int,
                  idle_seconds: float) -> dict[str, Any]:
    # Warm-up: a few full round trips, so imports, caches and pool connections are in place.
    for i in range(10):
        result = await adapter.start(f"warm-{i}")
        await adapter.send(f"warm-{i}", i)
        if await result() != i:
            raise RuntimeError(f"warm-up workflow {i} returned a wrong value")
    baseline = _process_status()

    results: list[Callable[[], Awaitable[Any]]] = [_never] * waiters

    async def start(i: int) -> None:
        results[i] = await adapter.start(f"waiter-{i}")

    start_s = await drive(waiters, concurrency, start)
    conn = await asyncpg.connect(url)
    try:
        began = time.perf_counter()
        # Polls the database: the waits are recorded there by whichever system runs them.
        while await conn.fetchval(DEADLINES_SQL) < waiters:  # noqa: ASYNC110
            await asyncio.sleep(0.1)
        all_waiting_s = start_s + time.perf_counter() - began
    finally:
        await conn.close()
    quiet_s = await _quiesce(adapter)
    waiting = _process_status()
    before = adapter.statements()
    await asyncio.sleep(idle_seconds)
    idle_statements = adapter.statements() - before

    async def send(i: int) -> None:
        await adapter.send(f"waiter-{i}", i)

    async def collect() -> None:
        for i, result in enumerate(results):
            if await result() != i:
                raise RuntimeError(f"waiter {i} returned a wrong value")

    began = time.perf_counter()
    collector = asyncio.ensure_future(collect())
    await drive(waiters, concurrency, send)
    await collector
    wake_s = time.perf_counter() - began
    return {
        "waiters": waiters,
        "concurrency": concurrency,
        "start_s": start_s,
        "all_waiting_s": all_waiting_s,
        "quiet_after_s": quiet_s,
        "rss_baseline_kib": baseline["rss_kib"],
        "rss_waiting_kib": waiting["rss_kib"],
        "kib_per_waiter": (waiting["rss_kib"] - baseline["rss_kib"]) / waiters,
        "threads_baseline": baseline["threads"],
        "threads_waiting": waiting["threads"],
        "python_threads_waiting": threading.active_count(),
        "idle_seconds": idle_seconds,
        "idle_statements": idle_statements,
        "idle_statements_per_s": idle_statements / idle_seconds,
        "idle_statements_per_5s": 5 * idle_statements / idle_seconds,
        "send_to_last_result_s": wake_s,
        "woken_per_s": waiters / wake_s,
    }


async def _quiesce(adapter: Adapter, quiet_per_s: int = 20, patience: float = 120.0) -> float:
    """Wait until the pool sends at most ``quiet_per_s`` statements in a second: the waiters'
    first reads of their (empty) mailboxes are done. Returns the seconds it took."""
    began = time.perf_counter()
    while time.perf_counter() - began < patience:
        before = adapter.statements()
        await asyncio.sleep(1.0)
        if adapter.statements() - before <= quiet_per_s:
            break
    return time.perf_counter() - began


async def _never() -> Any:
    raise RuntimeError("a waiter was never started")


# ---- dbos_async ----


async def _dbos_async(args: argparse.Namespace) -> dict[str, Any]:
    from bench_dbos_async import QueryCounter

    from dbos_async import DBOS, SetWorkflowID

    dbos = DBOS(system_database_url=args.url, pool_size=args.pool_size, name="bench_waiters",
                application_version="bench")

    @dbos.workflow()
    async def waiter() -> Any:
        return await dbos.recv(timeout=RECV_TIMEOUT)

    counter = QueryCounter()
    adapter = Adapter()

    async def start(workflow_id: str) -> Callable[[], Awaitable[Any]]:
        with SetWorkflowID(workflow_id):
            handle = await dbos.start_workflow(waiter)
        return handle.get_result

    async def send(workflow_id: str, message: Any) -> None:
        await dbos.send(workflow_id, message)

    adapter.start, adapter.send = start, send
    adapter.statements = lambda: sum(counter.texts.get(counter.phase, {}).values())
    async with dbos:
        pool = dbos._system_database.pool
        # Every connection the pool may open, opened now, so each one is counted.
        connections = [await pool.acquire() for _ in range(pool.get_max_size())]
        for conn in connections:
            conn.add_query_logger(counter)
            await pool.release(conn)
        counter.phase = "run"
        result = await measure(adapter, args.url, args.waiters, args.concurrency,
                               args.idle_seconds)
    import dbos_async

    return {"system": "dbos_async", "version": dbos_async.__version__, **result}


# ---- the dbos package ----


def _dbos(args: argparse.Namespace) -> dict[str, Any]:
    from bench_dbos import _Counts, _version, new_dbos
    from dbos import DBOS, SetWorkflowID
    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    counts = _Counts()
    counts.active = True
    event.listen(Engine, "before_cursor_execute", counts.hook("statement"))
    new_dbos("bench_waiters_dbos", args.url, args.pool_size)

    @DBOS.workflow()
    async def waiter() -> Any:
        return await DBOS.recv_async(timeout_seconds=RECV_TIMEOUT)

    adapter = Adapter()

    async def start(workflow_id: str) -> Callable[[], Awaitable[Any]]:
        with SetWorkflowID(workflow_id):
            handle = await DBOS.start_workflow_async(waiter)
        return handle.get_result

    async def send(workflow_id: str, message: Any) -> None:
        await DBOS.send_async(workflow_id, message)

    adapter.start, adapter.send = start, send
    adapter.statements = lambda: sum(counts.counts.values())
    DBOS.launch()
    try:
        result = asyncio.run(measure(adapter, args.url, args.waiters, args.concurrency,
                                     args.idle_seconds))
    finally:
        DBOS.destroy()
    return {"system": "dbos", "version": _version("dbos"), **result}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--system", choices=("dbos_async", "dbos"), required=True)
    parser.add_argument("--url", required=True)
    parser.add_argument("--waiters", type=int, required=True)
    parser.add_argument("--concurrency", type=int, default=100)
    parser.add_argument("--pool-size", type=int, default=10)
    parser.add_argument("--idle-seconds", type=float, default=10.0)
    args = parser.parse_args()
    result = (dbos_async.run(_dbos_async(args)) if args.system == "dbos_async"
              else _dbos(args))
    print(MARKER + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
