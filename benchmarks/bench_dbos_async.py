"""dbos_async: N three-step workflows, with every statement counted.

Two ways to start them: ``concurrency`` workers that each start a workflow and await its
result before the next (at most C in flight), or ``burst``: all N started with
``start_workflow`` at once, then every result gathered.

Two independent counts of what the measured run sends to PostgreSQL:

- client side: a query logger (``Connection.add_query_logger``) on every connection of the
  executor's pool, classifying each statement (workflow start, step checkpoint, workflow
  finish, asyncpg's pool reset, anything else);
- server side: transactions ended (``xact_commit + xact_rollback`` of ``pg_stat_database``)
  in the benchmark database, and ``pg_stat_user_tables.n_tup_ins`` of ``workflow_status``
  and ``operation_outputs``, read after every pool connection has published its statistics
  (``common.read_pool_transactions``), the readings' own transactions taken off.

``python benchmarks/bench_dbos_async.py --url URL ...`` runs one measured round in a child
process (on the event loop ``dbos_async.run`` picks, or the one ``--loop`` names) and prints
``BENCH_RESULT {json}``.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import json
import pstats
import re
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
from common import (
    MARKER,
    drive,
    read_pool_transactions,
    transactions_between,
)

import dbos_async
from dbos_async import DBOS, SetShardKey

TUPLES_QUERY = """
SELECT (SELECT coalesce(sum(n_tup_ins), 0) FROM pg_stat_user_tables
         WHERE relname = 'workflow_status') AS status_inserts,
       (SELECT coalesce(sum(n_tup_ins), 0) FROM pg_stat_user_tables
         WHERE relname = 'operation_outputs') AS step_inserts"""

SCRIPT = Path(__file__).resolve()

_START = re.compile(r"INSERT\s+INTO\s+\S*workflow_status\b", re.IGNORECASE)
_STEP = re.compile(r"INSERT\s+INTO\s+\S*operation_outputs\b", re.IGNORECASE)
_FINISH = re.compile(r"UPDATE\s+\S*workflow_status\b", re.IGNORECASE)
_RESET = re.compile(r"^\s*SELECT\s+pg_advisory_unlock_all\(\)", re.IGNORECASE)


def classify(query: str) -> str:
    if _RESET.search(query):
        return "pool reset"
    if _START.search(query):
        return "workflow start"
    if _STEP.search(query):
        return "step checkpoint"
    if _FINISH.search(query):
        return "workflow finish"
    return "other: " + " ".join(query.split())[:70]


@dataclass(eq=False)  # hashable by identity: asyncpg keeps loggers in a set
class QueryCounter:
    """A query logger: counts statements by text, in the phase they completed in.

    Kept cheap on the hot path (one dict increment); statements are classified afterwards.
    """

    phase: str = "idle"
    texts: dict[str, Counter[str]] = field(default_factory=dict)

    def __call__(self, record: Any) -> None:
        phase = self.texts.get(self.phase)
        if phase is None:
            phase = self.texts[self.phase] = Counter()
        phase[record.query] += 1

    def by_kind(self, phase: str) -> Counter[str]:
        kinds: Counter[str] = Counter()
        for text, count in self.texts.get(phase, Counter()).items():
            kinds[classify(text)] += count
        return kinds

    def total(self, phase: str) -> int:
        return sum(self.texts.get(phase, Counter()).values())


async def settle_loggers() -> None:
    """Let query-logger callbacks (scheduled with call_soon) run."""
    for _ in range(3):
        await asyncio.sleep(0)


async def all_connections(pool: asyncpg.Pool) -> list[Any]:
    """Check out every connection an idle pool can have, opening the ones it has not opened
    yet: a query logger added to them all then sees every statement, even when the pool
    grows during the measured run."""
    return [await pool.acquire() for _ in range(pool.get_max_size())]


def workload(dbos: DBOS) -> Any:
    """The measured workflow: three trivial steps, each checkpointed."""
    @dbos.step()
    async def add_one(x: int) -> int:
        return x + 1

    @dbos.step()
    async def double(x: int) -> int:
        return x * 2

    @dbos.step()
    async def subtract_two(x: int) -> int:
        return x - 2

    @dbos.workflow()
    async def three_steps(x: int) -> int:
        return await subtract_two(await double(await add_one(x)))

    return three_steps


async def run(url: str, *, workflows: int, concurrency: int, pool_size: int, warmup: int,
              profile: bool = False, shard_keys: int = 0, burst: bool = False,
              ) -> dict[str, Any]:
    """With ``shard_keys``, the sharded system schema, workflows spread over that many
    keys; with ``burst``, all ``workflows`` started at once (``concurrency`` unused)."""
    dbos = DBOS(system_database_url=url, pool_size=pool_size, name="bench_dbos_async",
                application_version="bench", sharding=shard_keys > 0)
    three_steps = workload(dbos)
    counter = QueryCounter()
    profiler = cProfile.Profile() if profile else None

    async def start(i: int) -> Any:
        if shard_keys:
            with SetShardKey(f"tenant-{i % shard_keys}"):
                return await dbos.start_workflow(three_steps, i)
        return await dbos.start_workflow(three_steps, i)

    async def check(i: int, handle: Any) -> None:
        result = await handle.get_result()
        if result != (i + 1) * 2 - 2:
            raise RuntimeError(f"workflow {i} returned {result!r}")

    async def one(i: int) -> None:
        await check(i, await start(i))

    async def all_at_once(count: int) -> float:
        began = time.perf_counter()
        handles = await asyncio.gather(*(start(i) for i in range(count)))
        await asyncio.gather(*(check(i, h) for i, h in enumerate(handles)))
        return time.perf_counter() - began

    async def measured(count: int) -> float:
        if burst:
            return await all_at_once(count)
        return await drive(count, concurrency, one)

    async with dbos:
        await measured(warmup)
        await _collect_metrics()  # the warmup's, so that the one after the run holds only its own
        pool = dbos._system_database.pool
        size_before = pool.get_size()

        before = await read_pool_transactions(pool)
        tuples_before = await pool.fetchrow(TUPLES_QUERY)  # one more transaction, below
        conns = await all_connections(pool)
        for conn in conns:
            conn.add_query_logger(counter)
        for conn in conns:
            await pool.release(conn)
        await settle_loggers()

        counter.phase = "run"
        if profiler is not None:
            profiler.enable()
        cpu_before = time.process_time()
        elapsed = await measured(workflows)
        cpu = time.process_time() - cpu_before
        if profiler is not None:
            profiler.disable()
        values_before = _histogram_values
        collect_cpu = await _collect_metrics()
        await settle_loggers()

        counter.phase = "post"
        size_after = pool.get_size()
        conns = await all_connections(pool)
        for conn in conns:
            conn.remove_query_logger(counter)
            await pool.release(conn)
        after = await read_pool_transactions(pool)
        tuples_after = await pool.fetchrow(TUPLES_QUERY)
        loop = type(asyncio.get_running_loop())

    run_counts = counter.by_kind("run")
    transactions = transactions_between(before, after) - 1  # tuples_before's

    result: dict[str, Any] = {
        "workflows": workflows,
        "warmup": warmup,
        "steps": workflows * 3,
        "burst": burst,
        "concurrency": workflows if burst else concurrency,
        "event_loop": f"{loop.__module__}.{loop.__qualname__}",
        "seconds": elapsed,
        "cpu_seconds": cpu,
        "workflows_per_s": workflows / elapsed,
        "steps_per_s": workflows * 3 / elapsed,
        "pool_size": pool_size,
        "pool_connections": [size_before, size_after],
        "statements": statement_figures(run_counts, workflows, workflows * 3),
        "server": {
            "transactions": transactions,
            "transactions_per_workflow": transactions / workflows,
            "workflow_status_inserts":
                int(tuples_after["status_inserts"] - tuples_before["status_inserts"]),
            "operation_outputs_inserts":
                int(tuples_after["step_inserts"] - tuples_before["step_inserts"]),
        },
    }
    if collect_cpu is not None:
        result["collect_cpu_seconds"] = collect_cpu
        result["collect_values"] = _histogram_values - values_before
    if profiler is not None:
        result["profile"] = _profile_report(profiler)
    return result


_reader: Any = None
"""The in-memory metric reader of a child run with ``--metrics otel``."""

_endpoint: Any = None
"""The Prometheus endpoint of a child run with ``--metrics prometheus``."""


_histogram_values = 0
"""How many values the histograms held at the latest collection (cumulative)."""


async def _collect_metrics() -> float | None:
    """The CPU time of one collection of the metrics the measured run made (what a
    periodic reader or a scrape does once per interval: the SDK's collection, or the
    endpoint's rendering), or None while metrics are off. Notes in
    :data:`_histogram_values` how many values the histograms hold by then."""
    global _histogram_values
    if _endpoint is not None:
        from prometheus_client.parser import text_string_to_metric_families

        began = time.process_time()
        text = await _endpoint.render()
        cpu = time.process_time() - began
        _histogram_values = int(sum(
            sample.value for family in text_string_to_metric_families(text.decode())
            if family.type == "histogram" for sample in family.samples
            if sample.name.endswith("_count")))
        return cpu
    if _reader is None:
        return None
    from opentelemetry.sdk.metrics.export import Histogram

    began = time.process_time()
    data = _reader.get_metrics_data()
    cpu = time.process_time() - began
    _histogram_values = sum(
        point.count for resource in data.resource_metrics for scope in resource.scope_metrics
        for metric in scope.metrics for point in metric.data.data_points
        if isinstance(metric.data, Histogram))
    return cpu


async def run_subprocess(url: str, *, workflows: int, pool_size: int, warmup: int,
                         loop: str, burst: bool = True, concurrency: int = 100,
                         metrics: str | None = None,
                         time_limit: float = 300.0) -> dict[str, Any]:
    """One measured round in a child process on the event loop ``loop`` names; with
    ``metrics`` (``otel`` or ``prometheus``), the executor's metrics on and exported that
    way."""
    from bench_dbos import run_child

    return await run_child(SCRIPT, [
        "--url", url, "--workflows", str(workflows), "--pool-size", str(pool_size),
        "--warmup", str(warmup), "--loop", loop, "--concurrency", str(concurrency),
        *(["--burst"] if burst else []), *(["--metrics", metrics] if metrics else []),
    ], time_limit)


def statement_figures(kinds: Counter[str], workflows: int, steps: int) -> dict[str, Any]:
    """Statements and round trips per workflow and per step, from counts by kind.

    Per step: (all statements - workflow starts - workflow finishes) / steps. asyncpg's pool
    reset, when the pool sends one, follows every pool operation, so for round trips each
    statement is charged its share of resets.
    """
    resets = kinds["pool reset"]
    total = sum(kinds.values())
    statements = total - resets  # what dbos_async itself sends
    per_step = (statements - kinds["workflow start"] - kinds["workflow finish"]) / steps
    reset_share = resets / statements if statements else 0.0
    return {
        "by_kind": dict(kinds.most_common()),
        "total_with_pool_reset": total,
        "total_without_pool_reset": statements,
        "pool_resets_per_statement": reset_share,
        # Without the resets: the SQL dbos_async issues.
        "per_workflow": statements / workflows,
        "per_step": per_step,
        # With them: round trips on the wire.
        "round_trips_per_workflow": total / workflows,
        "round_trips_per_step": per_step * (1 + reset_share),
    }


def _profile_report(profiler: cProfile.Profile, limit: int = 25) -> dict[str, str]:
    report = {}
    for title, sort, restriction in (
        ("all, by own time", "tottime", limit),
        ("dbos_async code, by own time", "tottime", "dbos_async"),
        ("dbos_async code, by cumulative time", "cumulative", "dbos_async"),
    ):
        out = io.StringIO()
        stats = pstats.Stats(profiler, stream=out).sort_stats(sort)
        if isinstance(restriction, str):
            stats.print_stats(restriction, limit)
        else:
            stats.print_stats(restriction)
        report[title] = out.getvalue()
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", required=True)
    parser.add_argument("--workflows", type=int, required=True)
    parser.add_argument("--concurrency", type=int, default=100)
    parser.add_argument("--pool-size", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--burst", action="store_true")
    parser.add_argument("--loop", choices=("default", "asyncio", "uvloop"), default="default",
                        help="default: what dbos_async.run picks (uvloop when installed, "
                             "unless DBOS_UVLOOP is false)")
    parser.add_argument("--metrics", choices=("otel", "prometheus"),
                        help="dbos_async's metrics on: otel sets a meter provider (an SDK "
                             "one, with an in-memory reader); prometheus creates a "
                             "Prometheus endpoint (no OpenTelemetry SDK)")
    args = parser.parse_args()
    global _reader, _endpoint
    if args.metrics == "otel":
        from opentelemetry import metrics
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader

        _reader = InMemoryMetricReader()
        metrics.set_meter_provider(MeterProvider(metric_readers=[_reader]))
    elif args.metrics == "prometheus":
        from dbos_async.prometheus import PrometheusMetrics

        _endpoint = PrometheusMetrics()
    choice = {"default": None, "asyncio": False, "uvloop": True}[args.loop]
    result = dbos_async.run(run(args.url, workflows=args.workflows,
                                concurrency=args.concurrency, pool_size=args.pool_size,
                                warmup=args.warmup, burst=args.burst), uvloop=choice)
    print(MARKER + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
