"""The queue peer: pgqueuer on the same server, in a child process of its own.

    python benchmarks/bench_pgqueuer.py --url URL --jobs 10000 --batch-sizes 10,100

On a fresh scratch database: ``Queries.install()``, then for each batch size, J trivial jobs
(an entrypoint that returns at once) enqueued in one batched call (``Queries.enqueue`` with
lists: one statement), then drained by a ``QueueManager`` in drain mode at that batch size
(``run(batch_size=..., mode=drain)``: it returns once the queue is empty and every job is
logged). Figures per batch size:

- the enqueue's seconds;
- jobs/s = J / (first job's start to the return of ``run``), so the drain includes writing
  the last completions;
- commits per job: transactions ended (``xact_commit + xact_rollback``) in the database over
  the drain, read as for the other systems (``common.read_transactions``) on the manager's
  connection and the reader's, the readings' own taken off.

pgqueuer keeps module-level state (settings, a tracer), so it runs here rather than in the
benchmark's process. It runs on the loop ``dbos_async.run`` picks, as pgqueuer's own command
line does (uvloop when installed). Prints ``BENCH_RESULT {json}``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from importlib.metadata import version
from pathlib import Path
from typing import Any

import asyncpg
from common import MARKER, read_transactions, transactions_between

import dbos_async

SCRIPT = Path(__file__).resolve()
ENTRYPOINT = "trivial"


async def drain_once(url: str, jobs: int, batch_size: int) -> dict[str, Any]:
    from pgqueuer import QueueManager
    from pgqueuer.db import AsyncpgDriver
    from pgqueuer.models import Job
    from pgqueuer.queries import Queries
    from pgqueuer.types import QueueExecutionMode

    reader = await asyncpg.connect(url)
    worker = await asyncpg.connect(url)
    try:
        began = time.perf_counter()
        await Queries(AsyncpgDriver(reader)).enqueue(
            [ENTRYPOINT] * jobs, [str(i).encode() for i in range(jobs)], [0] * jobs)
        enqueue_seconds = time.perf_counter() - began

        manager = QueueManager(Queries(AsyncpgDriver(worker)))
        first_start: list[float] = []
        done = 0

        @manager.entrypoint(ENTRYPOINT)
        async def trivial(job: Job) -> None:
            nonlocal done
            if not first_start:
                first_start.append(time.perf_counter())
            done += 1

        before = await read_transactions([reader, worker])
        await manager.run(batch_size=batch_size, mode=QueueExecutionMode.drain)
        ended = time.perf_counter()
        after = await read_transactions([reader, worker])
        left = await reader.fetchval("SELECT count(*) FROM pgqueuer")
    finally:
        await worker.close()
        await reader.close()
    if done != jobs or left:
        raise RuntimeError(f"pgqueuer ran {done} of {jobs} jobs, {left} left in the queue")
    seconds = ended - first_start[0]
    transactions = transactions_between(before, after)
    return {"batch_size": batch_size, "jobs": jobs, "enqueue_seconds": enqueue_seconds,
            "enqueue_per_s": jobs / enqueue_seconds, "drain_seconds": seconds,
            "jobs_per_s": jobs / seconds, "transactions": transactions,
            "transactions_per_job": transactions / jobs}


async def main(args: argparse.Namespace) -> dict[str, Any]:
    from pgqueuer.db import AsyncpgDriver
    from pgqueuer.queries import Queries

    conn = await asyncpg.connect(args.url)
    try:
        await Queries(AsyncpgDriver(conn)).install()
    finally:
        await conn.close()
    loop = type(asyncio.get_running_loop())
    runs = [await drain_once(args.url, args.jobs, size) for size in args.batch_sizes]
    return {"pgqueuer_version": version("pgqueuer"),
            "event_loop": f"{loop.__module__}.{loop.__qualname__}",
            "runs": {str(r["batch_size"]): r for r in runs}}


async def run_subprocess(url: str, *, jobs: int, batch_sizes: list[int],
                         time_limit: float = 300.0) -> dict[str, Any]:
    """Run this file as a child process and return the result it prints."""
    from bench_dbos import run_child

    return await run_child(SCRIPT, ["--url", url, "--jobs", str(jobs), "--batch-sizes",
                                    ",".join(str(size) for size in batch_sizes)], time_limit)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", required=True)
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--batch-sizes", type=lambda text: [int(x) for x in text.split(",")],
                        default=[10, 100])
    print(MARKER + json.dumps(dbos_async.run(main(parser.parse_args()))), flush=True)
