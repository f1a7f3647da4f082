"""The Prometheus endpoint (``dbos_async/prometheus.py``): scraped with a real HTTP client
from real servers (aiohttp in a process of its own with the executor's metrics, read from
the store without any meter provider; FastAPI and the console under uvicorn in this one
with the database's aggregates), the answer parsed with Prometheus's text parser.

Creating an endpoint of the executor's metrics turns their recording on for the process;
the endpoints this process creates leave them out (``executor=False``), so that metrics
stay off here as the OpenTelemetry tests expect.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
from fastapi import FastAPI
from helpers.console_scenario import serving
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from dbos_async import DBOSClient, InvalidArgumentError, migrate
from dbos_async import _metrics as metrics
from dbos_async import prometheus as endpoint
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
        _, port, sdk = line.split()
        assert sdk == "False"  # no meter provider: the SDK's metrics were never imported
        yield f"http://127.0.0.1:{int(port)}"
    finally:
        proc.terminate()
        await proc.wait()


async def test_the_executor_metrics_scraped_from_aiohttp(worker: str) -> None:
    samples = await scrape(worker)
    name = "dbos_workflow_name"
    started = {labels[0][1]: v for (n, labels), v in samples.items()
               if n == "dbos_workflow_started_total"}
    assert started == {"napping": 3, "failing": 1, "retrying": 1, "waiting": 1, "queued": 4}
    assert value(samples, "dbos_workflow_completed_total", **{name: "queued"}) == 4
    assert value(samples, "dbos_workflow_completed_total", **{name: "retrying"}) == 1
    assert value(samples, "dbos_workflow_failed_total", **{name: "failing"}) == 1
    assert value(samples, "dbos_workflow_cancelled_total", **{name: "waiting"}) == 1
    assert value(samples, "dbos_step_attempts_total", dbos_step_name="flaky") == 3
    assert value(samples, "dbos_step_retries_total", dbos_step_name="flaky") == 2
    assert not any(n.startswith("dbos_workflow_recovered") for n, _ in samples)

    # The steps' histogram in seconds: the three naps of at least 50 ms each sit above the
    # 0.05 s bucket's bound, and the buckets are cumulative up to +Inf.
    nap = {"dbos_step_name": "nap", "dbos_step_status": "SUCCESS"}
    assert value(samples, "dbos_step_duration_seconds_count", **nap) == 3
    assert value(samples, "dbos_step_duration_seconds_sum", **nap) >= 0.15
    assert value(samples, "dbos_step_duration_seconds_bucket", **nap, le="0.025") == 0
    assert value(samples, "dbos_step_duration_seconds_bucket", **nap, le="0.05") == 0
    assert value(samples, "dbos_step_duration_seconds_bucket", **nap, le="+Inf") == 3
    flaky = {"dbos_step_name": "flaky", "dbos_step_status": "ERROR"}
    assert value(samples, "dbos_step_duration_seconds_count", **flaky) == 2
    assert value(samples, "dbos_workflow_duration_seconds_count", **{name: "napping"},
                 dbos_workflow_status="SUCCESS") == 3
    assert value(samples, "dbos_queue_claim_latency_seconds_count",
                 dbos_queue_name="jobs") == 4
    assert value(samples, "dbos_queue_claims_per_round_sum", dbos_queue_name="jobs") == 4

    # The database's aggregates, beside them.
    assert value(samples, "dbos_recent_workflows", **{name: "napping"},
                 dbos_workflow_status="SUCCESS") == 3
    assert value(samples, "dbos_recent_workflow_run_seconds", **{name: "napping"},
                 quantile="0.5") >= 0.05


def test_the_store_renders_what_the_sdk_did(database_url: str) -> None:
    """The workload under a meter provider given the endpoint's reader: the executor's
    metrics rendered from the store are those rendered, as before, from what the SDK
    collected (names, labels, help, types, every sample), and appear once; the
    application's own metric comes through the reader."""
    proc = subprocess.run([sys.executable, str(WORKER), database_url, "compare"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    texts = json.loads(proc.stdout)
    store = {f.name: f for f in text_string_to_metric_families(texts["store"])}
    sdk = {f.name: f for f in text_string_to_metric_families(texts["sdk"])}
    [orders] = store.pop("shop_orders").samples
    assert (orders.name, orders.value) == ("shop_orders_total", 2)
    assert store.keys() == sdk.keys() and "dbos_step_duration_seconds" in store
    for family_name, family in sdk.items():
        assert (store[family_name].documentation, store[family_name].type) == (
            family.documentation, family.type)
        got = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for s in store[family_name].samples}
        want = {(s.name, tuple(sorted(s.labels.items()))): s.value for s in family.samples}
        assert got.keys() == want.keys()
        for key, number in want.items():  # a replayed sum may differ in its last bits
            assert abs(got[key] - number) <= 1e-9 * max(1.0, abs(number)), key
    # The reader's copy is left out: each sample once.
    assert texts["store"].count("dbos_step_retries_total{") == 1


def test_a_store_renders_its_known_values() -> None:
    """Known durations and counts in a store of their own: exact buckets, sums and
    counts, as Prometheus's text parser reads them."""
    store = metrics.Instruments()
    for seconds in (0.0004, 0.001, 0.003, 0.003, 0.07, 2.0, 100_000.0):
        store.step_duration.record(seconds, "charge", "SUCCESS")
    store.step_duration.record(0.2, "charge", "ERROR")
    store.batch_size.record(3)
    store.batch_size.record(0)
    store.step_attempts.add(8, "charge")
    store.step_retries.add(1, "charge")
    registry = CollectorRegistry(auto_describe=False)
    registry.register(endpoint._Families(endpoint._executor_families(store)))
    samples = parsed(generate_latest(registry).decode())
    ok = {"dbos_step_name": "charge", "dbos_step_status": "SUCCESS"}
    bucket = "dbos_step_duration_seconds_bucket"
    # A value on a bound counts in that bound's bucket (le: less than or equal).
    assert {le: value(samples, bucket, **ok, le=le) for le in (
        "0.001", "0.0025", "0.005", "0.05", "0.1", "2.5", "86400.0", "+Inf")} == {
        "0.001": 2, "0.0025": 2, "0.005": 4, "0.05": 4, "0.1": 5, "2.5": 6, "86400.0": 6,
        "+Inf": 7}
    assert value(samples, "dbos_step_duration_seconds_count", **ok) == 7
    assert abs(value(samples, "dbos_step_duration_seconds_sum", **ok) - 100_002.0774) < 1e-6
    error = {"dbos_step_name": "charge", "dbos_step_status": "ERROR"}
    assert value(samples, bucket, **error, le="0.1") == 0
    assert value(samples, bucket, **error, le="0.25") == 1
    assert value(samples, "dbos_group_commit_batch_size_bucket", le="0.0") == 1
    assert value(samples, "dbos_group_commit_batch_size_bucket", le="5.0") == 2
    assert value(samples, "dbos_group_commit_batch_size_sum") == 3
    assert value(samples, "dbos_step_attempts_total", dbos_step_name="charge") == 8
    assert value(samples, "dbos_step_retries_total", dbos_step_name="charge") == 1
    assert not any(n.startswith("dbos_workflow") for n, _ in samples)  # nothing recorded


async def test_the_aggregates_scraped_from_fastapi_and_the_console(database_url: str) -> None:
    await migrate(database_url)
    async with DBOSClient(system_database_url=database_url) as client:
        for i in range(3):
            await client.enqueue("emails", "send_email", f"user-{i}")
        app = FastAPI()
        app.add_route("/metrics", PrometheusMetrics(aggregates=client, executor=False))
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
            # Neither endpoint serves the executor's metrics.
            assert not any(n.startswith("dbos_workflow_started") for n, _ in samples)


async def test_only_get_is_answered(database_url: str) -> None:
    app: Any = PrometheusMetrics(executor=False)
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
    with pytest.raises(InvalidArgumentError, match=r"executor.*not 'no'"):
        PrometheusMetrics(executor="no")  # type: ignore[arg-type]
