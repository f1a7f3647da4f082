"""Metrics aggregated by the system database (``get_workflow_aggregates``,
``get_step_aggregates``, ``get_queue_metrics``, ``get_metrics``): checked against rows
written with known timestamps, on the unsharded and the sharded schema, and each read's
plan checked to be served by an index at 100,000+ rows."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from helpers import new_dbos

from dbos_async import DBOSClient, InvalidArgumentError, migrate

HOUR_MS = 3_600_000
NOW = 1_800_000_000_000  # every timestamp below is relative to this one


@pytest.fixture(params=[False, True], ids=["unsharded", "sharded"])
def sharding(request: pytest.FixtureRequest) -> bool:
    value: bool = request.param
    return value


def client_of(url: str, sharding: bool) -> DBOSClient:
    return DBOSClient(system_database_url=url, sharding=sharding,
                      application_name="metrics-app")


def percentile_cont(values: Sequence[float], fraction: float) -> float:
    """PostgreSQL's percentile_cont: linear interpolation between the sorted values."""
    ordered = sorted(values)
    position = fraction * (len(ordered) - 1)
    low, high = math.floor(position), math.ceil(position)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


# (id, status, name, queue, version, executor, created, started, completed)
WORKFLOWS: list[tuple[Any, ...]] = [
    ("w1", "SUCCESS", "checkout", None, "v1", "exec-a", NOW - 50_000, None, NOW - 40_000),
    ("w2", "SUCCESS", "checkout", None, "v1", "exec-a", NOW - 45_000, None, NOW - 44_000),
    ("w3", "ERROR", "checkout", None, "v2", "exec-b", NOW - 30_000, None, NOW - 27_000),
    ("w4", "SUCCESS", "report", "jobs", "v2", "exec-b", NOW - 20_000, NOW - 15_000,
     NOW - 14_500),
    ("w5", "ENQUEUED", "report", "jobs", "v2", None, NOW - 10_000, None, None),
    ("w6", "PENDING", "report", "jobs", "v2", "exec-b", NOW - 9_000, NOW - 8_000, None),
    # Outside the last hour: counted only by a wider range.
    ("old", "SUCCESS", "checkout", None, "v1", "exec-a", NOW - 2 * HOUR_MS, None,
     NOW - 2 * HOUR_MS + 100),
]
# (workflow, function_id, name, error?, started, completed)
STEPS: list[tuple[Any, ...]] = [
    ("w1", 0, "charge", False, NOW - 49_000, NOW - 48_000),
    ("w2", 0, "charge", False, NOW - 44_900, NOW - 44_600),
    ("w3", 0, "charge", True, NOW - 29_000, NOW - 28_000),
    ("w4", 0, "render", False, NOW - 15_000, NOW - 14_800),
    ("w1", 1, "notify", False, NOW - 41_000, NOW - 40_990),
]


async def write_rows(url: str, sharding: bool) -> None:
    key = ", shard_key" if sharding else ""
    conn = await asyncpg.connect(url)
    try:
        for wf, status, name, queue, version, executor, created, started, completed in WORKFLOWS:
            await conn.execute(
                f"""INSERT INTO dbos.workflow_status
                      (workflow_uuid, status, name, queue_name, application_version,
                       executor_id, created_at, updated_at, started_at_epoch_ms, completed_at,
                       application_name{key})
                    VALUES ($1, $2, $3, $4, $5, $6, $7, $7, $8, $9, 'metrics-app'
                            {", 'tenant-' || $1" if sharding else ""})""",
                wf, status, name, queue, version, executor, created, started, completed)
        for wf, function_id, name, failed, started, completed in STEPS:
            await conn.execute(
                f"""INSERT INTO dbos.operation_outputs
                      (workflow_uuid, function_id, function_name, output, error,
                       started_at_epoch_ms, completed_at_epoch_ms, application_name{key})
                    VALUES ($1, $2, $3, $4, $5, $6, $7, 'metrics-app'
                            {", 'tenant-' || $1" if sharding else ""})""",
                wf, function_id, name, None if failed else "1", "boom" if failed else None,
                started, completed)
    finally:
        await conn.close()


def run_ms(row: tuple[Any, ...]) -> int | None:
    _, _, _, _, _, _, created, started, completed = row
    return None if completed is None else completed - (started or created)


