"""A process that runs workflows under an OpenTelemetry SDK and prints the spans they made.

usage: python tracing_worker.py URL SCENARIO [WORKFLOW_ID]

The process sets the global tracer provider (as an application does) with an in-memory
exporter, runs ``SCENARIO`` on a DBOS executor at ``URL``, leaves the executor (so every
workflow's span has ended) and prints one JSON object per finished span on stdout. The
global provider is set once per process, which is why the tracing tests run here and not in
the test process.

Scenarios:

- ``tree``: under a ``request`` span, workflow ``parent``: steps ``step_a``, ``step_b``, then
  child workflow ``child`` (one step, ``child_step``);
- ``retry``: workflow ``retrying`` whose step ``flaky`` fails twice, then succeeds;
- ``failure``: workflow ``failing`` whose step ``explode`` raises ``ValueError('bad 3')``;
- ``worker``: an executor of queue ``traced`` that runs ``queued`` (a step ``queued_step``)
  until workflow ``WORKFLOW_ID`` has finished;
- ``recover``: an executor that recovers the PENDING workflow ``WORKFLOW_ID`` (``waiting``
  of :func:`define_waiting`, left by the test under the same executor ID), sends it its
  number and waits for its result.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from dbos_async import DBOS, transaction_connection


def span_json(span: ReadableSpan) -> dict[str, Any]:
    context = span.get_span_context()
    assert context is not None
    return {
        "name": span.name,
        "trace_id": format(context.trace_id, "032x"),
        "span_id": format(context.span_id, "016x"),
        "parent_span_id": format(span.parent.span_id, "016x") if span.parent else None,
        "attributes": dict(span.attributes or {}),
        "status": span.status.status_code.name,
        "events": [{"name": e.name, "attributes": dict(e.attributes or {})}
                   for e in span.events],
    }


def new_dbos(url: str, **settings: Any) -> DBOS:
    return DBOS(**{"system_database_url": url, "executor_id": "tracing-worker",
                   "application_version": "tracing-v1", "shutdown_grace_period": 5,
                   "pool_size": 4, **settings})


async def tree(url: str) -> None:
    dbos = new_dbos(url)

    @dbos.step(name="step_a")
    async def step_a() -> int:
        return 1

    @dbos.step(name="step_b")
    async def step_b() -> int:
        return 2

    @dbos.step(name="child_step")
    async def child_step() -> int:
        return 3

    @dbos.workflow(name="child")
    async def child() -> int:
        return await child_step()

    @dbos.workflow(name="parent")
    async def parent() -> int:
        return await step_a() + await step_b() + await child()

    async with dbos:
        with trace.get_tracer("app").start_as_current_span("request"):
            assert await parent() == 6


async def retry(url: str) -> None:
    dbos = new_dbos(url)
    calls = 0

    @dbos.step(name="flaky", retries=2, retry_interval=0.01)
    async def flaky() -> str:
        nonlocal calls
        calls += 1
        if calls < 3:
            raise ConnectionError(f"try {calls}")
        return "ok"

    @dbos.workflow(name="retrying")
    async def retrying() -> str:
        return await flaky()

    async with dbos:
        assert await retrying() == "ok"


async def transaction(url: str) -> None:
    dbos = new_dbos(url)

    @dbos.transaction(name="read_one")
    async def read_one() -> int:
        return int(await transaction_connection().fetchval("SELECT 1"))

    @dbos.workflow(name="transacting")
    async def transacting() -> int:
        return await read_one()

    async with dbos:
        assert await transacting() == 1


async def failure(url: str) -> None:
    dbos = new_dbos(url)

    @dbos.step(name="explode")
    async def explode() -> None:
        raise ValueError("bad 3")

    @dbos.workflow(name="failing")
    async def failing() -> None:
        await explode()

    async with dbos:
        try:
            await failing()
        except ValueError:
            pass
        else:
            raise AssertionError("the workflow did not fail")


async def worker(url: str, workflow_id: str) -> None:
    dbos = new_dbos(url)
    dbos.queue("traced")

    @dbos.step(name="queued_step")
    async def queued_step(x: int) -> int:
        return x + 1

    @dbos.workflow(name="queued")
    async def queued(x: int) -> int:
        return await queued_step(x)

    async with dbos:
        await (await dbos.retrieve_workflow(workflow_id)).get_result()


def define_waiting(dbos: DBOS) -> Any:
    """Workflow ``waiting``: receives a number, then adds one in step ``add_one``."""

    @dbos.step(name="add_one")
    async def add_one(x: int) -> int:
        return x + 1

    @dbos.workflow(name="waiting")
    async def waiting() -> int:
        return await add_one(await dbos.recv(timeout=60))

    return waiting


async def recover(url: str, workflow_id: str) -> None:
    dbos = new_dbos(url)
    define_waiting(dbos)
    async with dbos:  # recovers the test's PENDING workflow
        await dbos.send(workflow_id, 41)
        assert await (await dbos.retrieve_workflow(workflow_id)).get_result() == 42


def main() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    url, scenario, *rest = sys.argv[1:]
    scenarios = {"tree": tree, "retry": retry, "failure": failure, "transaction": transaction}
    if scenario in ("worker", "recover"):
        asyncio.run({"worker": worker, "recover": recover}[scenario](url, rest[0]))
    else:
        asyncio.run(scenarios[scenario](url))
    for span in exporter.get_finished_spans():
        print(json.dumps(span_json(span)), flush=True)


if __name__ == "__main__":
    main()
