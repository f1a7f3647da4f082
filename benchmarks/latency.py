"""Wake-up latency measurements, shared by dbos_async and the `dbos` package child process.

This module imports neither package: each side supplies an adapter (see :class:`Adapter`)
whose workflows have the same bodies (see ``bench_latency_dbos_async.py`` and
``bench_latency_dbos.py``), and the loops here time them. Every sample is taken alone (the
next starts when the previous one is over), so the figures are wake-up latencies, not
throughput. Timestamps are ``time.perf_counter_ns()`` taken in the same process, in the
workflow or in the waiter, so they share one clock.

The operations:

- ``send_recv``: a workflow blocks in ``recv(topic, timeout)``; ``settle`` seconds after its
  start the benchmark calls ``send``; latency = from just before ``send`` is called to the
  moment ``recv`` returns inside the workflow (the workflow returns that timestamp).
- ``event``: the benchmark starts a workflow and at once waits in ``get_event`` (outside any
  workflow); the workflow sleeps ``settle`` seconds and calls ``set_event`` with the current
  timestamp as the value; latency = from that timestamp to ``get_event`` returning.
- ``stream``: a reader iterates ``read_stream``; the workflow writes one value every
  ``settle`` seconds, each value being the timestamp taken just before the write call;
  latency = from it to the reader receiving the value.
- ``start_result``: ``start_workflow`` of a one-step workflow, then ``get_result``; latency =
  the two together.
- ``serial_start``: a request loop, ``start_workflow`` of a one-step workflow awaited before
  the next, while the workflows started before it run; latency = the ``start_workflow`` call.
  After each start, one single-row autocommit INSERT on a connection of its own to the same
  database (``insert_row``) is timed too: the floor a start is compared with, under the same
  load. The rate of the loop is samples over the sum of the start latencies.

A sample where the waiter was not yet waiting when the write began (``recv`` called after
``send`` began; ``get_event`` called after ``set_event`` began; the reader still busy with
the previous value when the next write began) measures a read, not a wake-up: it is counted
as ``not_waiting`` and left out of the figures.
"""

from __future__ import annotations

import asyncio
import math
import statistics
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Protocol

import asyncpg

TOPIC = "latency"
KEY = "latency"
WAIT_TIMEOUT = 30.0
"""Seconds a recv / get_event may wait before it gives up (a failed sample)."""
SETTLE = 0.02
"""Seconds between a waiter starting to wait and the write that should wake it."""

OPERATIONS: dict[str, str] = {
    "send_recv": "send -> recv wake-up",
    "event": "set_event -> get_event",
    "stream": "write_stream -> read_stream",
    "start_result": "start_workflow -> get_result",
    "serial_start": "start_workflow, one after another, while the started run",
}

Started = tuple[str, Callable[[], Awaitable[Any]]]
"""A started workflow: its ID and a coroutine function returning its result."""


class Adapter(Protocol):
    """One package's calls. ``start`` names one of four workflows, which must be:

    - ``receiver(topic, wait_s)``: ``before = perf_counter_ns(); msg = await recv(topic,
      wait_s); return [before, perf_counter_ns(), msg]``
    - ``publisher(key, delay)``: ``await asyncio.sleep(delay); t = perf_counter_ns();
      await set_event(key, t); return t``
    - ``writer(key, count, gap)``: ``count`` times ``await asyncio.sleep(gap);
      await write_stream(key, perf_counter_ns())``, then ``close_stream(key)``
    - ``one_step(x)``: returns the result of one step, ``x + 1``
    """

    async def start(self, workflow: str, *args: Any) -> Started: ...

    async def send(self, destination_id: str, message: Any, topic: str) -> None: ...

    async def get_event(self, workflow_id: str, key: str, wait_s: float) -> Any: ...

    def read_stream(self, workflow_id: str, key: str) -> AsyncIterator[Any]: ...

    async def insert_row(self, i: int) -> None: ...


class RowInserter:
    """Single-row autocommit INSERTs on a connection of its own (see ``serial_start``), into
    a scratch table of the benchmark's database, as a request handler without a workflow
    would write."""

    TABLE = "latency_raw_insert"

    def __init__(self, url: str) -> None:
        self.url = url
        self.conn: asyncpg.Connection | None = None

    async def insert(self, i: int) -> None:
        if self.conn is None:
            self.conn = await asyncpg.connect(self.url)
            await self.conn.execute(f"DROP TABLE IF EXISTS {self.TABLE}")
            await self.conn.execute(f"CREATE TABLE {self.TABLE} (id bigint PRIMARY KEY, "
                                    "payload text)")
        await self.conn.execute(f"INSERT INTO {self.TABLE} VALUES ($1, $2)", i, "x" * 64)

    async def close(self) -> None:
        if self.conn is not None:
            await self.conn.execute(f"DROP TABLE IF EXISTS {self.TABLE}")
            await self.conn.close()