async def test_workflow_aggregates_match_the_rows(database_url: str, sharding: bool) -> None:
    await migrate(database_url, sharding=sharding)
    await write_rows(database_url, sharding)
    async with client_of(database_url, sharding) as client:
        hour = {"start_time": NOW - HOUR_MS, "end_time": NOW}
        by_name = await client.get_workflow_aggregates(group_by="name", **hour)
        assert [(a.name, a.count, a.status) for a in by_name] == [
            ("checkout", 3, None), ("report", 3, None)]
        checkout = [run_ms(r) for r in WORKFLOWS[:3]]
        assert checkout == [10_000, 1_000, 3_000]
        [c, r] = by_name
        assert c.mean_ms == pytest.approx(sum(checkout) / 3)
        for fraction, value in ((0.5, c.p50_ms), (0.95, c.p95_ms), (0.99, c.p99_ms)):
            assert value == pytest.approx(percentile_cont(checkout, fraction))
        # Only w4 of the report workflows has finished; it ran from its dequeue.
        assert (r.mean_ms, r.p50_ms, r.p99_ms) == (500, 500, 500)

        by_status = await client.get_workflow_aggregates(**hour)  # status and name
        assert [(a.status, a.name, a.count) for a in by_status] == [
            ("ENQUEUED", "report", 1), ("ERROR", "checkout", 1), ("PENDING", "report", 1),
            ("SUCCESS", "checkout", 2), ("SUCCESS", "report", 1)]
        unfinished = by_status[0]
        assert (unfinished.mean_ms, unfinished.p50_ms) == (None, None)

        grouped = await client.get_workflow_aggregates(
            group_by=["queue_name", "application_version", "executor_id"], **hour)
        assert [(a.queue_name, a.application_version, a.executor_id, a.count)
                for a in grouped] == [
            ("jobs", "v2", "exec-b", 2), ("jobs", "v2", None, 1),
            (None, "v1", "exec-a", 2), (None, "v2", "exec-b", 1)]

        # By completion time, over two hours: the old one too, the unfinished ones not.
        completed = await client.get_workflow_aggregates(
            group_by=(), time_column="completed", start_time=NOW - 2 * HOUR_MS, end_time=NOW)
        assert [a.count for a in completed] == [5]
        assert await client.get_workflow_aggregates(start_time=NOW, end_time=NOW + 1) == []

        steps = await client.get_step_aggregates(**hour)
        assert [(s.name, s.outcome, s.count, s.mean_ms) for s in steps] == [
            ("charge", "ERROR", 1, 1_000), ("charge", "SUCCESS", 2, 650),
            ("notify", "SUCCESS", 1, 10), ("render", "SUCCESS", 1, 200)]
        assert steps[1].p50_ms == 650 and steps[1].p95_ms == pytest.approx(300 + 700 * 0.95)

        activity = await client.get_workflow_activity(bucket_seconds=60, **hour)
        assert [(a.name, a.start_epoch_ms, a.finished, a.succeeded, a.failed)
                for a in activity] == [("checkout", NOW - 60_000, 3, 2, 1),
                                       ("report", NOW - 60_000, 1, 1, 0)]
        by_day = await client.get_workflow_activity(
            bucket_seconds=86_400, start_time=NOW - 3 * HOUR_MS, end_time=NOW)
        assert [(a.name, a.finished) for a in by_day] == [("checkout", 4), ("report", 1)]

        metrics = await client.get_metrics(NOW - HOUR_MS, NOW)
        assert {(m.metric_type, m.metric_name, m.value) for m in metrics} == {
            ("workflow_count", "checkout", 3), ("workflow_count", "report", 3),
            ("step_count", "charge", 3), ("step_count", "notify", 1),
            ("step_count", "render", 1)}


async def test_queue_metrics_count_the_backlog(database_url: str, sharding: bool) -> None:
    await migrate(database_url, sharding=sharding)
    await write_rows(database_url, sharding)
    async with client_of(database_url, sharding) as client:
        [jobs] = await client.get_queue_metrics()
    assert (jobs.queue_name, jobs.delayed, jobs.enqueued, jobs.pending) == ("jobs", 0, 1, 1)
    assert jobs.oldest_waiting_id == "w5"
    assert jobs.oldest_waiting_ms is not None and jobs.oldest_waiting_ms >= 0


