"""Child processes of the queue benchmark (``bench_queues.py``), one role each.

    python benchmarks/queue_child.py enqueue --url URL --queue Q --count N
    python benchmarks/queue_child.py serve --system dbos_async|dbos --url URL --queue Q ...
    python benchmarks/queue_child.py latency --system dbos_async|dbos --url URL ...

- ``enqueue``: the separate client. Plain asyncpg, no DBOS package imported: N calls of the
  schema's SQL function ``dbos.enqueue_workflow('one_step', Q, ARRAY[i::json])``, pipelined
  (``executemany``) in ONE transaction, so the whole backlog becomes visible at one commit.
  Prints ``BENCH_RESULT {"seconds": ..., "enqueued": N}``.
- ``serve``: an executor of ``system`` that declares queue Q (``worker_concurrency``,
  ``polling_interval``) and registers ``one_step`` (a workflow of one trivial step) and
  ``zero_step`` (a workflow of none), prints ``READY`` once it dequeues, and serves until
  EOF or a line other than ``flush`` arrives on stdin. On ``flush`` (dbos_async) it makes
  every connection of its pool publish its statistics (``pg_stat_force_next_flush()``) and
  answers ``FLUSHED k``, k being the statements that took.
- ``latency``: an executor that also enqueues, one workflow at a time, through the SQL
  function on its own asyncpg connection, so both ends share ``time.time_ns()``: the sample
  is from the enqueue statement's return (its commit is done) to the first line of the
  ``stamp`` workflow's body. Prints ``BENCH_RESULT {json}``.

The ``dbos`` package runs only in these children (it is a process singleton with threads);
the parent strips every ``DBOS_*``, ``DBOS__*`` and ``OTEL_*`` variable from their
environment, and the children run with no OTLP export and no Conductor.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import asyncpg

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import MARKER, flush_statistics

import dbos_async

READY = "READY"
WORKFLOW = "one_step"
ZERO_STEP = "zero_step"
STAMP = "stamp"
ENQUEUE_SQL = "SELECT dbos.enqueue_workflow($1, $2, ARRAY[$3::json])"
# What dbos_async's own enqueue (and its client) sends with the insert: a wake-up for the
# queue's dispatchers. The `dbos` package does not listen on this channel.
ENQUEUE_NOTIFY_SQL = ("SELECT dbos.enqueue_workflow($1, $2, ARRAY[$3::json]), "
                      "pg_notify('dbos_enqueue_channel', $2)")


# ---- enqueue: the separate client ----

async def enqueue(args: argparse.Namespace) -> dict[str, Any]:
    conn = await asyncpg.connect(args.url)
    try:
        rows = [(args.workflow, args.queue, json.dumps(i)) for i in range(args.count)]
        started = time.perf_counter()
        async with conn.transaction():
            await conn.executemany(ENQUEUE_SQL, rows)
        committed_at_ms = time.time() * 1000
        seconds = time.perf_counter() - started
    finally:
        await conn.close()
    return {"enqueued": args.count, "seconds": seconds, "per_s": args.count / seconds,
            "committed_at_ms": committed_at_ms}


# ---- latency loop, shared by both systems ----

async def latency_loop(url: str, queue: str, starts: dict[str, int], *, samples: int,
                       warmup: int, notify: bool, settle: float, jitter: float,
                       give_up_s: float = 15.0) -> dict[str, Any]:
    """One enqueue at a time; the sample is stamp's body start minus the enqueue's return.

    Between samples: ``settle`` seconds plus a uniform random pause of up to ``jitter``
    (the polling interval, for a poll-bound queue), so enqueues land at random phases of
    the dispatcher's poll rather than always just after its previous wake-up.
    """
    conn = await asyncpg.connect(url)
    sql = ENQUEUE_NOTIFY_SQL if notify else ENQUEUE_SQL
    values: list[float] = []
    statement_ms: list[float] = []
    lost = 0
    began = time.perf_counter()
    try:
        for i in range(warmup + samples):
            before = time.time_ns()
            row = await conn.fetchrow(sql, STAMP, queue, json.dumps(i))
            after = time.time_ns()
            assert row is not None
            workflow_id = row[0]
            # Polled, not awaited on an event: in the `dbos` child the workflow runs on
            # another thread's event loop. The sample's timestamps are taken where they
            # happen; this only paces the loop.
            deadline = time.monotonic() + give_up_s
            while workflow_id not in starts and time.monotonic() < deadline:  # noqa: ASYNC110
                await asyncio.sleep(0.001)
            if workflow_id not in starts:
                lost += 1
                continue
            if i >= warmup:
                values.append((starts[workflow_id] - after) / 1e6)
                statement_ms.append((after - before) / 1e6)
            # Let it finish before the next one, then a random phase.
            await asyncio.sleep(settle + random.uniform(0.0, jitter))
    finally:
        await conn.close()
    return figures(values, statement_ms, lost, time.perf_counter() - began, notify)


def figures(values: list[float], statement_ms: list[float], lost: int, seconds: float,
            notify: bool) -> dict[str, Any]:
    out: dict[str, Any] = {"samples": len(values), "lost": lost, "seconds": seconds,
                           "notify": notify}
    if values:
        ordered = sorted(values)
        out.update({
            "median_ms": ordered[len(ordered) // 2] if len(ordered) % 2
            else (ordered[len(ordered) // 2 - 1] + ordered[len(ordered) // 2]) / 2,
            # Nearest rank.
            "p99_ms": ordered[max(0, -(-99 * len(ordered) // 100) - 1)],
            "min_ms": ordered[0],
            "max_ms": ordered[-1],
            "mean_ms": sum(ordered) / len(ordered),
            "enqueue_statement_median_ms": sorted(statement_ms)[len(statement_ms) // 2],
        })
    return out


# ---- dbos_async ----

def _dbos_async_instance(args: argparse.Namespace) -> Any:
    from dbos_async import DBOS

    logging.getLogger("dbos_async").setLevel(logging.WARNING)
    return DBOS(system_database_url=args.url, pool_size=args.pool_size,
                name="bench_queues_dbos_async", application_version="bench",
                executor_id=args.executor_id)


def dbos_async_workflows(dbos: Any, starts: dict[str, int]) -> None:
    from dbos_async import DBOS
    from dbos_async._executor.context import current_workflow

    assert isinstance(dbos, DBOS)

    @dbos.step(name="add_one")
    async def add_one(x: int) -> int:
        return x + 1

    @dbos.workflow(name=WORKFLOW)
    async def one_step(x: int) -> int:
        return await add_one(x)

    @dbos.workflow(name=ZERO_STEP)
    async def zero_step(x: int) -> int:
        return x

    @dbos.workflow(name=STAMP)
    async def stamp(x: int) -> int:
        at = time.time_ns()
        ctx = current_workflow()
        assert ctx is not None
        starts[ctx.workflow_id] = at
        await add_one(x)
        return at


async def serve_dbos_async(args: argparse.Namespace) -> None:
    dbos = _dbos_async_instance(args)
    dbos.queue(args.queue, worker_concurrency=args.worker_concurrency,
               polling_interval=args.polling_interval)
    dbos_async_workflows(dbos, {})
    loop = asyncio.get_running_loop()
    async with dbos:
        print(READY, flush=True)
        while (await loop.run_in_executor(None, sys.stdin.readline)).strip() == "flush":
            pool = dbos._system_database.pool
            conns = [await pool.acquire() for _ in range(pool.get_size())]
            try:
                await flush_statistics(conns)
            finally:
                for conn in conns:
                    await pool.release(conn)
            print(f"FLUSHED {len(conns)}", flush=True)


async def latency_dbos_async(args: argparse.Namespace) -> dict[str, Any]:
    dbos = _dbos_async_instance(args)
    starts: dict[str, int] = {}
    # Notified: default polling interval (1 s), woken by the NOTIFY sent with the enqueue.
    dbos.queue("lat_notify")
    dbos.queue("lat_equal", polling_interval=args.polling_interval)
    dbos_async_workflows(dbos, starts)
    async with dbos:
        run = _runner(args, starts)
        return {
            "notify": await run("lat_notify", True, args.samples, 1.0),
            "equal_poll": await run("lat_equal", False, args.poll_samples,
                                    args.polling_interval),
            "polling_interval": args.polling_interval,
        }


# ---- the dbos package ----

def _dbos_instance(args: argparse.Namespace) -> Any:
    from bench_dbos import new_dbos

    return new_dbos("bench_queues_dbos", args.url, args.pool_size,
                    executor_id=args.executor_id)


def _dbos_workflows(starts: dict[str, int]) -> None:
    from dbos import DBOS

    @DBOS.step(name="add_one")
    async def add_one(x: int) -> int:
        return x + 1

    @DBOS.workflow(name=WORKFLOW)
    async def one_step(x: int) -> int:
        return await add_one(x)

    @DBOS.workflow(name=STAMP)
    async def stamp(x: int) -> int:
        at = time.time_ns()
        starts[DBOS.workflow_id or ""] = at
        await add_one(x)
        return at


def _checked_extras(instance: Any) -> dict[str, Any]:
    from dbos._tracer import dbos_tracer

    return {"conductor": instance.conductor_websocket is not None,
            "otlp": not dbos_tracer.disable_otlp}


def _dbos_queues(*queues: tuple[str, int | None, float | None]) -> None:
    """Register queues with the launched `dbos` package (3.4 stores them in the ``queues``
    table; its queue manager starts a worker thread per queue within a second): wait for
    those threads, so the executor is dequeueing when this returns."""
    import threading

    from dbos import DBOS

    for name, worker_concurrency, poll in queues:
        options: dict[str, Any] = {"worker_concurrency": worker_concurrency,
                                   "on_conflict": "always_update"}
        if poll is not None:
            options["polling_interval_sec"] = poll
        DBOS.register_queue(name, **options)
    wanted = {f"queue-worker-{name}" for name, _, _ in queues}
    deadline = time.monotonic() + 10.0
    while not wanted <= {t.name for t in threading.enumerate()}:
        if time.monotonic() > deadline:
            raise RuntimeError(f"dbos did not start the queue workers {sorted(wanted)}")
        time.sleep(0.05)


def serve_dbos(args: argparse.Namespace) -> None:
    from dbos import DBOS

    instance = _dbos_instance(args)
    _dbos_workflows({})
    DBOS.launch()
    try:
        _dbos_queues((args.queue, args.worker_concurrency, args.polling_interval))
        extras = _checked_extras(instance)
        if extras["conductor"] or extras["otlp"]:
            raise RuntimeError(f"dbos child is not isolated: {extras}")
        print(READY, flush=True)
        sys.stdin.readline()
    finally:
        DBOS.destroy()


def latency_dbos(args: argparse.Namespace) -> dict[str, Any]:
    from dbos import DBOS
    from dbos._queue import DEFAULT_QUEUE_POLLING_INTERVAL_SEC

    instance = _dbos_instance(args)
    starts: dict[str, int] = {}
    _dbos_workflows(starts)
    DBOS.launch()
    try:
        # lat_default keeps the package's default polling interval.
        _dbos_queues(("lat_equal", None, args.polling_interval), ("lat_default", None, None))
        extras = _checked_extras(instance)

        async def main() -> dict[str, Any]:
            run = _runner(args, starts)
            return {
                "equal_poll": await run("lat_equal", False, args.poll_samples,
                                        args.polling_interval),
                "default_poll": await run("lat_default", False, args.default_samples,
                                          DEFAULT_QUEUE_POLLING_INTERVAL_SEC),
            }

        out = asyncio.run(main())
    finally:
        DBOS.destroy()
    from bench_dbos import _version

    return {**out, **extras, "dbos_version": _version("dbos"),
            "polling_interval": args.polling_interval,
            "default_polling_interval": DEFAULT_QUEUE_POLLING_INTERVAL_SEC}


def _runner(args: argparse.Namespace, starts: dict[str, int]) -> Callable[..., Any]:
    async def run(queue: str, notify: bool, samples: int, poll: float) -> dict[str, Any]:
        result = await latency_loop(args.url, queue, starts, samples=samples,
                                    warmup=args.warmup, notify=notify, settle=args.settle,
                                    jitter=0.0 if notify else poll)
        result["polling_interval"] = poll
        return result
    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("role", choices=("enqueue", "serve", "latency"))
    parser.add_argument("--system", choices=("dbos_async", "dbos"), default="dbos_async")
    parser.add_argument("--url", required=True)
    parser.add_argument("--queue", default="bench_queue")
    parser.add_argument("--count", type=int, default=0)
    parser.add_argument("--workflow", choices=(WORKFLOW, ZERO_STEP), default=WORKFLOW)
    parser.add_argument("--executor-id", default="bench-executor")
    parser.add_argument("--pool-size", type=int, default=10)
    parser.add_argument("--worker-concurrency", type=int, default=None)
    parser.add_argument("--polling-interval", type=float, default=1.0)
    parser.add_argument("--samples", type=int, default=100)
    parser.add_argument("--poll-samples", type=int, default=30)
    parser.add_argument("--default-samples", type=int, default=12)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--settle", type=float, default=0.02)
    args = parser.parse_args()
    result: dict[str, Any] | None = None
    if args.role == "enqueue":
        result = asyncio.run(enqueue(args))
    elif args.role == "serve":
        if args.system == "dbos_async":
            dbos_async.run(serve_dbos_async(args))
        else:
            serve_dbos(args)
    elif args.system == "dbos_async":
        result = dbos_async.run(latency_dbos_async(args))
    else:
        result = latency_dbos(args)
    if result is not None:
        print(MARKER + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