async def send_recv(adapter: Adapter, samples: int, warmup: int,
                    settle: float = SETTLE) -> dict[str, Any]:
    latencies: list[int] = []
    not_waiting = 0
    for i in range(warmup + samples):
        workflow_id, result = await adapter.start("receiver", TOPIC, WAIT_TIMEOUT)
        await asyncio.sleep(settle)
        sent = time.perf_counter_ns()
        await adapter.send(workflow_id, i, TOPIC)
        before, received, message = await result()
        if message != i:
            raise RuntimeError(f"send_recv sample {i}: received {message!r}")
        if i < warmup:
            continue
        if before > sent:
            not_waiting += 1
        else:
            latencies.append(received - sent)
    return figures(latencies, not_waiting, warmup)


async def event(adapter: Adapter, samples: int, warmup: int,
                settle: float = SETTLE) -> dict[str, Any]:
    latencies: list[int] = []
    not_waiting = 0
    for i in range(warmup + samples):
        workflow_id, result = await adapter.start("publisher", KEY, settle)
        called = time.perf_counter_ns()
        value = await adapter.get_event(workflow_id, KEY, WAIT_TIMEOUT)
        got = time.perf_counter_ns()
        set_at = await result()
        if value != set_at:
            raise RuntimeError(f"event sample {i}: got {value!r}, the workflow set {set_at!r}")
        if i < warmup:
            continue
        if called > set_at:
            not_waiting += 1
        else:
            latencies.append(got - set_at)
    return figures(latencies, not_waiting, warmup)


async def stream(adapter: Adapter, samples: int, warmup: int,
                 settle: float = SETTLE) -> dict[str, Any]:
    count = warmup + samples
    workflow_id, result = await adapter.start("writer", KEY, count, settle)
    received: list[tuple[int, int]] = []
    async for value in adapter.read_stream(workflow_id, KEY):
        received.append((value, time.perf_counter_ns()))
    await result()
    if len(received) != count:
        raise RuntimeError(f"stream: read {len(received)} values of {count}")
    latencies: list[int] = []
    not_waiting = 0
    for i in range(warmup, count):
        written, got = received[i]
        # The reader was still handling the previous value when this one was written.
        if i > 0 and received[i - 1][1] > written:
            not_waiting += 1
        else:
            latencies.append(got - written)
    return figures(latencies, not_waiting, warmup)


async def start_result(adapter: Adapter, samples: int, warmup: int,
                       settle: float = SETTLE) -> dict[str, Any]:
    latencies: list[int] = []
    for i in range(warmup + samples):
        started = time.perf_counter_ns()
        _, result = await adapter.start("one_step", i)
        value = await result()
        done = time.perf_counter_ns()
        if value != i + 1:
            raise RuntimeError(f"start_result sample {i}: {value!r}")
        if i >= warmup:
            latencies.append(done - started)
    return figures(latencies, 0, warmup)


async def serial_start(adapter: Adapter, samples: int, warmup: int,
                       settle: float = SETTLE) -> dict[str, Any]:
    latencies: list[int] = []
    inserts: list[int] = []
    results: list[Callable[[], Awaitable[Any]]] = []
    for i in range(warmup + samples):
        started = time.perf_counter_ns()
        _, result = await adapter.start("one_step", i)
        returned = time.perf_counter_ns()
        await adapter.insert_row(i)
        inserted = time.perf_counter_ns()
        results.append(result)
        if i >= warmup:
            latencies.append(returned - started)
            inserts.append(inserted - returned)
    for i, result in enumerate(results):
        if (value := await result()) != i + 1:
            raise RuntimeError(f"serial_start sample {i}: {value!r}")
    out = figures(latencies, 0, warmup)
    out["starts_per_s"] = len(latencies) / (sum(latencies) / 1e9)
    out["insert_row"] = figures(inserts, 0, warmup)
    return out


MEASURES = {"send_recv": send_recv, "event": event, "stream": stream,
            "start_result": start_result, "serial_start": serial_start}


async def measure(adapter: Adapter, samples: int, warmup: int,
                  operations: tuple[str, ...] = tuple(OPERATIONS),
                  settle: float = SETTLE) -> dict[str, Any]:
    """Every operation in turn; an operation that fails is reported with its error."""
    results: dict[str, Any] = {}
    for name in operations:
        started = time.perf_counter()
        try:
            results[name] = await MEASURES[name](adapter, samples, warmup, settle)
        except Exception as error:  # reported, not fatal: the other operations still run
            results[name] = {"error": f"{type(error).__name__}: {error}"}
        results[name]["seconds"] = time.perf_counter() - started
    return results


def percentile(values: list[float], fraction: float) -> float:
    """Nearest-rank percentile: with 20 values p99 is the largest."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(fraction * len(ordered)) - 1)]


def figures(latencies_ns: list[int], not_waiting: int, warmup: int) -> dict[str, Any]:
    ms = [value / 1e6 for value in latencies_ns]
    result: dict[str, Any] = {"samples": len(ms), "warmup": warmup, "not_waiting": not_waiting}
    if ms:
        result.update({
            "median_ms": statistics.median(ms),
            "p99_ms": percentile(ms, 0.99),
            "min_ms": min(ms),
            "max_ms": max(ms),
            "mean_ms": statistics.fmean(ms),
        })
    return result