async def test_queue_depth_history_works_back_from_now(database_url: str,
                                                       sharding: bool) -> None:
    await migrate(database_url, sharding=sharding)
    async with client_of(database_url, sharding) as client:
        for i in range(3):
            await client.enqueue("emails", "send_email", f"user-{i}",
                                 **({"shard_key": f"tenant-{i}"} if sharding else {}))
        history = await client.get_queue_depth_history(minutes=5)
    assert [h.queue_name for h in history] == ["emails"] * 5
    minutes = [h.minute_epoch_ms for h in history]
    assert minutes == sorted(minutes) and minutes[-1] - minutes[0] == 4 * 60_000
    # Before the enqueues (at the latest the minute before), none waited; now three do:
    # counted now, worked back before (no executor sampled those minutes).
    assert (history[0].waiting, history[-1].waiting) == (0, 3)
    assert [h.measured for h in history] == [False] * 4 + [True]


async def test_workflows_run_by_an_executor_are_counted(database_url: str) -> None:
    dbos = new_dbos(database_url)

    @dbos.step()
    async def double(x: int) -> int:
        return 2 * x

    @dbos.workflow()
    async def doubling(x: int) -> int:
        return await double(x)

    async with dbos:
        for i in range(3):
            assert await doubling(i) == 2 * i
        [workflows] = await dbos.get_workflow_aggregates(group_by=["status", "name"])
        [steps] = await dbos.get_step_aggregates()
    assert (workflows.status, workflows.name, workflows.count) == (
        "SUCCESS", doubling.__qualname__, 3)
    assert workflows.mean_ms is not None and workflows.mean_ms >= 0
    assert (steps.name, steps.outcome, steps.count) == (double.__qualname__, "SUCCESS", 3)


