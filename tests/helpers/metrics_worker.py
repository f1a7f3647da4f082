"""A process that runs workflows under an OpenTelemetry SDK meter provider and prints the
metrics they made.

usage: python metrics_worker.py URL SCENARIO [WORKFLOW_ID]

The process sets the global meter provider (as an application does) with an in-memory
reader, runs ``SCENARIO`` on a DBOS executor at ``URL``, leaves the executor and prints the
reader's metrics as one JSON object: ``{metric name: [data point, ...]}``, each point with
its attributes and its value (a sum or gauge) or its count, sum, min and max (a histogram).
The global provider is set once per process, which is why the metrics tests run here.

Scenarios:

- ``workload``: the tracing worker's ``failure`` (workflow ``failing``, step ``explode``
  raising) and ``retry`` (workflow ``retrying``, step ``flaky`` failing twice, then
  succeeding), then workflow ``napping`` three times (step ``nap`` sleeps NAP seconds),
  ``waiting`` once (cancelled while it waits), and four ``queued`` workflows on queue
  ``jobs``;
- ``recover``: the tracing worker's: an executor that recovers the PENDING workflow
  ``WORKFLOW_ID`` (``waiting``, left by the test under the same executor ID);
- ``serve``: no meter provider, and the OpenTelemetry SDK's metrics never imported: a
  :class:`~dbos_async.prometheus.PrometheusMetrics` created before the workload records
  the executor's metrics; after it, an aiohttp app serves them at ``/metrics`` on a free
  port (with the database's aggregates) until the process is stopped; it prints
  ``serving PORT SDK`` once it answers, SDK ``True`` if the SDK's metrics were imported;
- ``compare``: the workload under both exporters, a meter provider given the endpoint's
  reader (with a counter of the application's own, ``shop.orders``, at 2) and the
  endpoint; prints ``{"store": TEXT, "sdk": TEXT}``, the endpoint's scrape and the
  executor's metrics rendered from what the SDK collected.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dbos_async import DBOSClient, WorkflowCancelledError
from dbos_async.prometheus import PrometheusMetrics

# Run as a script, as the tests do, or imported by them (as helpers.metrics_worker).
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from helpers.tracing_worker import define_waiting, failure, new_dbos, recover, retry

if TYPE_CHECKING:
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

NAP = 0.05
Points = dict[str, list[dict[str, Any]]]


async def workload(url: str, reader: InMemoryMetricReader | None) -> Points:
    """The workload; what ``reader`` collected while its executor ran (none without)."""
    await failure(url)  # workflow "failing", its step "explode" raising
    await retry(url)  # workflow "retrying", its step "flaky" failing twice
    dbos = new_dbos(url)
    jobs = dbos.queue("jobs")

    @dbos.step(name="nap")
    async def nap() -> None:
        await asyncio.sleep(NAP)

    @dbos.workflow(name="napping")
    async def napping() -> None:
        await nap()

    @dbos.step(name="queued_step")
    async def queued_step(x: int) -> int:
        return x + 1

    @dbos.workflow(name="queued")
    async def queued(x: int) -> int:
        return await queued_step(x)

    waiting = define_waiting(dbos)
    async with dbos:
        for _ in range(3):
            await napping()
        handle = await dbos.start_workflow(waiting)
        await dbos.cancel_workflow(handle.workflow_id)
        try:
            await handle.get_result()
        except WorkflowCancelledError:
            pass
        else:
            raise AssertionError("the workflow was not cancelled")
        handles = [await jobs.enqueue(queued, i) for i in range(4)]
        assert [await h.get_result() for h in handles] == [1, 2, 3, 4]
        return {} if reader is None else collected(reader)  # while the pools are open


def point_json(point: Any) -> dict[str, Any]:
    from opentelemetry.sdk.metrics.export import HistogramDataPoint

    found: dict[str, Any] = {"attributes": dict(point.attributes or {})}
    if isinstance(point, HistogramDataPoint):
        found.update(count=point.count, sum=point.sum, min=point.min, max=point.max)
    else:
        found["value"] = point.value
    return found


def collected(reader: InMemoryMetricReader) -> Points:
    data = reader.get_metrics_data()
    found: Points = {}
    assert data is not None
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                found[metric.name] = [point_json(p) for p in metric.data.data_points]
    return found


async def serve(url: str) -> None:
    from aiohttp import web

    from dbos_async.aiohttp import metrics_handler

    clients: list[DBOSClient] = []
    prometheus = PrometheusMetrics(aggregates=lambda: clients[0])
    await workload(url, None)
    async with DBOSClient(system_database_url=url) as client:
        clients.append(client)
        app = web.Application()
        app.router.add_get("/metrics", metrics_handler(prometheus))
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        _, port = runner.addresses[0][:2]
        sdk = "opentelemetry.sdk.metrics" in sys.modules
        print(f"serving {port} {sdk}", flush=True)
        await asyncio.Event().wait()  # until the test stops the process


async def compare(url: str) -> dict[str, str]:
    from opentelemetry import metrics
    from opentelemetry.sdk.metrics import MeterProvider
    from prometheus_client import CollectorRegistry, generate_latest

    from dbos_async import _metrics
    from dbos_async import prometheus as endpoint

    prometheus = PrometheusMetrics()
    metrics.set_meter_provider(MeterProvider(metric_readers=[prometheus.reader]))
    # The application's own metric, which the reader is for.
    metrics.get_meter("shop").create_counter("shop.orders", "{order}", "Orders").add(2)
    await workload(url, None)
    rendered = (await prometheus.render()).decode()
    data = prometheus.reader.get_metrics_data()
    assert data is not None
    registry = CollectorRegistry(auto_describe=False)
    registry.register(endpoint._Families([  # what the endpoint rendered before the store
        family for resource in data.resource_metrics for scope in resource.scope_metrics
        if scope.scope.name == _metrics.INSTRUMENTATION
        for metric in scope.metrics for family in endpoint._family(metric)]))
    return {"store": rendered, "sdk": generate_latest(registry).decode()}


def main() -> None:
    """Print the metrics after the scenario, and (``workload``) those read while its
    executor ran, as ``{"after": ..., "during": ...}``."""
    url, scenario, *rest = sys.argv[1:]
    if scenario == "serve":
        asyncio.run(serve(url))
        return
    if scenario == "compare":
        print(json.dumps(asyncio.run(compare(url))), flush=True)
        return
    from opentelemetry import metrics
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    reader = InMemoryMetricReader()
    metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
    during: Points = {}
    if scenario == "recover":
        asyncio.run(recover(url, rest[0]))
    else:
        during = asyncio.run(workload(url, reader))
    print(json.dumps({"after": collected(reader), "during": during}), flush=True)


if __name__ == "__main__":
    main()
