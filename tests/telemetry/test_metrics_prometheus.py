"""The Prometheus endpoint (``dbos_async/prometheus.py``): scraped with a real HTTP client
from real servers (aiohttp in a process of its own with the executor's metrics, FastAPI and
the console under uvicorn in this one with the database's aggregates), the answer parsed
with Prometheus's text parser."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
from fastapi import FastAPI
from helpers.console_scenario import serving
from prometheus_client.parser import text_string_to_metric_families

from dbos_async import DBOSClient, InvalidArgumentError, migrate
from dbos_async.console import console_app
from dbos_async.prometheus import CONTENT_TYPE, PrometheusMetrics

WORKER = Path(__file__).resolve().parents[1] / "helpers" / "metrics_worker.py"
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def parsed(text: str) -> Samples:
    """Every sample, by name and sorted labels."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples[name, tuple(sorted(labels.items()))]


async def scrape(base: str) -> Samples:
    async with httpx2.AsyncClient(base_url=base, timeout=60) as http:
        response = await http.get("/metrics")
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == CONTENT_TYPE
    return parsed(response.text)


@pytest.fixture
async def worker(database_url: str) -> AsyncIterator[str]:
    """The worker's ``serve`` scenario: its base URL once it serves."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(WORKER), database_url, "serve", stdout=asyncio.subprocess.PIPE)
    try:
        assert proc.stdout is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), 120)).decode()
        assert line.startswith("serving "), line
        yield f"http://127.0.0.1:{int(line.split()[1])}"
    finally:
        proc.terminate()
        await proc.wait()


async def test_the_executor_metrics_scraped_from_aiohttp(worker: str) -> None:
    samples = await scrape(worker)
    name = "dbos_workflow_name"
    assert value(samples, "dbos_workflow_started_total", **{name: "napping"}) == 3
    assert value(samples, "dbos_workflow_completed_total", **{name: "queued"}) == 4
    assert value(samples, "dbos_workflow_failed_total", **{name: "failing"}) == 1
    assert value(samples, "dbos_workflow_cancelled_total", **{name: "waiting"}) == 1
    assert value(samples, "dbos_step_retries_total", dbos_step_name="flaky") == 2

    # The steps' histogram in seconds: the three naps of at least 50 ms each sit above the
    # 0.05 s bucket's bound, and the buckets are cumulative up to +Inf.
    nap = {"dbos_step_name": "nap", "dbos_step_status": "SUCCESS"}
    assert value(samples, "dbos_step_duration_seconds_count", **nap) == 3
    assert value(samples, "dbos_step_duration_seconds_sum", **nap) >= 0.15
    assert value(samples, "dbos_step_duration_seconds_bucket", **nap, le="0.025") == 0
    assert value(samples, "dbos_step_duration_seconds_bucket", **nap, le="+Inf") == 3
    assert value(samples, "dbos_queue_claim_latency_seconds_count",
                 dbos_queue_name="jobs") == 4

    # The database's aggregates, beside them.
    assert value(samples, "dbos_recent_workflows", **{name: "napping"},
                 dbos_workflow_status="SUCCESS") == 3
    assert value(samples, "dbos_recent_workflow_run_seconds", **{name: "napping"},
                 quantile="0.5") >= 0.05


async def test_the_aggregates_scraped_from_fastapi_and_the_console(database_url: str) -> None:
    await migrate(database_url)
    async with DBOSClient(system_database_url=database_url) as client:
        for i in range(3):
            await client.enqueue("emails", "send_email", f"user-{i}")
        app = FastAPI()
        app.add_route("/metrics", PrometheusMetrics(aggregates=client))
        for served in (app, console_app(client)):
            async with serving(served) as base:
                samples = await scrape(base)
            assert value(samples, "dbos_queue_workflows", dbos_queue_name="emails",
                         dbos_workflow_status="ENQUEUED") == 3
            assert value(samples, "dbos_queue_workflows", dbos_queue_name="emails",
                         dbos_workflow_status="PENDING") == 0
            assert value(samples, "dbos_queue_oldest_waiting_seconds",
                         dbos_queue_name="emails") >= 0
            assert value(samples, "dbos_recent_workflows", dbos_workflow_name="send_email",
                         dbos_workflow_status="ENQUEUED") == 3
            # Without a reader given to a meter provider: no executor metric.
            assert not any(n.startswith("dbos_workflow_started") for n, _ in samples)


async def test_only_get_is_answered(database_url: str) -> None:
    app: Any = PrometheusMetrics()
    async with serving(app) as base, httpx2.AsyncClient(base_url=base) as http:
        refused = await http.post("/metrics")
        empty = await http.get("/metrics")
    assert refused.status_code == 405 and refused.headers["allow"] == "GET, HEAD"
    assert empty.status_code == 200 and parsed(empty.text) == {}


def test_bad_arguments_are_refused() -> None:
    for bad in (0, -1.0, float("nan"), "60", True):
        with pytest.raises(InvalidArgumentError, match="window_seconds"):
            PrometheusMetrics(window_seconds=bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match=r"aggregates.*not str"):
        PrometheusMetrics(aggregates="postgresql://")  # type: ignore[arg-type]