def dbos_async_cli(*args: str) -> str:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("DBOS_")}
    done = subprocess.run([str(Path(sys.executable).with_name("dbos-async")), *args],
                          capture_output=True, text=True, timeout=60, env=clean, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


async def test_the_cli_prints_the_aggregates(database_url: str, sharding: bool) -> None:
    await migrate(database_url, sharding=sharding)
    await write_rows(database_url, sharding)
    target = ["--url", database_url, "--application-name", "metrics-app",
              *(["--sharding"] if sharding else [])]
    hour = ["--start-time", str(NOW - HOUR_MS), "--end-time", str(NOW)]
    workflows = json.loads(dbos_async_cli("metrics", "workflows", "--group-by", "name",
                                          *hour, "--json", *target))
    assert [(w["name"], w["count"]) for w in workflows] == [("checkout", 3), ("report", 3)]
    table = dbos_async_cli("metrics", "steps", *hour, *target).splitlines()
    assert table[0].split() == ["NAME", "OUTCOME", "COUNT", "MEAN", "MS", "P50", "MS", "P95",
                                "MS", "P99", "MS"]
    assert table[1].split()[:4] == ["charge", "ERROR", "1", "1000.0"]
    [jobs] = json.loads(dbos_async_cli("metrics", "queues", "--json", *target))
    assert (jobs["queue_name"], jobs["enqueued"], jobs["oldest_waiting_id"]) == (
        "jobs", 1, "w5")


async def test_bad_arguments_are_refused(database_url: str) -> None:
    await migrate(database_url)
    async with client_of(database_url, False) as client:
        with pytest.raises(InvalidArgumentError, match=r"group_by.*'tenant' is not one of"):
            await client.get_workflow_aggregates(group_by=["name", "tenant"])
        with pytest.raises(InvalidArgumentError, match=r"time_column.*'updated'"):
            await client.get_workflow_aggregates(time_column="updated")
        with pytest.raises(InvalidArgumentError, match=r"start_time.*not before the end"):
            await client.get_step_aggregates(start_time=NOW, end_time=NOW)
        with pytest.raises(InvalidArgumentError, match=r"bucket_seconds.*positive"):
            await client.get_workflow_activity(bucket_seconds=0)
        with pytest.raises(InvalidArgumentError, match=r"minutes.*from 1 to 1440"):
            await client.get_queue_depth_history(minutes=1441)


FILL_WORKFLOWS = """
INSERT INTO dbos.workflow_status (workflow_uuid, status, name, queue_name, created_at,
                                  updated_at, completed_at, application_name{key})
SELECT 'fill-' || i, CASE WHEN i % 50 = 0 THEN 'ENQUEUED' ELSE 'SUCCESS' END,
       'work-' || (i % 20), CASE WHEN i % 2 = 0 THEN 'jobs' END,
       $2::bigint - i::bigint * 30000, $2::bigint - i::bigint * 30000,
       CASE WHEN i % 50 <> 0 THEN $2::bigint - i::bigint * 30000 + 500 END, 'metrics-app'{key_value}
FROM generate_series(1, $1::int) AS i
"""
FILL_STEPS = """
INSERT INTO dbos.operation_outputs (workflow_uuid, function_id, function_name, output,
                                    started_at_epoch_ms, completed_at_epoch_ms,
                                    application_name{key})
SELECT 'fill-' || i, 0, 'step-' || (i % 10), '1', $2::bigint - i::bigint * 30000,
       $2::bigint - i::bigint * 30000 + 100, 'metrics-app'{key_value}
FROM generate_series(1, $1::int) AS i
"""

# Ten queues' samples of two applications, minute after minute: about 8 days.
FILL_DEPTH_SAMPLES = """
INSERT INTO dbos.dbos_async_depth_samples (application_name, minute_epoch_ms, queue_name,
                                           waiting, sampled_at_epoch_ms)
SELECT CASE WHEN i % 2 = 0 THEN 'metrics-app' ELSE 'other-app' END,
       ($2::bigint / 60000 - i / 10) * 60000, 'queue-' || (i % 10), i % 50, $2::bigint
FROM generate_series(1, $1::int) AS i
"""


async def test_each_read_is_served_by_an_index(database_url: str, sharding: bool) -> None:
    await migrate(database_url, sharding=sharding)
    rows = 120_000  # 30 s apart: about 41 days, of which a read takes the last hour
    key, key_value = ((", shard_key", ", 'tenant-' || (i % 100)") if sharding else ("", ""))
    async with client_of(database_url, sharding) as client:
        sysdb = client._peer().system_database
        conn = await asyncpg.connect(database_url)
        try:
            for fill in (FILL_WORKFLOWS, FILL_STEPS):
                await conn.execute(fill.format(key=key, key_value=key_value), rows, NOW)
            await conn.execute("VACUUM ANALYZE dbos.workflow_status")
            await conn.execute("VACUUM ANALYZE dbos.operation_outputs")
            if not sharding:  # the sharded schema has no depth samples
                await conn.execute(FILL_DEPTH_SAMPLES, rows, NOW)
                await conn.execute("VACUUM ANALYZE dbos.dbos_async_depth_samples")
            start, end = NOW - HOUR_MS, NOW
            reads = [
                ("workflow_status_created_at_index", sysdb.sql.workflow_aggregates(
                    ("status", "name", "queue_name"), "created", start, end)),
                ("idx_workflow_status_completed_at", sysdb.sql.workflow_aggregates(
                    ("name",), "completed", start, end)),
                ("idx_operation_outputs_completed_at_function_name_v2",
                 sysdb.sql.step_aggregates(start, end)),
                ("idx_workflow_status_completed_at",
                 sysdb.sql.workflow_activity(start, end, 60_000)),
                ("workflow_status_created_at_index", sysdb.sql.queue_arrivals(start)),
            ]
            if not sharding:
                reads.append(("dbos_async_depth_samples_pkey", sysdb.sql.depth_samples(start)))
                # The executors' sample (a write, counting a queue's waiting workflows):
                # each status through its own partial index; dropping, as in a steady
                # state, the oldest minute's samples (through the key).
                oldest_minute = (NOW // 60_000 - rows // 10) * 60_000
                sample = sysdb.sql.sample_depths(["jobs"], end, end, oldest_minute + 60_000)
                reads += [("idx_workflow_status_in_flight_v2", sample),
                          ("idx_workflow_status_delayed", sample)]
            plans = [(index, "\n".join(row[0] for row in await conn.fetch(
                f"EXPLAIN {query.sql}", *query.params))) for index, query in reads]
        finally:
            await conn.close()
        # The reads answer as the plans were checked for: the last hour's 120 workflows.
        [total] = await client.get_workflow_aggregates(group_by=(), start_time=start,
                                                       end_time=end)
        assert total.count == 120
    for index, plan in plans:
        assert index in plan, plan
        assert "Seq Scan" not in plan, plan
