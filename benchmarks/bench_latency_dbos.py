"""The peer's latencies: the operations of ``latency.py`` on the `dbos` package's async API.

Like ``bench_dbos.py`` this runs in a child process (``dbos`` is a process singleton with
threads; the parent never imports it), without any ``DBOS_*``, ``DBOS__*`` or ``OTEL_*``
environment variable, with no OTLP export and no Conductor, and prints one line
``BENCH_RESULT {json}``. Both sides of every measurement (the workflow and the waiter) run in
this child, so their ``perf_counter_ns`` timestamps share one clock. The package's own
defaults are kept: LISTEN/NOTIFY on, ``notification_coalesce_sec`` 0.01,
``notification_listener_polling_interval_sec`` 1.0 (its polling fallback).

    python benchmarks/bench_latency_dbos.py --url URL --samples 20 --warmup 5
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from bench_dbos import MARKER, new_dbos, run_child

SCRIPT = Path(__file__).resolve()


async def run_subprocess(url: str, *, samples: int, warmup: int, pool_size: int,
                         time_limit: float = 300.0) -> dict[str, Any]:
    """Run this file as a child process and return the result it prints."""
    return await run_child(SCRIPT, [
        "--url", url, "--samples", str(samples), "--warmup", str(warmup),
        "--pool-size", str(pool_size),
    ], time_limit)


def _child(args: argparse.Namespace) -> dict[str, Any]:
    import latency
    from dbos import DBOS

    instance = new_dbos("bench_latency_dbos", args.url, args.pool_size)

    @DBOS.workflow()
    async def receiver(topic: str, wait_s: float) -> list[Any]:
        before = time.perf_counter_ns()
        message = await DBOS.recv_async(topic, timeout_seconds=wait_s)
        return [before, time.perf_counter_ns(), message]

    @DBOS.workflow()
    async def publisher(key: str, delay: float) -> int:
        await asyncio.sleep(delay)
        at = time.perf_counter_ns()
        await DBOS.set_event_async(key, at)
        return at

    @DBOS.workflow()
    async def writer(key: str, count: int, gap: float) -> int:
        for _ in range(count):
            await asyncio.sleep(gap)
            await DBOS.write_stream_async(key, time.perf_counter_ns())
        await DBOS.close_stream_async(key)
        return count

    @DBOS.step()
    async def add_one(x: int) -> int:
        return x + 1

    @DBOS.workflow()
    async def one_step(x: int) -> int:
        return await add_one(x)

    workflows: dict[str, Any] = {"receiver": receiver, "publisher": publisher, "writer": writer,
                                 "one_step": one_step}

    class Adapter:
        async def start(self, workflow: str, *wf_args: Any) -> latency.Started:
            handle = await DBOS.start_workflow_async(workflows[workflow], *wf_args)
            return handle.get_workflow_id(), handle.get_result

        async def send(self, destination_id: str, message: Any, topic: str) -> None:
            await DBOS.send_async(destination_id, message, topic)

        async def get_event(self, workflow_id: str, key: str, wait_s: float) -> Any:
            return await DBOS.get_event_async(workflow_id, key, timeout_seconds=wait_s)

        def read_stream(self, workflow_id: str, key: str) -> AsyncIterator[Any]:
            return DBOS.read_stream_async(workflow_id, key)

        async def insert_row(self, i: int) -> None:
            await rows.insert(i)

    rows = latency.RowInserter(args.url)

    async def measured() -> dict[str, Any]:
        try:
            return await latency.measure(Adapter(), args.samples, args.warmup)
        finally:
            await rows.close()

    DBOS.launch()
    try:
        from dbos._tracer import dbos_tracer

        extras = {
            "conductor": instance.conductor_websocket is not None,
            "otlp": not dbos_tracer.disable_otlp,
        }
        operations = asyncio.run(measured())
    finally:
        DBOS.destroy()
    import dbos as dbos_package
    from bench_dbos import _version

    return {
        "dbos_version": getattr(dbos_package, "__version__", None) or _version("dbos"),
        "samples": args.samples,
        "warmup": args.warmup,
        "settle_s": latency.SETTLE,
        "operations": operations,
        **extras,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", required=True)
    parser.add_argument("--samples", type=int, required=True)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--pool-size", type=int, default=10)
    result = _child(parser.parse_args())
    print(MARKER + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
