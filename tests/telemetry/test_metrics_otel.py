"""OpenTelemetry metrics of the executor (``dbos_async/_metrics.py``), read through the SDK's
in-memory reader after a known workload: exact counts, histograms holding the known
durations, bounded attributes.

dbos_async meters through the global meter provider, which a process can set only once;
so the workload runs in a process of its own (``tests/helpers/metrics_worker.py``) that
prints what the reader collected. The test process sets no provider: there, metrics are off.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from helpers.metrics_worker import NAP, Points
from helpers.tracing_worker import define_waiting
from helpers.tracing_worker import new_dbos as worker_dbos

from dbos_async import _metrics as metrics

WORKER = Path(__file__).resolve().parents[1] / "helpers" / "metrics_worker.py"


def run_worker(url: str, scenario: str, *args: str) -> tuple[Points, Points]:
    """The metrics after the scenario, and those read while its executor ran."""
    proc = subprocess.run([sys.executable, str(WORKER), url, scenario, *args],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    found = json.loads(proc.stdout)
    return found["after"], found["during"]


def by(points: Points, metric: str, key: str) -> dict[str, dict[str, Any]]:
    """The points of ``metric``, by the value of attribute ``key`` (one point each)."""
    found = {p["attributes"][key]: p for p in points.get(metric, [])}
    assert len(found) == len(points.get(metric, [])), points[metric]
    return found


def counts(points: Points, metric: str, key: str) -> dict[str, int]:
    return {name: p["value"] for name, p in by(points, metric, key).items()}


def test_a_known_workload_is_counted_exactly(database_url: str) -> None:
    points, during = run_worker(database_url, "workload")
    name = "dbos.workflow.name"
    assert counts(points, "dbos.workflow.started", name) == {
        "napping": 3, "failing": 1, "retrying": 1, "waiting": 1, "queued": 4}
    assert counts(points, "dbos.workflow.completed", name) == {
        "napping": 3, "retrying": 1, "queued": 4}
    assert counts(points, "dbos.workflow.failed", name) == {"failing": 1}
    assert counts(points, "dbos.workflow.cancelled", name) == {"waiting": 1}
    assert "dbos.workflow.recovered" not in points

    durations = {(p["attributes"][name], p["attributes"]["dbos.workflow.status"]): p
                 for p in points["dbos.workflow.duration"]}
    assert {k: p["count"] for k, p in durations.items()} == {
        ("napping", "SUCCESS"): 3, ("failing", "ERROR"): 1, ("retrying", "SUCCESS"): 1,
        ("waiting", "CANCELLED"): 1, ("queued", "SUCCESS"): 4}
    assert durations["napping", "SUCCESS"]["min"] >= NAP

    step = "dbos.step.name"
    assert counts(points, "dbos.step.attempts", step) == {
        "nap": 3, "explode": 1, "flaky": 3, "queued_step": 4}
    assert counts(points, "dbos.step.retries", step) == {"flaky": 2}
    steps = {(p["attributes"][step], p["attributes"]["dbos.step.status"]): p
             for p in points["dbos.step.duration"]}
    assert {k: p["count"] for k, p in steps.items()} == {
        ("nap", "SUCCESS"): 3, ("explode", "ERROR"): 1, ("flaky", "ERROR"): 2,
        ("flaky", "SUCCESS"): 1, ("queued_step", "SUCCESS"): 4}
    nap = steps["nap", "SUCCESS"]
    assert nap["min"] >= NAP and nap["sum"] >= 3 * NAP
    assert nap["max"] < nap["sum"]  # three durations, none of them the whole

    queue = "dbos.queue.name"
    [latency] = points["dbos.queue.claim_latency"]
    assert latency["attributes"] == {queue: "jobs"} and latency["count"] == 4
    assert latency["min"] >= 0
    # Every queue's claim loop reports its rounds (the internal queue's too).
    rounds = by(points, "dbos.queue.claims_per_round", queue)["jobs"]
    assert rounds["sum"] == 4 and rounds["count"] >= 1

    [batches] = points["dbos.group_commit.batch_size"]
    # At least every step output, each workflow's outcome and each start went through it.
    assert batches["sum"] >= 11 + 11 and batches["min"] >= 1
    assert sum(p["value"] for p in points["dbos.notification.wakeups"]) > 0
    # Read while the executor ran: the system database's pool is reported.
    assert by(during, "dbos.pool.in_use", "dbos.pool.name")["system"]["value"] >= 0
    assert "dbos.task.restarts" not in points

    # No unbounded attribute: no workflow ID anywhere.
    keys = {k for metric in points.values() for p in metric for k in p["attributes"]}
    assert keys <= {name, "dbos.workflow.status", step, "dbos.step.status", queue,
                    "dbos.notification.channel", "dbos.pool.name", "dbos.task.name"}


async def test_a_recovered_workflow_is_counted(database_url: str) -> None:
    dbos = worker_dbos(database_url, shutdown_grace_period=0)
    waiting = define_waiting(dbos)
    async with dbos:
        handle = await dbos.start_workflow(waiting)
    # Left at once: the workflow stays PENDING, for the worker (same executor ID) to recover.
    points, _ = run_worker(database_url, "recover", handle.workflow_id)
    assert counts(points, "dbos.workflow.recovered", "dbos.workflow.name") == {"waiting": 1}
    assert counts(points, "dbos.workflow.completed", "dbos.workflow.name") == {"waiting": 1}


def test_metrics_are_off_without_a_meter_provider() -> None:
    assert metrics.current() is None


def test_histogram_values_reach_the_sdk_as_recorded() -> None:
    """The histograms are kept in process and replayed when the provider collects: what the
    SDK aggregates is what recording each value straight into it gives (count, sum, min,
    max and every bucket), however the values fall, over several collections; and the
    store's own totals (what a Prometheus scrape renders, read here before each replay)
    are the SDK's count, sum and buckets too."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    reader = InMemoryMetricReader()
    meter = MeterProvider(metric_readers=[reader]).get_meter("test")
    kept = metrics.Distribution(metrics.Metric("kept", "s", "", ("name", "status")),
                                metrics.DURATION_BUCKETS)
    kept.bind(meter.create_histogram(
        "kept", "s", "", explicit_bucket_boundaries_advisory=metrics.DURATION_BUCKETS).record)
    straight = meter.create_histogram(
        "straight", "s", "", explicit_bucket_boundaries_advisory=metrics.DURATION_BUCKETS)
    # On the bounds, between them, repeated, beyond the last; three attribute sets.
    values = [*metrics.DURATION_BUCKETS, 0.0, 0.0004, 0.003, 0.003, 0.0031, 0.04, 0.07,
              0.09, 2.0, 2.2, 2.4, 7.5, 100_000.0]
    rounds = [values, values[::3], [0.0042] * 7, []]
    for number, batch in enumerate(rounds):
        for i, value in enumerate(batch):
            attributes = ("w", ("SUCCESS", "ERROR", "CANCELLED")[(i + number) % 3])
            kept.record(value, *attributes)
            straight.record(value, {"name": attributes[0], "status": attributes[1]})
        totals = {t.attributes[1]: t for t in kept.totals()}
        kept.replay()
        data = reader.get_metrics_data()
        assert data is not None
        found = {m.name: m.data.data_points
                 for m in data.resource_metrics[0].scope_metrics[0].metrics}
        got = {p.attributes["status"]: p for p in found["kept"]}
        want = {p.attributes["status"]: p for p in found["straight"]}
        assert got.keys() == want.keys() == {"SUCCESS", "ERROR", "CANCELLED"}
        for status, point in want.items():
            assert got[status].count == point.count
            assert list(got[status].bucket_counts) == list(point.bucket_counts)
            assert (got[status].min, got[status].max) == (point.min, point.max)
            assert abs(got[status].sum - point.sum) <= 1e-9 * point.sum
            assert (totals[status].count, totals[status].buckets) == (
                point.count, tuple(point.bucket_counts))
            assert abs(totals[status].sum - point.sum) <= 1e-9 * point.sum
