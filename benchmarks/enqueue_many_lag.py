"""How long ``DBOS.enqueue_many`` holds the event loop, and what memory it takes.

Enqueues N requests in one call on a scratch database while a ticker task sleeps 10 ms in a
loop and records its largest overshoot (the event loop's longest stall), then prints that
lag, the call's total time and the process's peak RSS::

    .venv/bin/python benchmarks/enqueue_many_lag.py --rows 100000
    .venv/bin/python benchmarks/enqueue_many_lag.py --profile     # where the time goes
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import pstats
import resource
import sys
import time
from typing import Any

from common import DEFAULT_URL, drop_database, recreate_database

from dbos_async import DBOS, EnqueueRequest

TICK = 0.010


class LagMeter:
    """A task sleeping ``TICK`` in a loop: its largest overshoot is the loop's longest stall."""

    def __init__(self) -> None:
        self.max_lag = 0.0
        self.ticks = 0
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        while True:
            before = time.perf_counter()
            await asyncio.sleep(TICK)
            self.max_lag = max(self.max_lag, time.perf_counter() - before - TICK)
            self.ticks += 1

    def __enter__(self) -> LagMeter:
        self._task = asyncio.get_running_loop().create_task(self._run())
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()


def peak_rss_mb() -> float:
    """The process's peak resident set size (KiB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1024 * 1024) if sys.platform == "darwin" else peak / 1024


async def main(url: str, rows: int, profile: bool, in_workflow: bool) -> None:
    db_url = await recreate_database(url, "bench_enqueue_many")
    try:
        dbos = DBOS(system_database_url=db_url, executor_id="bench", listen_queues=[])
        queue = dbos.queue("bench")

        @dbos.workflow(name="job")
        async def job(n: int, label: str) -> str:
            return f"{label}{n}"

        requests = [EnqueueRequest(job, (i, "row"), {}) for i in range(rows)]
        gate = asyncio.Event()

        @dbos.workflow(name="enqueuer")
        async def enqueuer() -> int:
            await gate.wait()  # started before the meter, the batch runs inside it
            return len(await dbos.enqueue_many(queue, requests))

        async with dbos:
            parent = await dbos.start_workflow(enqueuer) if in_workflow else None
            rss_before = peak_rss_mb()
            profiler = cProfile.Profile() if profile else None
            with LagMeter() as meter:
                await asyncio.sleep(TICK * 2)  # the ticker runs
                started = time.perf_counter()
                if profiler is not None:
                    profiler.enable()
                if parent is None:
                    results: list[Any] = await dbos.enqueue_many(queue, requests)
                else:
                    gate.set()
                    results = [await parent.get_result()]
                if profiler is not None:
                    profiler.disable()
                elapsed = time.perf_counter() - started
                ticks = meter.ticks
            assert (results == [rows]) if in_workflow else (len(results) == rows)
            print(f"rows: {rows}{' (from a workflow body)' if in_workflow else ''}")
            print(f"total time: {elapsed:.2f} s")
            print(f"max event-loop lag: {meter.max_lag * 1000:.0f} ms "
                  f"({ticks} ticks of {TICK * 1000:.0f} ms during the call)")
            print(f"peak RSS: {peak_rss_mb():.0f} MB (before the call: {rss_before:.0f} MB)")
            if profiler is not None:
                pstats.Stats(profiler).sort_stats("cumulative").print_stats(30)
    finally:
        await drop_database(url, "bench_enqueue_many")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default=DEFAULT_URL)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--profile", action="store_true", help="print a cProfile of the call")
    parser.add_argument("--in-workflow", action="store_true",
                        help="enqueue from a workflow body (one checkpoint of the results)")
    args = parser.parse_args()
    asyncio.run(main(args.url, args.rows, args.profile, args.in_workflow))
